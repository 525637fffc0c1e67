"""A run that stops and resumes logs the same per-step losses, bit for bit on CPU, as one that
never stopped; the final weights are identical too. Dropout is on, so the RNG must be restored."""

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from gputrain.errors import Interrupted, RunError, UsageError
from tests.unit.train.helpers import losses, make_trainer, step_rows

JOB = {"train.epochs": 3, "train.batch_size": 64, "train.deterministic": True}


def _unbroken(tmp_path):
    run_dir = tmp_path / "unbroken"
    make_trainer(run_dir, **JOB).fit()
    return run_dir


def _assert_same_run(a, b):
    assert losses(a) == losses(b)  # exact float equality, every step
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_interrupt_then_resume_is_bit_exact(tmp_path):
    run_dir = tmp_path / "stopped"
    calls = {"n": 0}
    trainers = []

    def stop_at_step_25(outputs, targets):
        if torch.is_grad_enabled():
            calls["n"] += 1
            if calls["n"] == 25:
                trainers[0].stop.requested = "SIGTERM"  # what the signal handler does
        return F.cross_entropy(outputs, targets)

    trainer = make_trainer(run_dir, loss_fn=stop_at_step_25, **JOB)
    trainers.append(trainer)
    with pytest.raises(Interrupted, match=r"stopped by SIGTERM at step 25.*call fit\(\) again on a Trainer with run_dir="):
        trainer.fit()
    assert (run_dir / "checkpoints" / "step-25" / "COMMITTED").is_file()
    make_trainer(run_dir, **JOB).fit()
    _assert_same_run(_unbroken(tmp_path), run_dir)


def test_crash_then_resume_from_periodic_checkpoint_is_bit_exact(tmp_path):
    run_dir = tmp_path / "crashed"
    calls = {"n": 0}

    def crash_at_step_33(outputs, targets):
        if torch.is_grad_enabled():
            calls["n"] += 1
            if calls["n"] == 33:
                raise RuntimeError("simulated crash")
        return F.cross_entropy(outputs, targets)

    with pytest.raises(RunError, match="step 33.*simulated crash"):
        make_trainer(run_dir, loss_fn=crash_at_step_33, **JOB, **{"checkpoint.every_steps": 10}).fit()
    assert (run_dir / "summary.json").is_file() and '"failed"' in (run_dir / "summary.json").read_text()
    assert max(row["step"] for row in step_rows(run_dir)) == 32
    make_trainer(run_dir, **JOB, **{"checkpoint.every_steps": 10}).fit()  # resumes at step 30
    _assert_same_run(_unbroken(tmp_path), run_dir)


def test_resume_never_starts_over_but_never_over_another_run(tmp_path):
    run_dir = tmp_path / "r"
    make_trainer(run_dir, **{"train.max_steps": 5}).fit()
    rows = (run_dir / "metrics.jsonl").read_text()
    with pytest.raises(UsageError, match="checkpoint.resume=never would mix two runs in one directory"):
        make_trainer(run_dir, **{"train.max_steps": 5, "checkpoint.resume": "never"}).fit()
    assert (run_dir / "metrics.jsonl").read_text() == rows  # the first run's record is whole
    fresh = tmp_path / "fresh"
    assert make_trainer(fresh, **{"train.max_steps": 5, "checkpoint.resume": "never"}).fit()["global_step"] == 5
    assert [s for s, _ in losses(fresh)] == [1, 2, 3, 4, 5]
