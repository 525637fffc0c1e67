"""train.precision=fp8 for real, on a GPU of compute capability 8.9+ with torchao installed (the CPU
twin, tests/unit/test_fp8.py, checks the refusal and the layer plan). Skipped elsewhere."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from gputrain import Trainer
from gputrain.config.schema import ModelConfig
from gputrain.data.spec import DataSpec
from gputrain.data.tensors import TensorData
from gputrain.models import build_model

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9)
    or importlib.util.find_spec("torchao") is None,
    reason="needs a GPU of compute capability 8.9+ and torchao",
)
T, V = 128, 1024


def _run(precision: str, run_dir: Path) -> tuple[list[float], Trainer]:
    torch.manual_seed(0)
    spec = DataSpec(task="lm", input_shape=(T,), vocab_size=V)
    # d_model 512: the attention's 512→1536 and the MLP's 512→2048 layers are large enough for float8
    model = build_model(ModelConfig(name="gpt", n_layer=2, n_head=8, d_model=512, vocab_size=V, seq_len=T,
                                    dropout=0.0), spec)
    start = torch.randint(0, V, (256, 1), generator=torch.Generator().manual_seed(0))
    tokens = (start + 7 * torch.arange(T + 1)) % V  # each sequence steps by 7: learnable in a few steps
    data = TensorData(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
    config = {"train.precision": precision, "train.compile": True, "train.max_steps": 40, "train.epochs": 100,
              "train.batch_size": 32, "optim.lr": 1e-3, "log.every_steps": 1, "log.progress": "none",
              "log.tensorboard": False, "checkpoint.enabled": False, "eval.every_epochs": 0}
    trainer = Trainer(model, data, spec=spec, config=config, run_dir=run_dir)
    summary = trainer.fit()
    assert summary["status"] == "completed" and summary["precision"] == precision
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "split" not in r], trainer


def test_fp8_trains_like_bf16(tmp_path: Path) -> None:
    bf16, _ = _run("bf16", tmp_path / "bf16")
    fp8, trainer = _run("fp8", tmp_path / "fp8")
    kinds = {type(m).__name__ for m in trainer.model.modules()}
    assert "Float8Linear" in kinds and type(trainer.model.lm_head) is torch.nn.Linear  # the head stays bf16
    plan = json.loads((tmp_path / "fp8" / "env.json").read_text())["run"]["fp8"]  # recorded as decided
    assert (plan["converted"], plan["skipped"]["output head"]) == (4, ["lm_head"]), plan
    assert fp8[-1] < 0.5 * fp8[0], fp8
    assert abs(sum(fp8[-5:]) - sum(bf16[-5:])) / sum(bf16[-5:]) < 0.05, (fp8[-5:], bf16[-5:])
