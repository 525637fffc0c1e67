"""FLOP counting: exact for known layers, the GPT formula, and failure that never stops training."""

from __future__ import annotations

import json
import logging
import time

import torch
from torch import nn

from gputrain import Trainer
from gputrain.data.tensors import TensorData
from gputrain.observe.flops import StepFlopCounter, gpt_dims, gpt_flops_per_token

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
