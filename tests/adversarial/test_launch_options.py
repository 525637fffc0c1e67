"""The launch options, mistyped (issue 34, class 7): every command that starts ranks (train, rl,
lr-find, profile) refuses a count that is not a whole number in range as the command line is read
(rl divided its environments by a rank count of 0: a traceback), and more ranks than the node's
memory can start before any process starts (a mistyped --nproc-per-node 1000 started 1,000
interpreters and thrashed the machine). One line naming the option, exit 2, no run directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from gputrain.distributed import launch
from gputrain.distributed.launch import RANK_START_BYTES, LaunchOptions
from gputrain.errors import UsageError
from tests.conftest import run_cli

COMMANDS = {
    "train": ["train", "data.name=synthetic", "model.name=mlp"],
    "rl": ["rl"],
    "lr-find": ["lr-find", "--steps", "6"],
    "profile": ["profile"],
}
BAD = [
    ("--nproc-per-node", "0", "must be at least 1, not 0"),
    ("--nproc-per-node", "-3", "must be at least 1, not -3"),
    ("--nproc-per-node", "two", "'two' is not a whole number"),
    ("--nproc-per-node", "100000", "this node holds at most"),
    ("--nproc-per-node", "1e3", "'1e3' is not a whole number"),
    ("--nnodes", "0", "must be at least 1, not 0"),
    ("--node-rank", "-1", "must be at least 0, not -1"),
]


@pytest.mark.parametrize(("option", "value", "said"), BAD, ids=[f"{o}={v}" for o, v, _ in BAD])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_launch_option_out_of_range_is_one_line_before_anything_starts(
    tmp_path: Path, command: str, option: str, value: str, said: str
) -> None:
    run_dir = tmp_path / "run"
    extra = ["--nproc-per-node", "2"] if option in ("--nnodes", "--node-rank") else []
    result = run_cli(*COMMANDS[command], "--run-dir", str(run_dir), *extra, option, value, cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert any(option in line and said in line for line in lines), lines
    assert len(lines) <= 3, lines
    assert not run_dir.exists()


@pytest.mark.parametrize("command", ["train", "rl"])
def test_max_restarts_below_zero_is_refused(tmp_path: Path, command: str) -> None:
    result = run_cli(*COMMANDS[command], "--nproc-per-node", "2", "--max-restarts", "-1", cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    assert "--max-restarts" in result.stderr and "must be at least 0, not -1" in result.stderr


@pytest.mark.parametrize(("available_mib", "most"), [(1024, 2), (1536, 3), (100, 1), (64 * 1024, 128)])
def test_the_ranks_a_node_holds_follow_its_available_memory(
    monkeypatch: pytest.MonkeyPatch, available_mib: int, most: int
) -> None:
    monkeypatch.setattr(launch, "_available_bytes", lambda: available_mib << 20)
    assert launch.ranks_this_node_holds() == most
    LaunchOptions(nproc_per_node=most).check()  # as many as it holds: taken
    with pytest.raises(UsageError, match=rf"--nproc-per-node {most + 1}: this node holds at most {most} processes"):
        LaunchOptions(nproc_per_node=most + 1).check()


def test_unknown_memory_bounds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "_available_bytes", lambda: 0)
    assert launch.ranks_this_node_holds() is None
    LaunchOptions(nproc_per_node=10_000).check()


def test_this_machine_reads_its_available_memory() -> None:
    assert launch._available_bytes() >= RANK_START_BYTES  # a real read: the build machine has GiBs free
