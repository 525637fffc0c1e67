"""Signals and launches (issue 13): every way a user or a scheduler stops a run ends with the promised
exit code and records, and a launch names the rank that failed.

* the first SIGINT, SIGTERM or Slurm's SIGUSR1: a checkpoint, exit 130, summary.json `interrupted`;
* a second one, whenever it lands (while the checkpoint is written, or while the stopped process
  is already exiting, where Python has put the default handlers back): exit 130 too, never 128+N;
* a rank of a `--nproc-per-node 2` job SIGKILLed (the OOM killer, a user): the launcher names that
  rank and the signal, not the peer whose collective broke and which wrote the only error log.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gputrain import interrupts
from gputrain.checkpoint import find_resumable, verify_checkpoint
from gputrain.distributed.launch import culprit
from gputrain.run.signals import StopRequest
from tests.adversarial.helpers import read_summary
from tests.unit.reliability.chaos import (
    TINY,
    TINY_2_RANKS,
    kill_at_step,
    logged_step,
    second_signal_during_a_save,
    start_train,
)
from tests.waiting import wait_until

SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1]
IDS = [s.name for s in SIGNALS]


def _log(run_dir: Path) -> str:
    return run_dir.with_suffix(".log").read_text()


def _checkpoint_named(run_dir: Path, sig: signal.Signals) -> Path:
    """The one-line report of an interrupted run names the signal, the step and its checkpoint."""
    output = _log(run_dir)
    match = re.search(rf"stopped by {sig.name} at step (\d+); checkpoint saved at (\S+); resume with: "
                      rf"gputrain train --run-dir {re.escape(str(run_dir))}$", output, re.MULTILINE)
    assert match, output[-1500:]
    path = Path(match[2])
    assert path == run_dir / "checkpoints" / f"step-{match[1]}"
    return path


# ----------------------------------------------------------------------------- the first signal
@pytest.mark.slow
@pytest.mark.parametrize("sig", SIGNALS, ids=IDS)
def test_a_first_signal_checkpoints_and_exits_130(sig: signal.Signals, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = start_train(run_dir, TINY)
    assert kill_at_step(proc, run_dir, 5, sig=sig) is not None, "the run ended before the signal"
    assert proc.returncode == 130, _log(run_dir)[-1500:]
    path = _checkpoint_named(run_dir, sig)
    verify_checkpoint(path)
    assert find_resumable(run_dir / "checkpoints") == path
    summary = read_summary(run_dir)
    assert summary["status"] == "interrupted" and summary["global_step"] == int(path.name[5:])
    assert "Traceback" not in _log(run_dir)


# ----------------------------------------------------------------------------- a second signal
@pytest.mark.slow
@pytest.mark.parametrize(("sig", "delay_s"), [
    (signal.SIGTERM, 0.0), (signal.SIGTERM, 0.15), (signal.SIGUSR1, 0.0), (signal.SIGUSR1, 0.15), (signal.SIGINT, 0.15),
], ids=["SIGTERM-at-once", "SIGTERM-in-teardown", "SIGUSR1-at-once", "SIGUSR1-in-teardown", "SIGINT-in-teardown"])
def test_a_second_signal_while_the_stopped_run_exits_is_still_130(sig: signal.Signals, delay_s: float,
                                                                  tmp_path: Path) -> None:
    """The first signal has been handled (checkpoint, summary, the one-line report); the process is
    leaving. At once: the run's handlers are gone. A moment later: the interpreter is tearing down
    (where it still does: `gputrain.cli.entry` now skips most of it), where Python has given every
    signal back its default action. Before, SIGTERM ended the process with 143 and SIGUSR1 with 138
    in both windows."""
    run_dir = tmp_path / "run"
    proc = start_train(run_dir, TINY)
    wait_until(lambda: logged_step(run_dir) >= 3 or proc.poll() is not None, what="step 3")
    proc.send_signal(sig)
    wait_until(lambda: "stopped by" in _log(run_dir) or proc.poll() is not None, what="the stop's report")
    time.sleep(delay_s)  # the moment under test: at once, or while the interpreter tears down
    if delay_s == 0.0:
        assert proc.poll() is None, "the process had already exited: the second signal could not land"
    if proc.poll() is None:  # since gputrain.cli.entry leaves with os._exit, teardown may be over already
        proc.send_signal(sig)
    assert proc.wait(timeout=60) == 130
    verify_checkpoint(_checkpoint_named(run_dir, sig))
    assert read_summary(run_dir)["status"] == "interrupted"


@pytest.mark.slow
def test_a_second_signal_during_the_save_leaves_at_once(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # each phase of a checkpoint write sleeps 5 s, so a save takes over 25 s
    proc = start_train(run_dir, TINY, env={"GPUTRAIN_TEST_SAVE_PHASE_DELAY_S": "5"}, mark_stops=True)
    saving = second_signal_during_a_save(proc, run_dir)
    assert proc.wait(timeout=300) == 130
    # at once: the save under way was abandoned, not finished (which the first signal alone waits for)
    assert not (run_dir / "checkpoints" / saving).exists()
    assert "gputrain train: interrupted" in _log(run_dir)
    assert read_summary(run_dir)["status"] == "interrupted"
    for path in (run_dir / "checkpoints").glob("step-*"):
        verify_checkpoint(path)  # the save it cut short left nothing at a final path


def test_after_a_signal_the_defaults_are_not_given_back(handlers: None) -> None:
    """In process, no signal sent: once a stop was requested, SIGTERM and SIGUSR1 (whose defaults end
    the process with 143 and 138) get a handler that exits 130; SIGINT its previous one."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    stop = StopRequest()
    stop.install()
    stop._handle(signal.SIGTERM, None)
    assert stop.requested == "SIGTERM"
    stop.uninstall()
    assert signal.getsignal(signal.SIGTERM) is interrupts.leave_now
    assert signal.getsignal(signal.SIGUSR1) is interrupts.leave_now
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    interrupts.ignore_during_exit()  # what runs at interpreter exit: no default action can end it then
    assert all(signal.getsignal(sig) == signal.SIG_IGN for sig in SIGNALS)


def test_without_a_signal_the_previous_handlers_come_back(handlers: None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    stop = StopRequest()
    stop.install()
    stop.uninstall()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


# ----------------------------------------------------------------------------- which rank failed
@pytest.mark.parametrize(("failures", "logged", "named"), [
    ({0: (1, 100.0), 1: (-9, 100.0)}, 0, 1),  # rank 1 SIGKILLed; rank 0's collective broke and it logged
    ({0: (-11, 100.0), 1: (1, 100.0)}, 1, 0),  # a segfault writes no log either
    ({0: (-15, 100.0), 1: (1, 100.0)}, 1, 1),  # SIGTERM is torchrun stopping the survivors
    ({0: (1, 100.0), 1: (-9, 131.0)}, 0, 0),  # SIGKILLed 30 s later: torchrun's own kill of a stuck peer
    ({0: (1, 100.0), 1: (1, 100.0)}, 1, 1),  # both raised: the first log decides
    ({0: (2, 100.0), 1: (2, 100.0)}, None, 0),  # every rank refused the input
], ids=["sigkill", "segfault", "sigterm_is_torchruns", "late_sigkill", "both_raised", "usage"])
def test_the_rank_that_failed_first(failures: dict[int, tuple[int, float]], logged: int | None, named: int) -> None:
    assert culprit(failures, logged) == named


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def _rank_of(pid: int) -> int | None:
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


@pytest.mark.slow
def test_a_sigkilled_rank_is_named_by_the_launcher(tmp_path: Path) -> None:
    """A real 2-rank gloo job started by `gputrain train --nproc-per-node 2`; rank 1 is SIGKILLed
    mid-run. Rank 0's next all-reduce fails and it writes the only error log; before, the launcher
    named rank 0."""
    run_dir = tmp_path / "run"
    proc = start_train(run_dir, TINY_2_RANKS)
    wait_until(lambda: logged_step(run_dir) >= 3 or proc.poll() is not None, what="step 3")
    ranks = {_rank_of(pid): pid for pid in _children(proc.pid)}
    assert set(ranks) == {0, 1}, ranks
    os.kill(ranks[1], signal.SIGKILL)
    try:
        code = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    output = _log(run_dir)
    assert code == 1, output[-2000:]
    (line,) = [line for line in output.splitlines() if "failed first" in line]
    summary = read_summary(run_dir)
    step = summary["global_step"]
    assert re.fullmatch(rf"gputrain train: rank 1 failed first: it was killed by SIGKILL after step {step} "
                        r"\(no message: a signal ends a process at once\); ranks \[0\] stopped too: their "
                        r"collectives with it broke \(Connection (reset|closed) by peer\)", line), line
    # rank 0's broken collective is folded into that line: not said as a failure of its own
    assert "training failed" not in output and "gloo" not in output
    assert (summary["status"], summary["failed_rank"], summary["failed_how"]) == ("failed", 1, "SIGKILL")
    assert summary["error"] == line.removeprefix("gputrain train: ")
    assert (run_dir / "error.log").is_file()  # rank 0's traceback is still kept
    assert (run_dir / "error-rank1.log").read_text().startswith("RankDied: rank 1 was killed by SIGKILL")
    assert not any(Path(f"/proc/{pid}").exists() for pid in ranks.values()), "a rank outlived the job"


@pytest.mark.slow
def test_a_second_sigterm_to_a_stopped_two_rank_job_is_still_130(tmp_path: Path) -> None:
    """Slurm's SIGTERM reaches every process of a `--nproc-per-node 2` job; the ranks checkpoint and
    the launcher reports it. A second SIGTERM while the launcher exits: before, 143 (torchrun's
    handlers, then Python's defaults during teardown)."""
    run_dir = tmp_path / "run"
    proc = start_train(run_dir, TINY_2_RANKS)
    wait_until(lambda: logged_step(run_dir) >= 3 or proc.poll() is not None, what="step 3")
    os.killpg(proc.pid, signal.SIGTERM)
    wait_until(lambda: "the ranks saved a checkpoint" in _log(run_dir) or proc.poll() is not None,
               what="the ranks' checkpoint")
    if proc.poll() is None:  # the launcher leaves with os._exit (gputrain.cli.entry): it may be gone already
        os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 130, _log(run_dir)[-2000:]
    verify_checkpoint(_checkpoint_named(run_dir, signal.SIGTERM))
    assert "Traceback" not in _log(run_dir)
