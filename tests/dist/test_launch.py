"""`gputrain train --nproc-per-node 2` end to end: torchrun started by us, a rank that fails, a restart."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

from tests.dist.harness import ROOT

ARGS = ["model.name=mlp", "data.name=synthetic", "data.shape=[16]", "data.num_samples=400",
        "model.hidden_sizes=[32,32]", "train.batch_size=32", "train.epochs=1", "train.max_steps=6",
        "log.every_steps=1", "log.tensorboard=false", "log.progress=plain", 'eval.metrics=["loss"]',
        "parallel.strategy=ddp", "parallel.timeout_s=20", "train.device=cpu"]


def gputrain(args: list[str], fault: str | None = None, timeout_s: float = 90,
             command: str = "train") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("WORLD_SIZE", None)
    if fault:
        env["GPUTRAIN_TEST_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "gputrain", command, *args], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=timeout_s)


def step_losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows if "split" not in row]


def test_a_failing_rank_stops_every_rank_and_is_named(tmp_path: Path) -> None:
    run = gputrain(["--nproc-per-node", "2", "--run-dir", str(tmp_path / "run"), *ARGS, "checkpoint.enabled=false"],
                   fault="rank=1,forward=3,action=raise")
    assert run.returncode == 1, run.stderr[-2000:]
    assert "training failed at step 3 (rank 1): RuntimeError: test fault injected at forward 3" in run.stderr
    assert "rank 1 failed first: it exited with code 1" in run.stderr
    assert (tmp_path / "run" / "error-rank1.log").is_file()


def test_max_restarts_resumes_from_the_last_checkpoint(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run = gputrain(["--nproc-per-node", "2", "--max-restarts", "1", "--run-dir", str(run_dir), *ARGS,
                    "checkpoint.every_steps=2"],
                   fault=f"rank=1,forward=5,action=exit,once={tmp_path / 'fired'}")
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "fired").exists(), "the fault never fired"
    output = "".join((run.stdout + run.stderr).split())  # the console wraps long lines
    assert f"resumedfrom{run_dir / 'checkpoints' / 'step-4'}(step4)".replace(" ", "") in output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["global_step"] == 6 and summary["world_size"] == 2
    # the resumed steps are the ones an unbroken run takes (here: one process with the same global batch)
    from gputrain.train.trainer import Trainer

    overrides = [a for a in ARGS if not a.startswith(("parallel.", "log.progress"))]
    Trainer.from_config(None, run_dir=tmp_path / "single", overrides=[*overrides, "parallel.strategy=none",
                        "log.progress=none", "checkpoint.enabled=false"]).fit()
    torch.testing.assert_close(torch.tensor(step_losses(run_dir)), torch.tensor(step_losses(tmp_path / "single")),
                               rtol=1e-5, atol=1e-5)


def test_profile_of_a_ddp_job_reports_the_communication_share(tmp_path: Path) -> None:
    """Every rank profiles itself; rank 0 prints the split (with the gradient all-reduce apart) and findings."""
    run_dir = tmp_path / "profile"
    args = [a for a in ARGS if not a.startswith(("train.max_steps", "log."))]
    run = gputrain(["--nproc-per-node", "2", "--run-dir", str(run_dir), "--steps", "5", *args], command="profile")
    assert run.returncode == 0, run.stderr[-2000:]
    printed = " ".join(run.stdout.split())  # rich wraps long lines
    assert re.search(r"\(rank 0 of 2\); time split data \d+% .*fwd\+bwd \d+% optim \d+% comm \d+%", printed), printed
    for rank in (0, 1):
        assert json.loads((run_dir / f"trace-rank{rank}.json").read_text())["traceEvents"]
        facts = json.loads((run_dir / f"profile-rank{rank}.json").read_text())["facts"]
        assert facts["strategy"] == "ddp" and 0 < facts["comm_fraction"] < 1
    assert not (run_dir / "trace.json").exists()


def test_a_checkpoint_of_another_model_stops_every_rank_with_exit_2(tmp_path: Path) -> None:
    """Resuming a 2-rank job's sharded checkpoint with another model: every rank refuses it before
    loading anything, rank 0 says what differs in one line, and the launcher exits 2 (bad input)."""
    run_dir = tmp_path / "run"
    first = gputrain(["--nproc-per-node", "2", "--run-dir", str(run_dir), *ARGS, "checkpoint.every_steps=2",
                      "train.max_steps=2"])
    assert first.returncode == 0, first.stderr[-2000:]
    before = (run_dir / "metrics.jsonl").read_bytes()
    other_model = ["--nproc-per-node", "2", "--run-dir", str(run_dir), *ARGS, "checkpoint.every_steps=2",
                   "train.max_steps=4", "model.hidden_sizes=[32,16]"]
    # the run's config.toml says what it was: the launcher refuses before any rank starts
    refused = gputrain(other_model)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        f"gputrain train: {run_dir} holds a completed run (step 2) trained with another config: "
        + refused.stderr.split("trained with another config: ", 1)[1].strip()
    ], refused.stderr[-2000:]
    assert "model.hidden_sizes = [32, 32] there, [32, 16] given" in refused.stderr
    # without it, the checkpoint's own check refuses on every rank: rank 0's line, and no other
    (run_dir / "config.toml").unlink()
    again = gputrain(other_model)
    assert again.returncode == 2, again.stderr[-2000:]
    said = [line for line in again.stderr.splitlines() if line.startswith("gputrain train:")]
    assert said == [
        f"gputrain train: cannot resume: {run_dir / 'checkpoints' / 'step-2'}: .metadata: 3.weight has shape "
        "[32, 32] in the checkpoint, [16, 32] in this run's model (2 more differ: 3.bias, 5.weight)",
    ], again.stderr[-2000:]
    assert "Traceback" not in again.stderr
    assert (run_dir / "metrics.jsonl").read_bytes() == before  # nothing of the run was touched
