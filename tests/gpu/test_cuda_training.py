"""The GPU tier: real CUDA runs. Skipped on machines without CUDA (CI has none)."""

import json
import math

import pytest
import torch

from tests.unit.train.helpers import losses

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
    # 60 steps of the default job take the loss from ln 10 ~ 2.30 to ~0.35 and test accuracy to ~0.90
    # (measured in fp32 and bf16 on CPU); a run that does not learn stays at ~2.3 and ~0.1.
    result = cli("train", "--run-dir", "run", f"train.precision={precision}", "train.max_steps=60",
                 "log.every_steps=1", "log.tensorboard=false", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["precision"] == precision and summary["global_step"] == 60
    logged = [loss for _, loss in losses(tmp_path / "run")]
    assert len(logged) == 60 and all(math.isfinite(v) for v in logged), logged
    assert sum(logged[-5:]) / 5 < 0.5 * logged[0], logged
    assert summary["test"]["accuracy"] > 0.8


def test_resume_on_the_gpu_continues_the_same_run(cli, tmp_path):
    """Two epochs, then resumed to three, log the same per-step losses as three epochs unbroken.
    Deterministic algorithms make both processes compute the same numbers on the same GPU, so the
    tolerance only forgives the last bits; a resume that lost the weights, optimizer moments, data
    order or RNG would be off by far more than that from the first step of epoch 3."""
    job = ("train.deterministic=true", "log.every_steps=1", "log.tensorboard=false")
    env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}  # before CUDA starts: cuBLAS reads it once
    unbroken = cli("train", "--run-dir", "unbroken", "train.epochs=3", *job, cwd=tmp_path, env=env)
    assert unbroken.returncode == 0, unbroken.stderr
    first = cli("train", "--run-dir", "run", "train.epochs=2", *job, cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr
    end_of_epoch_2 = max(step for step, _ in losses(tmp_path / "run"))
    second = cli("train", "--run-dir", "run", "train.epochs=3", *job, cwd=tmp_path, env=env)
    assert second.returncode == 0, second.stderr
    assert "resumed from" in second.stdout

    expected, got = losses(tmp_path / "unbroken"), losses(tmp_path / "run")
    assert [s for s, _ in got] == [s for s, _ in expected]  # no step lost or repeated
    epoch_3 = [i for i, (step, _) in enumerate(expected) if step > end_of_epoch_2]
    assert 0 < end_of_epoch_2 and len(epoch_3) == end_of_epoch_2 // 2  # the resumed run trained a whole epoch
    torch.testing.assert_close(torch.tensor([got[i][1] for i in epoch_3]),
                               torch.tensor([expected[i][1] for i in epoch_3]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.tensor([v for _, v in got]), torch.tensor([v for _, v in expected]),
                               rtol=1e-5, atol=1e-6)  # and epochs 1-2 were the same run to begin with


def test_batch_size_auto_reports_the_runs_own_peak_not_its_trials(tmp_path):
    """The auto trials probe micro-batches up to what runs out of memory; the run's reported peak is
    the one a run with the chosen batch, given outright, reports (within 10%)."""
    import tomllib

    from gputrain.train.trainer import Trainer

    args = ["model.name=mlp", "model.hidden_sizes=[4096,4096]", "data.name=synthetic", "data.shape=[1024]",
            "data.num_samples=4096", "train.max_steps=4", "log.tensorboard=false", "log.progress=none",
            "checkpoint.enabled=false", "eval.every_epochs=0"]
    auto = Trainer.from_config(None, run_dir=tmp_path / "auto", overrides=[*args, "train.batch_size=auto"]).fit()
    batch = tomllib.loads((tmp_path / "auto" / "config.toml").read_text())["train"]["batch_size"]
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    fixed = Trainer.from_config(None, run_dir=tmp_path / "fixed", overrides=[*args, f"train.batch_size={batch}"]).fit()
    ours, theirs = auto["train"]["peak_memory_bytes"], fixed["train"]["peak_memory_bytes"]
    assert abs(ours - theirs) <= 0.1 * theirs, (ours, theirs, batch)
