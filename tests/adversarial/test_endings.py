"""Whatever ends it (issue 35): every command meets every signal, and a closed stdout, as promised.

* a command that starts no run (predict, report, export, evaluate, bench-infer, generate, plan,
  prepare, lr-find), stopped in its own code by SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, SIGALRM or
  SIGQUIT: exit 130, one line naming the signal, no traceback, and no temporary left (an output's
  `.NAME.tmp-…`, a benchmark's private folder). The signal is real: the process sends it to itself at a
  known point of its own code, where a temporary exists (the first atomic rename, a benchmark's mode
  being prepared in its folder, a prediction row being written), never after a delay;
* a run (train) stopped by SIGHUP, SIGUSR2 or SIGALRM: a checkpoint, summary.json `interrupted`
  naming the signal, exit 130; by SIGQUIT: every thread's stack, summary.json naming it, exit 130 at
  once; GPUTRAIN_ON_SIGHUP=ignore keeps it going through a SIGHUP;
* stdout a pipe whose reader has gone (`… | head -1`): the command ends quietly with 141, as a
  coreutils tool does, no BrokenPipeError, nothing from the interpreter's exit;
* the launcher's verdict on planted error logs (a rank killed, one exited outright, one that raised,
  one on another node named or not, rank 0 dead): one line naming the rank that died, in summary.json
  too (the real 2-rank jobs are tests/dist/test_rank_died.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from gputrain.interrupts import SIGHUP_ENV
from gputrain.pipes import STDOUT_CLOSED_EXIT
from tests.adversarial.helpers import read_summary
from tests.unit.reliability.chaos import TINY, logged_step, start_train
from tests.unit.use.conftest import tiny_runs
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]

# `python -m gputrain ARGS` that sends itself SIGNAL once, at STAGE:
#   call:MODULE|FUNCTION   as the function is called (its module's attribute: later look-ups see the wrap)
#   after:MODULE|FUNCTION  as it returns
#   (bench-infer's `_prepare` runs inside its private TemporaryDirectory)
#   replace                as the first Path.replace begins: an atomic write's temporary is there, whole
_STAGED = r"""
import importlib, os, pathlib, runpy, signal, sys

stage, sig = sys.argv[1], getattr(signal, sys.argv[2])
sys.argv = ["gputrain", *sys.argv[3:]]
fired = []

def fire():
    if not fired:
        fired.append(True)
        os.kill(os.getpid(), sig)  # the handler runs at once, in this (the main) thread

def wrap(owner, attr, after):
    real = getattr(owner, attr)
    def wrapped(*args, **kwargs):
        if not after:
            fire()
        out = real(*args, **kwargs)
        if after:
            fire()
        return out
    setattr(owner, attr, wrapped)

kind, _, where = stage.partition(":")
if kind == "replace":
    wrap(pathlib.Path, "replace", after=False)
else:
    module, attr = where.split("|")
    wrap(importlib.import_module(module), attr, after=kind == "after")
runpy.run_module("gputrain", run_name="__main__", alter_sys=True)
print("went on")
"""

SIGNALS = ["SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGQUIT"]


@dataclass(frozen=True)
class World:
    root: Path
    csv_run: Path
    lm_run: Path
    table: Path
    corpus: Path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    root = tmp_path_factory.mktemp("endings")
    get = tiny_runs(root)
    corpus = root / "corpus.txt"
    words = ["alpha", "beta", "gamma", "delta", "eps"]
    corpus.write_text("\n".join(" ".join(words[(i * 7 + j) % 5] for j in range(12)) for i in range(400)) + "\n")
    return World(root, get("csv_mlp"), get("text_gpt"), root / "data" / "table.csv", corpus)


# command -> (stage where a temporary exists, argv given the world and an output folder)
Argv = Callable[[World, Path], list[str]]
_COMMANDS: dict[str, tuple[str, Argv]] = {
    "predict": (
        "call:gputrain.use.predict|_cells",
        lambda w, o: ["predict", str(w.csv_run), str(w.table), "-o", str(o / "pred.csv")],
    ),
    "report": ("replace", lambda w, o: ["report", str(w.csv_run), "-o", str(o / "page.html")]),
    "export": (
        "replace",
        lambda w, o: ["export", str(w.csv_run), "--format", "safetensors", "-o", str(o / "exported")],
    ),
    "evaluate": ("replace", lambda w, o: ["evaluate", str(w.csv_run), "--output-dir", str(o / "eval")]),
    "bench-infer": (
        "call:gputrain.use.bench|_prepare",
        lambda w, o: ["bench-infer", str(w.csv_run), "--modes", "eager", "--repeats", "1"],
    ),
    "generate": (
        "call:gputrain.cli.generate|run",
        lambda w, o: ["generate", str(w.lm_run), "--prompt", "ab", "--max-new-tokens", "4"],
    ),
    "plan": ("call:gputrain.cli.plan|run", lambda w, o: ["plan", "model.name=mlp"]),
    "lr-find": (
        "replace",
        lambda w, o: [
            "lr-find",
            "--run-dir",
            str(o / "sweep"),
            "--steps",
            "6",
            "model.name=mlp",
            "model.hidden_sizes=[8]",
            "train.device=cpu",
            "log.progress=none",
            "log.tensorboard=false",
        ],
    ),
    "prepare": (
        "replace",
        lambda w, o: ["prepare", "--out", str(o / "prepared"), str(w.corpus), "--train-tokenizer", "300", "--quiet"],
    ),
}
# predict (the case) meets every signal; the others the ones a user or a scheduler sends most
_CASES = [("predict", sig) for sig in SIGNALS] + [
    (command, sig) for command in _COMMANDS if command != "predict" for sig in ("SIGTERM", "SIGHUP", "SIGQUIT")
]


def _temporaries(*folders: Path) -> list[Path]:
    """What an interrupted write may leave: a `.NAME.tmp-…` beside an output, a private folder in TMPDIR."""
    found = []
    for folder in folders:
        for path in folder.rglob("*"):
            if ".tmp" in path.name or path.name.startswith(("gputrain-", ".bench-")):
                found.append(path)
    return found


def _gputrain(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")}
    return subprocess.run(
        args, cwd=cwd, text=True, timeout=300, env={**clean, "PYTHONPATH": str(ROOT), **(env or {})}, **kwargs
    )  # type: ignore[call-overload]


@pytest.mark.slow
@pytest.mark.parametrize(("command", "sig"), _CASES, ids=[f"{c}-{s}" for c, s in _CASES])
def test_a_quick_command_stopped_by_a_signal_is_one_line_130_and_leaves_no_temporary(
    world: World, tmp_path: Path, command: str, sig: str
) -> None:
    stage, argv = _COMMANDS[command]
    out, tmpdir = tmp_path / "out", tmp_path / "tmpdir"
    out.mkdir()
    tmpdir.mkdir()
    before = sorted(p.name for p in world.csv_run.rglob("*"))
    result = _gputrain(
        [sys.executable, "-c", _STAGED, stage, sig, *argv(world, out)],
        tmp_path,
        env={"TMPDIR": str(tmpdir)},
        capture_output=True,
    )
    said = "interrupted" if sig == "SIGINT" else f"stopped by {sig}"
    # prepare's work is resumable: its line says where it continues
    said += (
        f"; run the same command again to continue into {out / 'prepared'}"
        if command == "prepare"
        else ("" if sig == "SIGINT" else " (run the command again)")
    )
    assert result.returncode == 130, result.stderr[-2000:]
    assert result.stderr.splitlines()[-1] == f"gputrain {command}: {said}", result.stderr[-2000:]
    assert "went on" not in result.stdout
    if sig == "SIGQUIT":  # Ctrl-\: where it was, every thread's stack (faulthandler's), then the line
        assert "most recent call first" in result.stderr
    else:
        assert "Traceback" not in result.stderr and 'File "' not in result.stderr, result.stderr[-2000:]
    assert _temporaries(out, tmpdir, world.csv_run) == []
    assert sorted(p.name for p in world.csv_run.rglob("*")) == before  # the run read is as it was


# ----------------------------------------------------------------------------- a closed stdout
_PRINTING: dict[str, Argv] = {
    "predict": lambda w, o: ["predict", str(w.csv_run), str(w.table)],
    "generate": lambda w, o: ["generate", str(w.lm_run), "--prompt", "ab", "--max-new-tokens", "8"],
    "report": lambda w, o: ["report", str(w.csv_run), "-o", "-"],
    "plan": lambda w, o: ["plan", "model.name=mlp"],
    "doctor": lambda w, o: ["doctor"],
    "config": lambda w, o: ["config", "show"],
    "evaluate": lambda w, o: ["evaluate", str(w.csv_run), "--output-dir", str(o / "eval")],
    "bench-infer": lambda w, o: ["bench-infer", str(w.csv_run), "--modes", "eager", "--repeats", "1"],
}


@pytest.mark.slow
@pytest.mark.parametrize("command", list(_PRINTING))
def test_a_closed_stdout_ends_the_command_quietly(world: World, tmp_path: Path, command: str) -> None:
    """stdout is a real pipe whose reading end is closed before the command writes its first byte
    (what `| head -1` leaves once head has its line): every write meets EPIPE."""
    read, write = os.pipe()
    os.close(read)
    try:
        result = _gputrain(
            [sys.executable, "-m", "gputrain", *_PRINTING[command](world, tmp_path)],
            tmp_path,
            stdout=write,
            stderr=subprocess.PIPE,
        )
    finally:
        os.close(write)
    assert result.returncode == STDOUT_CLOSED_EXIT, result.stderr[-2000:]
    for noise in ("Traceback", "BrokenPipe", "Exception ignored", "Errno 32"):
        assert noise not in result.stderr, result.stderr[-2000:]


@pytest.mark.slow
def test_under_head_the_first_line_comes_and_the_rest_ends_quietly(world: World, tmp_path: Path) -> None:
    """The issue's own command line: `gputrain predict RUN big.csv | head -1`, in a real shell."""
    big = tmp_path / "big.csv"
    lines = world.table.read_text().splitlines()
    big.write_text("\n".join([lines[0], *lines[1:] * 60]) + "\n")  # 14,400 rows: more than a pipe holds
    script = f'{sys.executable} -m gputrain predict {world.csv_run} {big} | head -1; echo "${{PIPESTATUS[0]}}"'
    result = _gputrain(["bash", "-c", script], tmp_path, capture_output=True)
    first, status = result.stdout.splitlines()
    assert first.startswith("input,predicted") and status == str(STDOUT_CLOSED_EXIT), result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, result.stderr[-2000:]


# ----------------------------------------------------------------------------- a run
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGUSR2, signal.SIGALRM], ids=lambda s: s.name)
def test_a_run_stopped_by_another_signal_checkpoints_and_records_it(tmp_path: Path, sig: signal.Signals) -> None:
    run_dir = tmp_path / "run"
    proc = start_train(run_dir, TINY)
    wait_until(lambda: logged_step(run_dir) >= 3 or proc.poll() is not None, what="step 3")
    proc.send_signal(sig)
    assert proc.wait(timeout=120) == 130, run_dir.with_suffix(".log").read_text()[-2000:]
    summary = read_summary(run_dir)
    assert (summary["status"], summary["signal"]) == ("interrupted", sig.name)
    assert (run_dir / "checkpoints" / f"step-{summary['global_step']}").is_dir()
    log = run_dir.with_suffix(".log").read_text()
    assert f"stopped by {sig.name} at step {summary['global_step']}; checkpoint saved" in log
    assert "Traceback" not in log


@pytest.mark.slow
def test_sigquit_dumps_the_stacks_and_records_the_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = start_train(run_dir, TINY)
    wait_until(lambda: logged_step(run_dir) >= 3 or proc.poll() is not None, what="step 3")
    proc.send_signal(signal.SIGQUIT)
    assert proc.wait(timeout=120) == 130  # not 131 and a core dump
    summary = read_summary(run_dir)
    assert (summary["status"], summary["signal"]) == ("interrupted", "SIGQUIT")
    log = run_dir.with_suffix(".log").read_text()
    assert "most recent call first" in log  # faulthandler's dump: where it was
    assert log.splitlines()[-1].startswith("gputrain train: stopped by SIGQUIT at once")
    assert not list((run_dir / "checkpoints").glob(".step-*"))  # a save it cut short left nothing


@pytest.mark.slow
def test_sighup_is_ignored_where_the_user_asks(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = start_train(run_dir, [*TINY, "train.max_steps=12"], env={SIGHUP_ENV: "ignore"})
    wait_until(lambda: logged_step(run_dir) >= 3 or proc.poll() is not None, what="step 3")
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(timeout=120) == 0, run_dir.with_suffix(".log").read_text()[-2000:]
    assert read_summary(run_dir)["status"] == "completed"


@pytest.mark.parametrize("value", ["", "Stop", "nohup", "ignore "])
def test_a_bad_sighup_choice_is_one_line_and_exit_2(tmp_path: Path, value: str) -> None:
    result = _gputrain(
        [sys.executable, "-m", "gputrain", "config", "show"], tmp_path, env={SIGHUP_ENV: value}, capture_output=True
    )
    assert result.returncode == 2
    assert result.stderr == (f"gputrain config: {SIGHUP_ENV}={value!r}: choose stop or ignore (stop is the default)\n")


# ----------------------------------------------------------------------------- the launcher's verdict
_GLOO = "RuntimeError: [gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:54948: Connection reset by peer."
# (failures: rank -> exit code, error logs: rank -> last line, several nodes, expected line)
_VERDICTS = [
    (
        {0: 1, 1: -9},
        {0: _GLOO},
        False,
        "rank 1 failed first: it was killed by SIGKILL after step 7 (no message: a signal ends a process at once); "
        "ranks [0] stopped too: their collectives with it broke (Connection reset by peer)",
    ),
    (
        {0: 1, 1: 17},
        {0: _GLOO},
        False,
        "rank 1 failed first: it exited with code 17 after step 7 (no message: it exited without an error of its own); "
        "ranks [0] stopped too: their collectives with it broke (Connection reset by peer)",
    ),
    (
        {0: 1, 1: 1},
        {1: "RuntimeError: test fault injected at forward 3", 0: _GLOO},
        False,
        "rank 1 failed first: it exited with code 1 after step 7 (its message is above); ranks [0] stopped too: "
        "their collectives with it broke (Connection reset by peer)",
    ),
    (
        {0: 1},
        {0: _GLOO, 1: "RankDied: rank 1 was killed by SIGKILL (said by its launcher, pid 1: …)"},
        True,
        "rank 1 (on another node) failed first: it was killed by SIGKILL after step 7; ranks [0] here stopped too: "
        "their collectives with it broke (Connection reset by peer)",
    ),
    (
        {0: 1},
        {0: _GLOO},
        True,
        "ranks [0] stopped after step 7: their collectives broke (Connection reset by peer); a rank on another node "
        "failed first (that node's launcher names it)",
    ),
]


@pytest.mark.parametrize(
    ("failures", "logs", "several_nodes", "expected"),
    _VERDICTS,
    ids=["killed", "exited-outright", "raised", "other-node-named", "other-node-unnamed"],
)
def test_the_launchers_line_names_the_rank_that_died(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    failures: dict[int, int],
    logs: dict[int, str],
    several_nodes: bool,
    expected: str,
) -> None:
    from gputrain.distributed import launch, rank_failure
    from gputrain.run.layout import error_log_name

    monkeypatch.setattr(rank_failure, "OTHER_NODE_WAIT_S", 0.0)  # no other node's launcher will write
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text('{"status": "failed", "global_step": 7, "error": "' + "x" + '"}')
    for rank, line in logs.items():
        (run_dir / error_log_name(rank)).write_text(f"Traceback (most recent call last):\n  ...\n{line}\n")
    seen = {rank: (code, 100.0) for rank, code in failures.items()}
    echoes = frozenset(rank_failure.collective_errors(logs))
    first = launch.culprit(seen, launch.first_failed_rank(run_dir, 0.0), echoes)
    verdict = rank_failure.judge(failures, first, run_dir, 0.0, several_nodes)
    assert verdict.line == expected
    rank_failure.record_failure(run_dir, 0.0, verdict.line, verdict.rank, verdict.how, 2)
    summary = read_summary(run_dir)
    assert (summary["error"], summary["failed_rank"]) == (expected, verdict.rank)


def test_where_rank_0_died_the_launcher_writes_summary_json(tmp_path: Path) -> None:
    from gputrain.distributed import rank_failure

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.9}\n{"step": 3, "lo')
    (run_dir / "error-rank1.log").write_text(f"Traceback (most recent call last):\n{_GLOO}\n")
    verdict = rank_failure.judge({0: -9, 1: 1}, 0, run_dir, 0.0, several_nodes=False)
    rank_failure.record_failure(run_dir, 0.0, verdict.line, verdict.rank, verdict.how, 2)
    summary = read_summary(run_dir)
    assert (summary["status"], summary["global_step"], summary["failed_rank"], summary["failed_how"]) == (
        "failed",
        2,
        0,
        "SIGKILL",
    )  # the last whole row's step; the torn one is skipped
    assert summary["error"].startswith("rank 0 failed first: it was killed by SIGKILL after step 2 ")
    assert (run_dir / "error.log").read_text().startswith("RankDied: rank 0 was killed by SIGKILL")
