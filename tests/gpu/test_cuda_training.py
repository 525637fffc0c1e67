"""The GPU tier: real CUDA runs. Skipped on machines without CUDA (CI has none)."""

import json

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_default_job_on_the_gpu_uses_bf16_or_fp16(cli, tmp_path):
    result = cli("train", "--run-dir", "run", "log.tensorboard=false", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["device"].startswith("cuda")
    assert summary["precision"] == ("bf16" if torch.cuda.get_device_capability() >= (8, 0) else "fp16")
    assert summary["test"]["accuracy"] >= 0.97
    assert summary["train"]["peak_memory_bytes"] > 0


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16", "fp16"])
def test_every_precision_trains(cli, tmp_path, precision):
    result = cli("train", "--run-dir", "run", f"train.precision={precision}", "train.max_steps=30",
                 "log.tensorboard=false", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["precision"] == precision and summary["train"]["loss"] < 2.3


def test_resume_on_the_gpu_continues_the_same_run(cli, tmp_path):
    first = cli("train", "--run-dir", "run", "train.epochs=2", "log.tensorboard=false", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    second = cli("train", "--run-dir", "run", "train.epochs=3", "log.tensorboard=false", cwd=tmp_path)
    assert second.returncode == 0 and "resumed from" in second.stdout
