"""A language model's loss over labels with -100 (prompt tokens, padding) is the mean over the valid
tokens of the whole global batch (train/token_loss.py): k accumulation steps train exactly as one
step of k× the batch however unevenly the -100s fall, the logged loss is that mean, and evaluation
reports the mean over the split's valid tokens whatever its batches."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from gputrain import Trainer
from gputrain.config import load_config
from gputrain.config.schema import ModelConfig
from gputrain.data.spec import DataSpec
from gputrain.data.tensors import TensorData
from gputrain.models import build_model

T, V, N = 8, 32, 16
SPEC = DataSpec(task="lm", input_shape=(T,), vocab_size=V)


def uneven_data(n: int = N, seed: int = 1) -> TensorData:
    """Token rows whose first 0..T labels are -100, unevenly: some rows have none valid, some all."""
    g = torch.Generator().manual_seed(seed)
    inputs, targets = torch.randint(0, V, (n, T), generator=g), torch.randint(0, V, (n, T), generator=g)
    for i in range(n):
        targets[i, : (i * 5) % (T + 1)] = -100
    return TensorData(inputs, targets)


def tiny_gpt(n_layer: int = 1) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(ModelConfig(name="gpt", n_layer=n_layer, n_head=2, d_model=16, dropout=0.0), SPEC)


def config(**overrides: Any) -> Any:
    base = {
        "log.progress": "none",
        "log.tensorboard": False,
        "log.every_steps": 1,
        "train.seed": 0,
        "train.batch_size": 8,
        "train.max_steps": 3,
        "optim.name": "sgd",
        "optim.lr": 0.5,
        "checkpoint.enabled": False,
        "eval.every_epochs": 0,
        "train.device": "cpu",
    }
    return load_config(None, {**base, **overrides})


def step_losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows if "split" not in row]


def train(run_dir: Path, data: TensorData, **overrides: Any) -> tuple[list[float], dict[str, torch.Tensor]]:
    model = tiny_gpt()
    Trainer(model, data, config=config(**overrides), run_dir=run_dir, spec=SPEC).fit()
    return step_losses(run_dir), {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_accumulation_equals_the_whole_batch_with_uneven_ignored_labels(tmp_path: Path) -> None:
    data = uneven_data()
    whole, whole_w = train(tmp_path / "whole", data)
    accum, accum_w = train(tmp_path / "accum", data, **{"train.grad_accum": 4})
    assert len(whole) == len(accum) == 3
    torch.testing.assert_close(torch.tensor(accum), torch.tensor(whole), rtol=1e-6, atol=1e-6)
    for key in whole_w:
        torch.testing.assert_close(accum_w[key], whole_w[key], rtol=1e-6, atol=1e-6, msg=key)


def test_the_logged_loss_is_the_mean_over_the_global_batchs_valid_tokens(tmp_path: Path) -> None:
    """One step over all 16 samples (in 4 micro-batches): its loss is the initial model's
    cross-entropy over every valid token of the data, not a mean of the micro-batches' means."""
    data = uneven_data()
    model = tiny_gpt()
    with torch.no_grad():
        logits = model(data.tensors[0])
    expected = F.cross_entropy(logits.flatten(0, 1), data.tensors[1].flatten(), ignore_index=-100).item()
    Trainer(
        model,
        data,
        config=config(**{"train.batch_size": N, "train.grad_accum": 4, "train.max_steps": 1}),
        run_dir=tmp_path / "r",
        spec=SPEC,
    ).fit()
    assert step_losses(tmp_path / "r") == [pytest.approx(expected, rel=1e-6)]


def test_evaluation_reports_the_mean_over_the_splits_valid_tokens(tmp_path: Path) -> None:
    """The val loss (the Evaluator's micro-batches of 2 here) against one cross-entropy over the split."""
    data, val = uneven_data(), uneven_data(n=10, seed=2)
    model = tiny_gpt()
    trainer = Trainer(
        model,
        data,
        val_data=val,
        config=config(**{"train.grad_accum": 4, "train.max_steps": 1}),
        run_dir=tmp_path / "r",
        spec=SPEC,
    )
    trainer.fit()
    got = trainer.parts.evaluator.evaluate(val, "val").metrics
    model.eval()
    with torch.no_grad():
        logits = model(val.tensors[0])
    expected = F.cross_entropy(logits.flatten(0, 1), val.tensors[1].flatten(), ignore_index=-100).item()
    assert got["loss"] == pytest.approx(expected, rel=1e-6)
    assert got["perplexity"] == pytest.approx(math.exp(expected), rel=1e-6)


def test_a_users_loss_fn_keeps_the_mean_per_micro_batch(tmp_path: Path) -> None:
    """loss_fn= is the user's: averaged per micro-batch as before (documented), so with uneven -100s
    accumulation does not equal the whole batch, and no token count is taken."""

    def mean_ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    data = uneven_data()
    runs = {}
    for accum in (1, 4):
        model = tiny_gpt()
        trainer = Trainer(
            model,
            data,
            loss_fn=mean_ce,
            config=config(**{"train.grad_accum": accum}),
            run_dir=tmp_path / f"a{accum}",
            spec=SPEC,
        )
        trainer.fit()
        assert trainer.parts.step.tokens is None
        runs[accum] = step_losses(tmp_path / f"a{accum}")
    assert runs[1][0] != pytest.approx(runs[4][0], rel=1e-4)


class DictRows(torch.utils.data.Dataset):
    """Hugging Face-style samples: {"input_ids", "labels"}, the labels -100 on a prompt of uneven length."""

    def __init__(self, data: TensorData) -> None:
        self.inputs, self.targets = data.tensors

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        labels = self.inputs[i].clone()
        labels[: (i * 5) % (T + 1)] = -100
        return {"input_ids": self.inputs[i], "labels": labels}


def hf_gpt2() -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=1,
        n_head=2,
        n_embd=16,
        vocab_size=V,
        n_positions=T,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(cfg)


def job_parts(kind: str) -> tuple[torch.nn.Module, Any, DataSpec | None]:
    """(model, train data, spec) of a run of tests/dist/test_token_loss.py: "gpt1" and "gpt2" the
    tiny GPT of 1 or 2 layers on (inputs, targets), "hf" a HF GPT-2 on dict batches."""
    if kind == "hf":
        return hf_gpt2(), DictRows(uneven_data()), None
    return tiny_gpt(int(kind.removeprefix("gpt"))), uneven_data(), SPEC


def test_a_hugging_face_causal_lm_is_normalised_over_its_shifted_valid_labels(tmp_path: Path) -> None:
    """Dict batches to a HF causal LM: its forward takes num_items_in_batch, so its summed loss is
    normalised as the task's own; its valid tokens are those of labels[..., 1:] (it shifts them)."""
    data = DictRows(uneven_data())
    runs = {}
    for accum in (1, 4):
        model = hf_gpt2()
        trainer = Trainer(model, data, config=config(**{"train.grad_accum": accum}), run_dir=tmp_path / f"a{accum}")
        trainer.fit()
        tokens = trainer.parts.step.tokens
        assert tokens is not None and tokens.loss.where == "labels[..., 1:]"
        runs[accum] = (
            step_losses(tmp_path / f"a{accum}"),
            {k: v.detach().clone() for k, v in model.state_dict().items()},
        )
    (whole, whole_w), (accum, accum_w) = runs[1], runs[4]
    torch.testing.assert_close(torch.tensor(accum), torch.tensor(whole), rtol=1e-6, atol=1e-6)
    for key in whole_w:
        torch.testing.assert_close(accum_w[key], whole_w[key], rtol=1e-6, atol=1e-6, msg=key)
    # evaluation: the split's summed loss over its shifted valid labels, as the model's own mean over all of it
    model = hf_gpt2()
    trainer = Trainer(model, data, config=config(**{"train.max_steps": 1}), run_dir=tmp_path / "eval")
    trainer.fit()
    model.eval()
    whole_split = {k: torch.stack([data[i][k] for i in range(len(data))]) for k in ("input_ids", "labels")}
    with torch.no_grad():
        expected = model(**whole_split).loss.item()
    assert trainer.parts.evaluator.evaluate(data, "val").metrics["loss"] == pytest.approx(expected, rel=1e-6)
