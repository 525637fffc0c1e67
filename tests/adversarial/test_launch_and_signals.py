"""Launch and start (issue 34, class 7), tried as a careless user and a busy machine would:

* every rank reaches each collective of a timed loop equally often: rank 0 decides how many warm-up
  calls and repeats fit its time budget and broadcasts the count (before, a rank whose clock ran
  differently ran more all-reduces, then met its peer's 4-byte one: gloo aborted);
* a signal at any stage of the start-up (from the first instruction of the entry point) ends with
  one line and exit 130, as later (summary.json once the run has written into its directory:
  test_start_and_launch.py); a command that starts no run says so in its own code too (Ctrl-C stays
  Python's there); SIGHUP stays ignored under nohup;
* a rendezvous endpoint that cannot be used (a name that does not resolve, a lookup that hangs, a
  closed port, a port in use, no port, a port out of range) is one line naming it and what to
  check, exit 2, within --rdzv-timeout, before torchrun starts; so are the launch options.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gputrain import interrupts
from gputrain.bench.timing import SLOW_RANK_ENV, measure
from gputrain.distributed.context import agreed_count
from tests.conftest import ROOT, run_cli
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
if os.environ.get("AS_NOHUP"):
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # what nohup leaves its command
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


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGUSR1"])
def test_a_command_that_starts_no_run_stopped_in_its_own_code_is_one_line_and_130(tmp_path: Path, sig: str) -> None:
    result = _staged(tmp_path, "call:gputrain.cli.doctor|run", sig, "module", ["doctor"])
    assert (result.returncode, result.stderr) == (130, f"gputrain doctor: stopped by {sig} (run the command again)\n")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stage", "argv", "out"),
    [
        ("after:gputrain.interrupts|guard_the_start", ["--version"], "gputrain 0.1.0\n"),
        ("call:gputrain.cli.doctor|run", ["doctor"], None),
        ("import:torch", [*_TRAIN, "train.max_steps=2"], None),
    ],
    ids=["entry", "doctor", "train"],
)
def test_under_nohup_sighup_stays_ignored(tmp_path: Path, stage: str, argv: list[str], out: str | None) -> None:
    """nohup ignores SIGHUP so that the command outlives its terminal: neither the start-up guard, nor
    a command's, nor the run's handler takes it back."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")}
    result = subprocess.run(
        [sys.executable, "-c", _STAGED, stage, "SIGHUP", "module", *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "PYTHONPATH": str(ROOT), "AS_NOHUP": "1"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "SIGHUP" not in result.stderr and (out is None or result.stdout == out)


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
        assert _python_handlers() == before
    else:
        interrupts.end_of_the_start()  # Ctrl-C is Python's again; the others: one line and 130 (not 128+N)
        assert _python_handlers() == {
            sig: before[sig] if sig == signal.SIGINT else interrupts._stop_command for sig in before
        }


# ----------------------------------------------------------------------------- the rendezvous endpoint
_FORM = "give HOST:PORT (node 0's address and a free port, the same on every node, e.g. node0.cluster:29500)"

_MALFORMED = [
    ("", "it is empty"),
    ("   ", "it is empty"),
    ("node0", "no port"),
    ("node0:", "no port"),
    (":29500", "no host"),
    ("node0:99999", "the port must be a number in 1..65535"),
    ("node0:65536", "the port must be a number in 1..65535"),
    ("node0:0", "the port must be a number in 1..65535"),
    ("node0:-1", "the port must be a number in 1..65535"),
    ("node0:http", "the port must be a number in 1..65535"),
    ("node0:２９５００", "the port must be a number in 1..65535"),  # full-width digits: isdigit() says yes
    ("node0:29500:1", "more than one ':' (an IPv6 address goes in brackets: [ADDRESS]:PORT)"),
    ("[::1]", "no port"),
    ("::1:29500", "more than one ':' (an IPv6 address goes in brackets: [ADDRESS]:PORT)"),
    ("node 0:29500", "the host holds spaces or control characters"),
    ("node0\n:29500", "the host holds spaces or control characters"),
]


@pytest.mark.parametrize(("text", "why"), _MALFORMED, ids=[repr(t) for t, _ in _MALFORMED])
def test_a_malformed_endpoint_is_refused_naming_it(text: str, why: str) -> None:
    from gputrain.distributed.endpoint import parse_endpoint
    from gputrain.errors import UsageError

    with pytest.raises(UsageError) as err:
        parse_endpoint(text)
    assert str(err.value) == f"--rdzv-endpoint {text!r}: {why}; {_FORM}"


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [("node0:29500", "node0", 29500), ("[::1]:1", "::1", 1), (" 10.0.0.1:65535 ", "10.0.0.1", 65535)],
)
def test_a_wellformed_endpoint_is_taken(text: str, host: str, port: int) -> None:
    from gputrain.distributed.endpoint import parse_endpoint

    assert (parse_endpoint(text).host, parse_endpoint(text).port) == (host, port)


def _closed_port() -> int:
    """A local port nothing listens on: bound (so no other process takes it meanwhile), never listening."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _check(text: str, node_rank: int = 1, wait_s: float = 0.5) -> str:
    from gputrain.distributed.endpoint import RendezvousFailed, check_rendezvous

    with pytest.raises(RendezvousFailed) as err:
        check_rendezvous(text, node_rank=node_rank, wait_s=wait_s)
    return str(err.value)


@pytest.mark.parametrize("node_rank", [0, 1])
def test_a_host_that_does_not_resolve_is_one_line(node_rank: int) -> None:
    """RFC 6761: a name under .invalid never resolves."""
    assert _check("node0.invalid:29500", node_rank) == (
        "--rdzv-endpoint node0.invalid:29500: the host name 'node0.invalid' does not resolve (check the DNS name: "
        "node 0's address as every node can reach it)"
    )


def test_a_closed_port_of_node_0_is_one_line_after_the_wait() -> None:
    port = _closed_port()
    assert _check(f"127.0.0.1:{port}", node_rank=1, wait_s=0.5) == (
        f"--rdzv-endpoint 127.0.0.1:{port}: nothing answered there within 0.5 s (check that node 0 has started with "
        "this endpoint, the port, and that no firewall blocks it; --rdzv-timeout S waits longer)"
    )


def test_a_port_in_use_on_the_node_that_hosts_the_rendezvous_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert _check(f"localhost:{port}", node_rank=0) == (
            f"--rdzv-endpoint localhost:{port}: port {port} on this machine is in use by another process (choose a "
            "free port, the same on every node)"
        )


def test_node_0s_endpoint_that_answers_passes() -> None:
    from gputrain.distributed.endpoint import check_rendezvous

    with socket.socket() as node_0:
        node_0.bind(("127.0.0.1", 0))
        node_0.listen()
        port = node_0.getsockname()[1]
        assert check_rendezvous(f"127.0.0.1:{port}", node_rank=1, wait_s=5).port == port


def test_a_name_lookup_that_hangs_ends_at_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unanswering DNS server: the lookup is left behind after --rdzv-timeout (released at the end)."""
    import threading

    release = threading.Event()
    real = socket.getaddrinfo

    def hanging(host: str, *args: object, **kwargs: object) -> object:
        if host == "slow.example":
            release.wait(timeout=30)  # bounded, so that a lookup waited for in full fails this test, not hangs it
        return real(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", hanging)
    try:
        assert _check("slow.example:29500", wait_s=0.2) == (
            "--rdzv-endpoint slow.example:29500: looking up 'slow.example' took over 0.2 s (check the DNS name and "
            "this machine's DNS servers; --rdzv-timeout S waits longer)"
        )
    finally:
        release.set()


@pytest.mark.parametrize("seconds", ["0", "-1", "nan", "inf"])
def test_a_wait_that_is_no_number_of_seconds_is_refused(tmp_path: Path, seconds: str) -> None:
    result = run_cli(
        "train",
        "--nproc-per-node",
        "1",
        "--rdzv-endpoint",
        "localhost:29500",
        "--rdzv-timeout",
        seconds,
        "--run-dir",
        str(tmp_path / "r"),
        cwd=tmp_path,
        timeout=120,
    )
    assert (result.returncode, result.stderr) == (
        2,
        f"gputrain train: --rdzv-timeout must be a number of seconds > 0, not {float(seconds)}\n",
    )


# every launching command, by the launcher: one line, exit 2, no rank started, no directory written
_LAUNCHES = [
    (["--rdzv-endpoint", "node0.invalid:29500"], "the host name 'node0.invalid' does not resolve"),
    (["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "node0.invalid:29500"], "does not resolve"),
    (["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "127.0.0.1:{closed}"], "nothing answered there"),
    (["--rdzv-endpoint", "node0:99999"], "the port must be a number in 1..65535"),
    (["--rdzv-endpoint", "node0"], "no port"),
    (["--rdzv-endpoint", ""], "it is empty"),
    (["--nnodes", "2"], "--nnodes > 1 needs --rdzv-endpoint host:port"),  # was said by no one: exit 2 in silence
    (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "node0:1"], "--node-rank must be in 0..1, not 2"),
]
_COMMANDS = ["train", "rl", "profile", "lr-find"]


@pytest.mark.slow
@pytest.mark.parametrize("command", _COMMANDS)
@pytest.mark.parametrize(("options", "words"), _LAUNCHES, ids=[" ".join(o) or "empty" for o, _ in _LAUNCHES])
def test_a_launch_that_cannot_meet_is_one_line_and_exit_2(
    tmp_path: Path, command: str, options: list[str], words: str
) -> None:
    options = [o.replace("{closed}", str(_closed_port())) for o in options]
    result = run_cli(
        command,
        "--nproc-per-node",
        "1",
        *options,
        "--rdzv-timeout",
        "1",
        "--run-dir",
        str(tmp_path / "r"),
        cwd=tmp_path,
        timeout=120,
    )
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1 and words in lines[0], result.stderr[-3000:]
    assert lines[0].startswith(f"gputrain {command}: --")
    assert not (tmp_path / "r").exists()


def test_a_rendezvous_that_fails_past_the_checks_is_the_launchers_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node 0 answered, then the rendezvous itself failed (a node with another --nnodes never joins):
    torchrun's error, which was a traceback, is one line naming the endpoint; not taken for the ranks'
    refusal of the input, which rank 0 would have printed."""
    import argparse

    import torch.distributed.run as torchrun
    from torch.distributed.elastic.rendezvous.api import RendezvousTimeoutError

    from gputrain.cli.launching import launch_ranks
    from gputrain.distributed.endpoint import RendezvousFailed

    def times_out(_: object) -> None:
        raise RendezvousTimeoutError("The node 'n1' has timed out waiting for other nodes.\nmore detail")

    monkeypatch.setattr(torchrun, "run", times_out)
    with socket.socket() as node_0:
        node_0.bind(("127.0.0.1", 0))
        node_0.listen()
        endpoint = f"127.0.0.1:{node_0.getsockname()[1]}"
        args = argparse.Namespace(
            config=None,
            overrides=[],
            nproc_per_node=1,
            nnodes=2,
            node_rank=1,
            rdzv_endpoint=endpoint,
            rdzv_timeout=5.0,
            max_restarts=0,
        )
        with pytest.raises(RendezvousFailed) as err:
            launch_ranks(args, "train", str(tmp_path / "r"))
    assert not err.value.shown
    assert str(err.value) == (
        f"--rdzv-endpoint {endpoint}: the rendezvous failed: RendezvousTimeoutError: The node 'n1' has timed out "
        "waiting for other nodes. (check that every node started with this endpoint and the same --nnodes)"
    )
