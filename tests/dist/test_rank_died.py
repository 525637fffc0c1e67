"""A rank SIGKILLed under gputrain's launcher (issue 35): the rank that died is named, with how, in one
line, whichever rank noticed first; the others' broken collectives are folded into that line, and
summary.json says the same. Real 2-rank gloo jobs: rank 0 killed on one node (so nobody else could
write summary.json), and rank 1 killed on the second of two nodes on localhost (two launchers, one
rank each, c10d rendezvous), where only the launcher of rank 1's node saw it die."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.adversarial.helpers import read_summary
from tests.dist.harness import ROOT, free_port
from tests.unit.reliability.chaos import TINY, logged_step
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

ARGS = [*TINY, "parallel.strategy=ddp", "parallel.timeout_s=30", "train.epochs=20"]  # runs until killed
LAUNCH_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GROUP_RANK",
    "TORCHELASTIC_RUN_ID",
    "SLURM_PROCID",
    "SLURM_NTASKS",
)


def _launch(run_dir: Path, launch: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    out = open(log, "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [sys.executable, "-m", "gputrain", "train", "--run-dir", str(run_dir), *launch, *ARGS],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _ranks_of(launchers: list[subprocess.Popen[bytes]]) -> dict[int, int]:
    """rank -> pid of each rank the launchers started (their children with RANK in the environment)."""
    found = {}
    for launcher in launchers:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) != launcher.pid:
                    continue
                environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            except (OSError, IndexError, ValueError):
                continue
            for item in environ:
                if item.startswith(b"RANK="):
                    found[int(item[5:])] = int(entry)
    return found


def _ended(launchers: list[subprocess.Popen[bytes]]) -> list[int]:
    try:
        return [proc.wait(timeout=150) for proc in launchers]
    finally:
        for proc in launchers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _failure_lines(log: Path) -> list[str]:
    text = log.read_text()
    assert "training failed" not in text and "Traceback" not in text, text[-3000:]
    return [line for line in text.splitlines() if line.startswith("gputrain train:")]


def test_rank_0_killed_is_named_and_the_launcher_writes_the_summary(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "launcher.log"
    launcher = _launch(run_dir, ["--nproc-per-node", "2"], log)
    wait_until(lambda: logged_step(run_dir) >= 3 or launcher.poll() is not None, 150, what="step 3")
    ranks = _ranks_of([launcher])
    assert set(ranks) == {0, 1}, ranks
    os.kill(ranks[0], signal.SIGKILL)
    assert _ended([launcher]) == [1]
    (line,) = _failure_lines(log)
    summary = read_summary(run_dir)  # rank 0 never wrote it: the launcher did
    assert re.fullmatch(
        r"gputrain train: rank 0 failed first: it was killed by SIGKILL after step \d+ \(no message: a "
        r"signal ends a process at once\); ranks \[1\] stopped too: their collectives with it broke "
        r"\(.+\)",
        line,
    ), line
    assert (summary["status"], summary["failed_rank"], summary["failed_how"]) == ("failed", 0, "SIGKILL")
    assert summary["error"] == line.removeprefix("gputrain train: ") and summary["global_step"] >= 3


def test_a_rank_killed_on_another_node_is_named_by_both_launchers(tmp_path: Path) -> None:
    run_dir, port = tmp_path / "run", free_port()
    logs = [tmp_path / f"node{node}.log" for node in (0, 1)]
    launchers = [
        _launch(
            run_dir,
            [
                "--nproc-per-node",
                "1",
                "--nnodes",
                "2",
                "--node-rank",
                str(node),
                "--rdzv-endpoint",
                f"localhost:{port}",
            ],
            logs[node],
        )
        for node in (0, 1)
    ]
    wait_until(lambda: logged_step(run_dir) >= 3 or any(p.poll() is not None for p in launchers), 150, what="step 3")
    ranks = _ranks_of(launchers)
    assert set(ranks) == {0, 1}, ranks
    os.kill(ranks[1], signal.SIGKILL)
    assert _ended(launchers) == [1, 1]
    lines = {node: _failure_lines(logs[node]) for node in (0, 1)}
    step = read_summary(run_dir)["global_step"]
    # which launcher holds which rank is c10d's choice: the one that held rank 1 saw it die
    died_here = [node for node in (0, 1) if lines[node][0].startswith("gputrain train: rank 1 failed first")]
    assert len(died_here) == 1, lines
    elsewhere = lines[1 - died_here[0]]
    assert elsewhere == [
        f"gputrain train: rank 1 (on another node) failed first: it was killed by SIGKILL after step "
        f"{step}; ranks [0] here stopped too: their collectives with it broke "
        f"({elsewhere[0].rsplit('(', 1)[1]}"
    ], lines
    summary = read_summary(run_dir)
    assert (summary["status"], summary["failed_rank"], summary["failed_how"]) == ("failed", 1, "SIGKILL")


@pytest.mark.parametrize("sig", [signal.SIGUSR2], ids=lambda s: s.name)
def test_a_signal_to_the_launcher_reaches_the_ranks_which_save_and_record(tmp_path: Path, sig: signal.Signals) -> None:
    """torchrun's agent passes on only SIGTERM, SIGINT, SIGHUP and SIGQUIT by itself: a SIGUSR2 (or
    SIGUSR1, SIGALRM) to the launcher alone ended it at once, and its ranks with it, unrecorded."""
    run_dir, log = tmp_path / "run", tmp_path / "launcher.log"
    launcher = _launch(run_dir, ["--nproc-per-node", "2"], log)
    wait_until(lambda: logged_step(run_dir) >= 3 or launcher.poll() is not None, 150, what="step 3")
    launcher.send_signal(sig)  # the launcher only, as `kill -USR2 PID` does
    assert _ended([launcher]) == [130], log.read_text()[-3000:]
    summary = read_summary(run_dir)
    assert (summary["status"], summary["signal"]) == ("interrupted", sig.name)
    assert (run_dir / "checkpoints" / f"step-{summary['global_step']}").is_dir()
    assert f"gputrain train: stopped by {sig.name}: the ranks saved a checkpoint" in log.read_text()
