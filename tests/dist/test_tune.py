"""`gputrain tune` for real, on gloo ranks (issue 31's proof): the tune measures 2-rank layouts in
fresh processes and keeps the fastest; `gputrain train --nproc-per-node 2 parallel.strategy=tuned`
applies it and trains exactly (1e-6) as the same layout given by hand; a candidate forced to fail by
a memory limit (RLIMIT_DATA, as `prlimit --data` sets it) is a recorded row, and the same layout at
the next micro-batch is not tried. (The budget is honoured on a simulated clock:
tests/unit/tune/test_scheduler.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gputrain.config import load_config
from gputrain.tune.session import TuneJob, run_tune
from gputrain.tune.trial import TrainTrial
from tests.dist.harness import ROOT

JOB = [
    "model.name=mlp",
    "model.hidden_sizes=[16]",
    "data.name=synthetic",
    "data.shape=[8]",
    "data.num_classes=4",
    "data.num_samples=128",
    "train.batch_size=16",
    "optim.lr=0.05",
]
QUIET = ["log.progress=none", "log.tensorboard=false", "checkpoint.enabled=false", "train.max_steps=3"]


def gputrain(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("WORLD_SIZE", None)
    return subprocess.run(
        [sys.executable, "-m", "gputrain", *args], cwd=ROOT, env=env, text=True, capture_output=True, timeout=timeout_s
    )


def _job(tmp_path: Path, **kw) -> TuneJob:
    base = {
        "config": load_config(None, JOB),
        "config_file": None,
        "overrides": list(JOB),
        "run_dir": tmp_path / "tune",
        "budget_s": 240.0,
        "max_ranks": 2,
        "baseline_ranks": 2,
        "micro_batches": 1,
        "compile": (False,),
        "confirm": 0,  # each layout measured once: the test is about applying it
    }
    base.update(kw)
    return TuneJob(**base)


@pytest.fixture(autouse=True)
def _in_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the trials' processes import this checkout


def test_tune_picks_a_two_rank_layout_and_training_with_it_equals_that_layout_by_hand(tmp_path: Path) -> None:
    job = _job(tmp_path)
    lines: list[str] = []
    results = run_tune(job, select=lambda c: c.ranks == 2 and c.strategy != "auto", say=lines.append)
    measured = [r for r in results if r.status == "ok"]
    assert {r.candidate.strategy for r in measured} == {"ddp", "fsdp"}, [(r.status, r.reason) for r in results]
    for r in measured:
        assert r.samples_per_s and r.samples_per_s > 0 and len(r.peak_memory_by_rank) == 2
    record = json.loads((job.run_dir / "tune.json").read_text())
    winner = record["candidates"][record["winner"]]
    assert winner["status"] == "ok" and winner["candidate"]["ranks"] == 2
    assert any(line.startswith("[1/2] ") for line in lines)  # a progress line per candidate

    tuned = gputrain(
        "train",
        "--nproc-per-node",
        "2",
        "--run-dir",
        str(tmp_path / "tuned"),
        *JOB,
        *QUIET,
        "parallel.strategy=tuned",
        f"parallel.tune_file={job.run_dir}",
    )
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    said = [ln for ln in tuned.stdout.splitlines() if ln.startswith("parallel.strategy=tuned:")]
    assert said == [f"parallel.strategy=tuned: {winner['label']} ({said[0].split('(', 1)[1]}"], tuned.stdout
    by_hand = gputrain(
        "train", "--nproc-per-node", "2", "--run-dir", str(tmp_path / "by_hand"), *JOB, *QUIET, *winner["overrides"]
    )
    assert by_hand.returncode == 0, by_hand.stderr[-3000:]
    a, b = (
        load_file(str(tmp_path / "tuned" / "model.safetensors")),
        load_file(str(tmp_path / "by_hand" / "model.safetensors")),
    )
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6)
    summaries = [json.loads((tmp_path / d / "summary.json").read_text()) for d in ("tuned", "by_hand")]
    assert [s["world_size"] for s in summaries] == [2, 2]
    assert abs(summaries[0]["train"]["loss"] - summaries[1]["train"]["loss"]) <= 1e-6


def test_a_candidate_forced_to_fail_by_a_memory_limit_is_recorded_and_its_next_micro_batch_skipped(
    tmp_path: Path,
) -> None:
    job = _job(tmp_path, max_ranks=1, baseline_ranks=1, micro_batches=2)
    capped = 64 << 20  # 64 MiB of data segment: not even torch imports under it

    trial = TrainTrial(None, list(JOB), 16, memory_cap=lambda c: capped if c.micro_batch == 8 else None)
    results = run_tune(
        job, trial=trial, select=lambda c: c.strategy == "none" and c.threads == 2, say=lambda line: None
    )
    rows = {r.candidate.micro_batch: r for r in results if r.candidate.strategy == "none"}
    assert rows[8].status == "oom" and rows[8].reason, (rows[8].status, rows[8].reason)
    assert rows[16].status == "pruned" and rows[16].reason == "this layout failed at micro-batch 8"
    record = json.loads((job.run_dir / "tune.json").read_text())
    statuses = {row["candidate"]["micro_batch"]: row["status"] for row in record["candidates"]}
    assert statuses == {8: rows[8].status, 16: "pruned"}
    assert record["winner"] is None
