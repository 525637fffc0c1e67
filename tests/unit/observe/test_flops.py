"""FLOP counting: exact for known layers, the GPT formula, and failure that never stops training."""

from __future__ import annotations

import json
import logging
import time
import types

import pytest
import torch
from torch import nn

from gputrain import Trainer
from gputrain.data.tensors import TensorData
from gputrain.observe.flops import GptDims, StepFlopCounter, gpt_dims, gpt_flops_per_token

QUIET = {"train.device": "cpu", "log.progress": "none", "log.tensorboard": False, "checkpoint.enabled": False}


def _step_flops(batch: int, macs: list[int]) -> int:
    """Matmul FLOPs of one training step, counted by hand from each layer's multiply-adds per sample.

    Forward: 2·b·MACs per layer. Backward: the weight gradient costs the same again for every layer,
    and the input gradient too for every layer but the first (the data needs no gradient). Biases,
    activations, the loss and the optimizer are element-wise and not counted.
    """
    forward = 2 * batch * sum(macs)
    return 3 * forward - 2 * batch * macs[0]


def _mlp_step_flops(batch: int) -> int:
    return _step_flops(batch, [16 * 32, 32 * 4])  # Linear 16->32, Linear 32->4: in·out multiply-adds


def _conv_macs(c_in: int, c_out: int, k: int, h_out: int, w_out: int) -> int:
    return c_out * h_out * w_out * c_in * k * k  # one k·k·c_in dot product per output element


def test_gpt_formula_on_gpt2_small_numbers() -> None:
    # GPT-2 124M at T=1024: 85,054,464 block params plus the tied 50257x768 output layer (the
    # position table is left out): 0.855 GFLOP per token, nanoGPT's figure for the same model.
    n = 85_054_464 + 50_257 * 768
    assert gpt_flops_per_token(n, n_layer=12, n_head=12, head_dim=64, seq_len=1024) == 855_157_248


class TinyGpt(nn.Module):
    """A decoder with explicit attention matmuls and the attributes gpt_dims reads."""

    def __init__(self, vocab: int = 32, d_model: int = 16, n_head: int = 2, n_layer: int = 2, seq_len: int = 8) -> None:
        super().__init__()
        self.n_layer, self.n_head, self.d_model, self.seq_len = n_layer, n_head, d_model, seq_len
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.qkv = nn.ModuleList(nn.Linear(d_model, 3 * d_model, bias=False) for _ in range(n_layer))
        self.proj = nn.ModuleList(nn.Linear(d_model, d_model, bias=False) for _ in range(n_layer))
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied: counts as a matmul, not an embedding

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        b, t = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(t))
        h, q_dim = self.n_head, self.d_model // self.n_head
        for qkv, proj in zip(self.qkv, self.proj):
            q, k, v = (y.view(b, t, h, q_dim).transpose(1, 2) for y in qkv(x).split(self.d_model, dim=-1))
            att = (q @ k.transpose(-2, -1)).softmax(-1)
            x = x + proj((att @ v).transpose(1, 2).reshape(b, t, self.d_model))
        return self.head(x)


def test_gpt_dims_reads_attributes_and_excludes_untied_embeddings() -> None:
    model = TinyGpt()
    dims = gpt_dims(model)
    assert dims is not None
    total = sum(p.numel() for p in model.parameters())
    assert dims.n_params == total - 8 * 16  # only the position table is left out
    assert (dims.n_layer, dims.n_head, dims.head_dim, dims.seq_len) == (2, 2, 8, 8)
    assert gpt_dims(nn.Linear(3, 3)) is None


def test_measured_count_matches_gpt_formula() -> None:
    model = TinyGpt()
    idx = torch.randint(0, 32, (4, 8))
    counter = StepFlopCounter()
    with counter.counting():
        model(idx).sum().backward()
    dims = gpt_dims(model)
    assert dims is not None
    formula = gpt_flops_per_token(dims.n_params, dims.n_layer, dims.n_head, dims.head_dim, dims.seq_len) * 4 * 8
    # No biases or norms and the embeddings train (so every input gradient is needed): for this
    # model the analytic formula and the counted ops must agree exactly.
    assert counter.total == formula


def _fit(tmp_path, model: nn.Module, sample_shape: tuple[int, ...] = (16,),  # type: ignore[no-untyped-def]
         **config) -> dict:
    torch.manual_seed(0)
    data = TensorData(torch.randn(64, *sample_shape), torch.randint(0, 4, (64,)))
    cfg = {**QUIET, "train.epochs": 1, "train.batch_size": 16, "log.every_steps": 2, **config}
    return Trainer(model, data, config=cfg, run_dir=tmp_path).fit()


def test_trainer_reports_counted_flops_and_speed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    started = time.perf_counter()
    summary = _fit(tmp_path, model, **{"train.grad_accum": 2})
    outside = time.perf_counter() - started
    train = summary["train"]
    assert train["flops_per_step"] == 2 * _mlp_step_flops(8)  # two micro-batches of 8
    # FLOP/s against the hand count and a clock the trainer does not own: the 4 steps ran inside fit(),
    # so the rate is at least the hand-counted FLOPs over fit()'s whole time (a unit slip fails this).
    assert train["achieved_flops"] >= 4 * 2 * _mlp_step_flops(8) / outside
    assert train["mfu"] is None and train["mfu_peak_source"] is None  # CPU, no bench result
    assert train["host_peak_rss_bytes"] > 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "split" not in r]
    assert [r["step"] for r in steps] == [2, 4]
    assert all(r["step_time_s"] > 0 and r["achieved_flops"] > 0 and r["peak_memory_bytes"] > 0 for r in steps)


def test_trainer_counts_conv_flops_by_the_hand_formula(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # 1x8x8 -> conv 3x3 (pad 1) to 4x8x8 -> conv 3x3 stride 2 (pad 1) to 8x4x4 -> linear 128 -> 4
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 8, 3, stride=2, padding=1),
                          nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 4))
    summary = _fit(tmp_path, model, sample_shape=(1, 8, 8))
    macs = [_conv_macs(1, 4, 3, 8, 8), _conv_macs(4, 8, 3, 4, 4), 8 * 4 * 4 * 4]
    assert summary["global_step"] == 4
    assert summary["train"]["flops_per_step"] == _step_flops(16, macs) == 638_976


def test_counting_failure_leaves_flops_null_and_trains(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import torch.utils.flop_counter as fc

    class Broken:
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            raise RuntimeError("no counter here")

    monkeypatch.setattr(fc, "FlopCounterMode", Broken)
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("gputrain").addHandler(handler)  # the package logger does not propagate
    try:
        summary = _fit(tmp_path, nn.Linear(16, 4))
    finally:
        logging.getLogger("gputrain").removeHandler(handler)
    assert summary["status"] == "completed" and summary["global_step"] == 4
    assert summary["train"]["flops_per_step"] is None and summary["train"]["achieved_flops"] is None
    assert seen.count("FLOPs not counted (RuntimeError: no counter here); MFU stays empty") == 1


class _TwoLayers(nn.Module):
    """A forward of the user's own (dynamo compiles it; torch's nn.Sequential it would not)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def test_a_compiled_model_counted_on_its_first_step_compiles_on_the_next() -> None:
    """Dynamo would have marked a forward first run under the counter's dispatch mode to run eagerly
    for good: train.compile=true then trained eagerly all run long."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model, x = _TwoLayers(), torch.randn(8, 16)
    model.compile(backend="eager")  # dynamo's tracing alone: no inductor build in a unit test
    counter = StepFlopCounter()
    with counter.counting():
        model(x).sum().backward()
    assert counter.total == _mlp_step_flops(8)
    assert counters["frames"]["ok"] == 0  # counted eagerly
    model(x).sum().backward()
    assert counters["frames"]["ok"] == 1  # and compiled at the next step
    torch._dynamo.reset()


def test_cpu_attention_kernel_is_counted() -> None:
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    q = torch.randn(2, 4, 128, 32, requires_grad=True)
    counter = StepFlopCounter()
    with counter.counting():
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    shape = (2, 4, 128, 32)
    # the same count torch gives its GPU attention kernels (forward, and backward with recompute)
    assert counter.total == sdpa_flop_count(shape, shape, shape) + sdpa_backward_flop_count(shape, shape, shape, shape)
    assert counter.total > 0


# ---------------------------------------------------------------- grouped convolutions (issue: MobileNet's MFU)
def _conv_forward_flops(batch: int, c_in: int, c_out: int, groups: int, k: int, h_out: int, w_out: int) -> int:
    """A convolution's forward FLOPs by hand: 2 per multiply-add, one k·k·(c_in/groups) dot product per output."""
    return 2 * batch * c_out * h_out * w_out * (c_in // groups) * k * k


@pytest.mark.parametrize("input_grad", [False, True])
def test_depthwise_convolution_backward_costs_what_its_forward_does(input_grad: bool) -> None:
    # the case: torch's own counter gives 613 MFLOP for this step, 32x the right 19
    conv = nn.Conv2d(64, 64, 3, padding=1, groups=64, bias=False)
    x = torch.randn(8, 64, 32, 32, requires_grad=input_grad)
    counter = StepFlopCounter()
    with counter.counting():
        conv(x).sum().backward()
    forward = _conv_forward_flops(8, 64, 64, 64, 3, 32, 32)
    assert forward == 9_437_184
    # forward, the weight gradient, and the input gradient where the input needs one
    assert counter.total == (3 if input_grad else 2) * forward


@pytest.mark.parametrize("layer, out_hw", [
    (nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=4), 4),  # grouped, strided
    (nn.ConvTranspose2d(8, 16, 3, stride=2, padding=1, output_padding=1, groups=4), 16),  # grouped transposed
])
def test_grouped_convolution_gradients_each_cost_the_forward(layer: nn.Module, out_hw: int) -> None:
    x = torch.randn(2, 8, 8, 8, requires_grad=True)
    counter = StepFlopCounter()
    with counter.counting():
        out = layer(x)
        out.sum().backward()
    assert out.shape[-1] == out_hw
    if isinstance(layer, nn.ConvTranspose2d):  # each input pixel is spread over k·k outputs of c_out/groups channels
        forward = 2 * 2 * 8 * 8 * 8 * (16 // 4) * 3 * 3
    else:
        forward = _conv_forward_flops(2, 8, 16, 4, 3, out_hw, out_hw)
    assert counter.total == 3 * forward


class DepthwiseSeparable(nn.Sequential):
    """A MobileNet in miniature: a stem, then two depthwise 3x3 + pointwise 1x1 pairs, a pooled head."""

    def __init__(self) -> None:
        super().__init__(
            nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 16, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=16, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 1, bias=False), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 4),
        )


def test_depthwise_separable_model_matches_the_analytic_count(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # multiply-adds per sample, layer by layer: c_out · h·w · (c_in / groups) · k·k
    macs = [8 * 64 * 1 * 9, 8 * 64 * 1 * 9, 16 * 64 * 8, 16 * 16 * 1 * 9, 32 * 16 * 16, 32 * 4]
    analytic = _step_flops(16, macs)
    summary = _fit(tmp_path, DepthwiseSeparable(), sample_shape=(1, 8, 8))
    counted = summary["train"]["flops_per_step"]
    assert abs(counted - analytic) <= 0.10 * analytic  # the bar
    assert counted == analytic  # and in fact exact: BatchNorm, ReLU and pooling are not matmuls

    from torch.utils.flop_counter import FlopCounterMode

    uncorrected = FlopCounterMode(display=False)
    with uncorrected:
        DepthwiseSeparable()(torch.randn(16, 1, 8, 8)).sum().backward()
    assert uncorrected.get_total_flops() > 1.5 * analytic  # the model does show torch's overcount


def test_dense_convolutions_keep_torchs_count() -> None:
    from torch.utils.flop_counter import FlopCounterMode

    conv = nn.Conv2d(4, 8, 3, padding=1)
    x = torch.randn(2, 4, 8, 8, requires_grad=True)
    torchs = FlopCounterMode(display=False)
    with torchs:
        conv(x).sum().backward()
    ours = StepFlopCounter()
    with ours.counting():
        conv(x).sum().backward()
    assert ours.total == torchs.get_total_flops() == 3 * _conv_forward_flops(2, 4, 8, 1, 3, 8, 8)


# ---------------------------------------------------------------- the GPT formula on other libraries' configs
def test_gpt_dims_reads_nanogpt_and_llama_style_names() -> None:
    class Named(nn.Module):
        def __init__(self, **sizes: int) -> None:
            super().__init__()
            self.config = types.SimpleNamespace(**sizes)
            self.proj = nn.Linear(4, 4, bias=False)

    nanogpt = gpt_dims(Named(n_layer=3, n_head=2, n_embd=8, block_size=16))
    llama = gpt_dims(Named(num_hidden_layers=3, num_attention_heads=2, hidden_size=8, max_position_embeddings=16))
    assert nanogpt == llama == GptDims(n_params=16, n_layer=3, n_head=2, head_dim=4, seq_len=16)
    # a head width of its own (Gemma-style) wins over hidden_size / heads; the data's seq_len over the context
    stated = gpt_dims(Named(num_hidden_layers=3, num_attention_heads=2, hidden_size=8, head_dim=16,
                            max_position_embeddings=16), seq_len=12)
    assert stated is not None and (stated.head_dim, stated.seq_len) == (16, 12)
    assert gpt_dims(Named(num_hidden_layers=3, hidden_size=8, max_position_embeddings=16)) is None  # no heads


def _tiny_gpt2():  # type: ignore[no-untyped-def]
    transformers = pytest.importorskip("transformers", reason="transformers is not installed: pip install -e '.[test]'")
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=64,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)  # built locally: nothing is downloaded


def test_gpt_dims_of_hugging_face_gpt2() -> None:
    model = _tiny_gpt2()
    dims = gpt_dims(model)
    total = sum(p.numel() for p in model.parameters())
    # n_embd/n_positions on model.config; the position table is left out, the tied token table counts
    assert dims == GptDims(n_params=total - 64 * 32, n_layer=2, n_head=2, head_dim=16, seq_len=64)


def test_hugging_face_gpt2_count_agrees_with_the_formula() -> None:
    model = _tiny_gpt2()
    counter = StepFlopCounter()
    with counter.counting():
        model(input_ids=torch.randint(0, 100, (4, 16))).logits.sum().backward()
    dims = gpt_dims(model, seq_len=16)
    assert dims is not None and counter.total is not None
    formula = gpt_flops_per_token(dims.n_params, dims.n_layer, dims.n_head, dims.head_dim, dims.seq_len) * 4 * 16
    # the formula counts the embedding's input gradient and 6N for the layer norms' and biases' few
    # parameters, which the counter does not: within 5%
    assert abs(counter.total - formula) <= 0.05 * formula


class _TokenRecords(torch.utils.data.Dataset):
    """Dict samples of 12 tokens with their labels: what a Hugging Face collator gives a causal LM."""

    def __init__(self, ids: torch.Tensor) -> None:
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def test_the_gpt_formula_counts_the_datas_tokens_and_only_for_language_models(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A context of 1024 positions trained on 12-token samples: the formula is the tokens trained on,
    not the context (which read 200-500 times the counted FLOPs); a classifier has no formula."""
    transformers = pytest.importorskip("transformers")
    sizes = {"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 50, "n_positions": 1024}
    ids = torch.randint(0, 50, (64, 12), generator=torch.Generator().manual_seed(0))
    config = {**QUIET, "train.epochs": 1, "train.batch_size": 8}
    runs = {
        "pairs": (transformers.GPT2LMHeadModel, TensorData(ids[:, :-1], ids[:, 1:])),
        "dicts": (transformers.GPT2LMHeadModel, _TokenRecords(ids)),
        "classifier": (transformers.GPT2ForSequenceClassification, TensorData(ids.clamp(min=1), torch.zeros(64).long())),
    }
    for name, (cls, data) in runs.items():
        model = cls(transformers.GPT2Config(**sizes, num_labels=3, pad_token_id=0))
        train = Trainer(model, data, config=config, run_dir=tmp_path / name).fit()["train"]
        counted, formula = train["flops_per_step"], train["flops_per_step_formula"]
        if name == "classifier":
            assert formula is None and train["tokens_per_s"] is None
            continue
        # the formula's 6N counts the layer norms' and biases' few parameters, which the counter does not
        assert abs(formula - counted) <= 0.05 * counted, (name, formula, counted)
        tokens = 11 if name == "pairs" else 12
        assert train["tokens_per_s"] == pytest.approx(tokens * train["samples_per_s"])
