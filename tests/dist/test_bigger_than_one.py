"""A model bigger than one process trains on 2 FSDP ranks (issue 27's proof), as a user meets it:
under a per-process memory limit set on the command (as `prlimit --data=` sets it; torchrun's
workers inherit it), one process is refused at its start with one line naming the limit, while
`--nproc-per-node 2 parallel.strategy=fsdp` trains, checkpoints, is continued to more steps by a
second command, and leaves final weights that `gputrain evaluate` scores as the run did; and `gputrain plan`, given no --device-memory, reads the
same limit and predicts both outcomes.

The limit is RLIMIT_DATA, not RLIMIT_AS: an idle rank (gputrain, torch and a gloo group imported)
maps 790-860 MiB of address space, most of it reserved and never touched (thread stacks, glibc's
per-thread arenas, libraries' text) and varying with the threads a run starts, against 230-260 MiB of
data (VmData, which follows what is written: heap and private writable maps). Both are what
`config/sizes.py` reads as this process's limit.

What each part needs: the ranks fit under the limit only with the allocator setting gputrain gives
the processes it starts (glibc's mmap threshold: freed blocks go back to the system); `plan` sees the
limit (its device_bytes) only where it reads the per-process limit, undivided by the ranks, rather
than the machine's memory; the one process's refusal needs the same reading at the start-up check.
"""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.dist.harness import ROOT

# AdamW on a GPT whose 10 blocks hold 99.6% of its 71M parameters (12*10*768^2 = 70.8M; vocabulary
# 256, context 16): weights W = 271 MiB, and a step adds W of gradients and 2W of AdamW's states. One
# process needs 4W of them over its idle data; each FSDP rank half, plus a gathered block and the next
# (prefetched, 27 MiB each). Measured with GLIBC_TUNABLES=glibc.malloc.mmap_threshold=131072 (issue
# 27a's allocator setting) on 2 cores at load 5-7, peak VmData sampled every 10 ms (MiB):
#   idle (gputrain, torch, gloo imported):  one process 235, a rank 260   (VmSize 655 / 811-876)
#   one process, 2 steps, no limit:         1,379 (VmHWM 1,421)
#   FSDP, 2 steps + checkpoint + final save: rank 0 1,077, rank 1 1,013 (VmHWM 1,027 / 961);
#   continued to 3 steps: 1,076 / 1,014;     `gputrain evaluate` of the final weights: 732
# LIMIT = 1,200 MiB: 123 above the largest rank, 179 below the one process, which fails at its first
# AdamW step. Without the allocator setting the ranks fail at step 1 too (`DefaultCPUAllocator: can't
# allocate memory`: freed blocks stay in glibc's heap). `gputrain plan` at 1,200 MiB (85% usable,
# 1,020): one process 1,086 MiB, does not fit (66 over); an FSDP rank 626 MiB, fits.
MODEL = [
    "model.name=gpt",
    "model.n_layer=10",
    "model.n_head=12",
    "model.d_model=768",
    "model.dropout=0.0",
    "data.name=synthetic",
    "data.task=lm",
    "data.seq_len=16",
    "data.vocab_size=256",
    "data.num_samples=20",
    "data.val_fraction=0.0",  # no val evaluation: each forward all-gathers the model (the test split stays)
    "train.batch_size=2",
    "train.epochs=1",
    "train.device=cpu",
    "train.precision=fp32",
    "optim.name=adamw",
    "log.progress=plain",
    "log.tensorboard=false",
]
LIMIT = 1200 * 2**20
"""RLIMIT_DATA per process: above each FSDP rank's peak, below the one process's (see above)."""
CHECKPOINTS = ["checkpoint.enabled=true", "checkpoint.every_steps=1"]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA as Linux applies it")


def _limited() -> None:
    """In the started command, before it runs: the per-process limit its children inherit."""
    resource.setrlimit(resource.RLIMIT_DATA, (LIMIT, LIMIT))


def gputrain(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    return subprocess.run(
        [sys.executable, "-m", "gputrain", *args],
        cwd=ROOT,
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout_s,
        preexec_fn=_limited,
    )


def plan(*args: str) -> tuple[int, dict]:
    done = gputrain("plan", "--json", *args, *MODEL)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    return done.returncode, json.loads(done.stdout)


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_plan_reads_the_limit_and_predicts_one_process_fails_and_two_fsdp_ranks_fit() -> None:
    code, one = plan()
    assert 0 < one["device_bytes"] <= LIMIT, one["device_bytes"]  # the limit binds, not the machine's RAM
    assert code == 1 and one["auto"] is None and not any(row["fits"] for row in one["rows"])
    code, two = plan("--nproc-per-node", "2", "parallel.strategy=fsdp")
    assert 0 < two["device_bytes"] <= LIMIT, two["device_bytes"]  # each process's own, not divided by 2
    fsdp = next(
        row
        for row in two["rows"]
        if row["strategy"] == "fsdp" and row["activation_checkpointing"] == "none" and not row["cpu_offload"]
    )
    assert code == 0 and fsdp["fits"], fsdp


def test_one_process_runs_out_of_memory_cleanly(tmp_path: Path) -> None:
    run_dir = tmp_path / "one"
    done = gputrain("train", "--run-dir", str(run_dir), *MODEL, "parallel.strategy=none")
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    # refused before the model is built: the start-up check (config/sizes.py) sees the states
    # (4W = 1,085 MiB) exceed the data limit less what the process maps already; one line naming
    # the limit and the way out, no run started (before the limits were read as they are, it passed
    # the check and AdamW's first step could not allocate)
    assert done.returncode == 2, done.stderr[-2000:]
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1, line
    assert "data limit (ulimit -d / prlimit --data)" in line and "parallel.strategy=fsdp" in line, line
    assert not (run_dir / "summary.json").exists()


def test_two_fsdp_ranks_train_checkpoint_resume_and_evaluate_as_the_run_did(tmp_path: Path) -> None:
    run_dir = tmp_path / "fsdp"
    launch = ["train", "--nproc-per-node", "2", "--run-dir", str(run_dir)]
    first = gputrain(*launch, *MODEL, *CHECKPOINTS, "train.max_steps=1", "parallel.strategy=fsdp")
    assert first.returncode == 0, first.stderr[-3000:]
    assert summary(run_dir)["global_step"] == 1 and (run_dir / "checkpoints" / "step-1").is_dir()
    # a second command continues the run to more steps, from its checkpoint, under the same limit
    second = gputrain(*launch, *MODEL, *CHECKPOINTS, "train.max_steps=2", "parallel.strategy=fsdp")
    assert second.returncode == 0, second.stderr[-3000:]
    said = "".join((second.stdout + second.stderr).split())  # the console wraps long lines
    assert f"resumedfrom{run_dir}/checkpoints/step-1(step1)" in said, said[-2000:]
    ended = summary(run_dir)
    assert ended["status"] == "completed" and ended["global_step"] == 2 and ended["world_size"] == 2, ended
    # the final weights, loaded by one process under the same limit, score the test split as the run did
    scored = gputrain("evaluate", str(run_dir), "--device", "cpu")
    assert scored.returncode == 0, scored.stderr[-2000:]
    record = json.loads((run_dir / "eval-test.json").read_text())
    assert record["weights"]["kind"] == "final" and record["metrics"].keys() == ended["test"].keys()
    for metric, value in ended["test"].items():
        assert math.isclose(record["metrics"][metric], value, rel_tol=1e-6), (metric, record["metrics"], ended)
