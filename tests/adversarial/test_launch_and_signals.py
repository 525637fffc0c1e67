"""Launch and start (issue 34, class 7), tried as a careless user and a busy machine would:

* every rank reaches each collective of a timed loop equally often: rank 0 decides how many warm-up
  calls and repeats fit its time budget and broadcasts the count (before, a rank whose clock ran
  differently ran more all-reduces, then met its peer's 4-byte one: gloo aborted);
* a signal at any stage of the start-up (from the first instruction of the entry point) ends with
  one line and exit 130, as later, and with summary.json where a run directory is written;
* a rendezvous endpoint that cannot be used (a name that does not resolve, a closed port, no port)
  is one line naming it and what to check, exit 2, within a bounded wait, before torchrun starts.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gputrain import interrupts
from gputrain.bench.timing import SLOW_RANK_ENV, measure
from gputrain.distributed.context import agreed_count
from tests.conftest import ROOT
from tests.dist.harness import run_ranks


# ----------------------------------------------------------------------------- collectives in timed loops
def _allreduce_bench_counted(rank: int, slow_rank: int) -> tuple[int, float]:
    """On one rank of a real gloo job: the all-reduce benchmark at its CPU quick settings (a time
    budget, a warm-up of at least 0.75 s), with `slow_rank`'s clock running 1000× fast; returns how
    many all-reduces this rank ran and its figure (the slowest rank's, the same on every rank)."""
    import torch.distributed as dist

    from gputrain.bench.comms import bench_allreduce
    from gputrain.bench.result import settings_for

    os.environ[SLOW_RANK_ENV] = str(slow_rank)
    dist.init_process_group("gloo")
    calls = 0
    real = dist.all_reduce

    def counted(*args: object, **kwargs: object) -> object:
        nonlocal calls
        calls += 1
        return real(*args, **kwargs)  # type: ignore[arg-type]

    dist.all_reduce = counted  # type: ignore[assignment]
    result = bench_allreduce(torch.device("cpu"), settings_for("cpu", quick=True))
    assert result is not None
    return calls, result.value


@pytest.mark.slow
@pytest.mark.parametrize("slow_rank", [1, 0], ids=["rank-1-slow", "rank-0-slow"])
def test_every_rank_runs_rank_0s_count_of_timed_all_reduces(slow_rank: int) -> None:
    """Rank `slow_rank` would end its warm-up after one call and fit the fewest repeats; its peer
    warms up for 0.75 s and fits more. With rank 0's counts broadcast, both run the same number."""
    (calls_0, figure_0), (calls_1, figure_1) = run_ranks(_allreduce_bench_counted, slow_rank, timeout_s=240)
    assert calls_0 == calls_1, (calls_0, calls_1)
    assert figure_0 == figure_1 > 0


# a clock that advances 1 s per reading, and agreements that override what the clock decides
_AGREED = [
    (None, 3, 4),  # no group: the local decisions (warm-up: 1 call, then min_warmup_s of 2 readings; repeats 4)
    ("warmup-longer", 6, 4),  # rank 0 wanted 6 warm-up calls
    ("repeats-more", 3, 9),  # rank 0 fitted 9 repeats
]


@pytest.mark.parametrize(("agreed", "warmup_calls", "repeats"), _AGREED, ids=["local", "warmup", "repeats"])
def test_measure_runs_the_agreed_counts(agreed: str | None, warmup_calls: int, repeats: int) -> None:
    ticks = iter(range(10_000))
    decisions: list[int] = []

    def agree(local: int) -> int:
        decisions.append(local)
        if agreed == "warmup-longer" and len(decisions) <= 6:
            return 1  # go on warming up, whatever this clock says
        if agreed == "repeats-more" and local > 1:
            return 9
        return local

    timing = measure(
        lambda: None,
        warmup=1,
        repeats=4,
        min_repeats=1,
        budget_s=100,
        min_warmup_s=2.5,
        clock=lambda: float(next(ticks)),
        agree=agree if agreed else None,
    )
    assert (timing.warmup, timing.repeats) == (warmup_calls, repeats)


def test_agreed_count_outside_a_job_is_the_local_count() -> None:
    assert agreed_count(7, torch.device("cpu")) == 7


@pytest.mark.slow
def test_torchrun_bench_quick_on_two_ranks_completes_with_one_rank_slow(tmp_path: Path) -> None:
    """The command of the report: `torchrun --nproc-per-node 2 -m gputrain bench --quick`, rank 1's
    clock 1000× fast; before, gloo aborted (`op.preamble.length <= op.nbytes`)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), SLOW_RANK_ENV: "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            "-m",
            "gputrain",
            "bench",
            "--quick",
            "--json",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (figure,) = json.loads(result.stdout)["results"]
    assert figure["bench"] == "allreduce_busbw" and figure["value"] > 0


# ----------------------------------------------------------------------------- a signal at each stage of the start
# The process signals itself at a named point of the start-up (a function wrapped, or the import of a
# module), so each case lands where it says, however loaded the machine: no timing decides the stage.
_STAGED = r"""
import importlib, os, signal, sys

stage, sig, way = sys.argv[1], getattr(signal, sys.argv[2]), sys.argv[3]
sys.argv = [sys.argv[0], *sys.argv[4:]]
fire = lambda: os.kill(os.getpid(), sig)  # the handler runs at once, in this (the main) thread

class SignalOnImport:
    def __init__(self, name): self.name = name
    def find_spec(self, name, path=None, target=None):
        if name == self.name:
            fire()
        return None

def signal_on_call(module, attr, after=False):
    owner = importlib.import_module(module)
    if "." in attr:  # Class.method
        owner, attr = getattr(owner, attr.split(".")[0]), attr.split(".")[1]
    real = getattr(owner, attr)
    def wrapped(*args, **kwargs):
        if not after:
            fire()
        out = real(*args, **kwargs)
        if after:
            fire()
        return out
    setattr(owner, attr, staticmethod(wrapped) if isinstance(owner, type) else wrapped)

kind, _, where = stage.partition(":")
if kind == "import":
    sys.meta_path.insert(0, SignalOnImport(where))
elif kind in ("call", "after"):
    signal_on_call(*where.split("|"), after=kind == "after")
if way == "module":  # python -m gputrain
    import runpy
    runpy.run_module("gputrain", run_name="__main__", alter_sys=True)
else:  # the console script: gputrain = gputrain.cli:entry
    from gputrain.cli import entry
    entry()
print("went on")
"""

_TRAIN = [
    "train",
    "--run-dir",
    "r",
    "model.name=mlp",
    "model.hidden_sizes=[8]",
    "train.epochs=1",
    "log.progress=none",
    "log.tensorboard=false",
]
_RL = ["rl", "--run-dir", "r", "rl.total_timesteps=1024", "log.progress=none", "log.tensorboard=false"]

# (stage, command line): `after:` signals right after the call returns, `call:` as it begins, `import:`
# when the module's import starts
_STAGES = [
    ("after:gputrain.interrupts|guard_the_start", _TRAIN),  # the first instruction: the handler just armed
    ("import:gputrain.cli", _TRAIN),  # python -m gputrain: before the CLI's own module loads
    ("call:gputrain.cli|_command_parser", _TRAIN),  # parsing the command line
    ("import:gputrain.cli.train", _TRAIN),  # importing the command's module
    ("call:gputrain.config|load_config", _TRAIN),  # loading the config
    ("call:gputrain.run.files|check_run_dir", _TRAIN),  # checking the run directory
    ("import:torch", _TRAIN),  # the heavy imports
    ("import:gputrain.train.trainer", _TRAIN),
    ("call:gputrain.run.record|recording_start_up", _TRAIN),  # building the data and the model
    ("import:torch", _RL),
    ("call:gputrain.config|load_config", _RL),
    ("after:gputrain.interrupts|guard_the_start", ["doctor"]),  # a command that starts no run
    ("import:gputrain.cli.report", ["report", "r"]),
    ("after:gputrain.interrupts|guard_the_start", ["nonsense"]),  # not a command: named as typed
    ("after:gputrain.interrupts|guard_the_start", []),
    ("call:gputrain.distributed.launch|launch", ["train", "--nproc-per-node", "2", *_TRAIN[1:]]),  # the launcher
]


def _staged(tmp_path: Path, stage: str, sig: str, way: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")}
    return subprocess.run(
        [sys.executable, "-c", _STAGED, stage, sig, way, *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "PYTHONPATH": str(ROOT)},
    )


def _expected(argv: list[str], sig: str) -> str:
    from gputrain.interrupts import starting_message

    command = argv[0] if argv and re.fullmatch("[a-z][a-z-]*", argv[0]) else ""
    return starting_message(command, getattr(signal, sig)) + "\n"


# every stage by both ways in: `python -m gputrain`, and the console script (which has imported
# gputrain.cli before its first instruction runs)
_CASES = [
    (s, a, way) for s, a in _STAGES for way in ("module", "console") if (s, way) != ("import:gputrain.cli", "console")
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stage", "argv", "way"), _CASES, ids=[f"{a[0] if a else 'none'}-{s}-{w}" for s, a, w in _CASES]
)
def test_sigterm_at_each_stage_of_the_start_is_one_line_and_130(
    tmp_path: Path, stage: str, argv: list[str], way: str
) -> None:
    result = _staged(tmp_path, stage, "SIGTERM", way, argv)
    assert (result.returncode, result.stderr, result.stdout) == (130, _expected(argv, "SIGTERM"), "")
    assert not (tmp_path / "r").exists()  # nothing written before the run arms its own handler: nothing to record


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGINT", "SIGHUP", "SIGUSR1"])
@pytest.mark.parametrize("stage", ["after:gputrain.interrupts|guard_the_start", "import:torch"])
def test_every_signal_a_run_stops_for_is_one_line_and_130_while_starting(tmp_path: Path, stage: str, sig: str) -> None:
    result = _staged(tmp_path, stage, sig, "module", _TRAIN)
    assert (result.returncode, result.stderr, result.stdout) == (130, _expected(_TRAIN, sig), "")


@pytest.mark.slow
def test_the_other_ranks_stop_silently_from_the_first_instruction(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": "1", "WORLD_SIZE": "2"}
    result = subprocess.run(
        [sys.executable, "-c", _STAGED, "after:gputrain.interrupts|guard_the_start", "SIGTERM", "module", *_TRAIN],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert (result.returncode, result.stderr, result.stdout) == (130, "", "")


@pytest.mark.slow
def test_a_command_that_starts_no_run_meets_sigint_in_its_own_code_as_before(tmp_path: Path) -> None:
    """The guard ends where such a command's code begins: Ctrl-C there is Python's KeyboardInterrupt,
    which lets the command clean up and say `interrupted` (exit 130), as it always did."""
    result = _staged(tmp_path, "call:gputrain.cli.doctor|run", "SIGINT", "module", ["doctor"])
    assert (result.returncode, result.stderr) == (130, "gputrain doctor: interrupted\n")


def _python_handlers() -> dict[int, object]:
    return {sig: signal.getsignal(sig) for sig in interrupts.HANDLED}


@pytest.mark.parametrize("command", ["train", "doctor"])
def test_the_start_guard_gives_pythons_handlers_back_where_the_start_ends(handlers: None, command: str) -> None:
    """In process: a run's start ends where its own start-up guard ends (`startup_signals`), another
    command's where its code begins (`end_of_the_start`); a signal after that is not 'while starting'."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    before = _python_handlers()
    interrupts.guard_the_start(command)
    assert all(interrupts.is_startup_handler(handler) for handler in _python_handlers().values())
    if command in interrupts.RUN_COMMANDS:
        with interrupts.startup_signals(command):
            assert all(interrupts.is_startup_handler(handler) for handler in _python_handlers().values())
    else:
        interrupts.end_of_the_start()
    assert _python_handlers() == before
