"""Every rank's peak memory (observe/rank_memory.py) as one process sees it: what it knows without a
gather, what a gather leaves, the loss that rides the gather's all-reduce (bit for bit what the
float32 all-reduce gave), the console's row and summary.json's shape with and without the fields.
Two real ranks: tests/dist/test_rank_memory.py."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from gputrain.observe import rank_memory
from gputrain.observe.console import speed_rows
from gputrain.observe.rank_memory import RankMemory, device_peak_memory_bytes
from gputrain.run.shapes import SUMMARY

ROOT = Path(__file__).resolve().parents[3]

CPU = torch.device("cpu")


def test_one_process_reports_its_own_peak_as_rank_0() -> None:
    memory = RankMemory(CPU)
    assert memory.mean_loss_and_peaks(torch.tensor(0.25), 3) == 0.25
    assert set(memory.row_fields()) == {"peak_memory_bytes"}  # one process: no rank in its rows
    fields = memory.summary_fields(5)
    own = device_peak_memory_bytes(CPU)
    assert fields == {
        "peak_memory_bytes": own,
        "peak_memory_rank": 0,
        "peak_memory_by_rank": [own],
        "peak_memory_by_rank_step": [5],
    }


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_a_rank_never_gathered_is_missing_not_guessed(rank: int) -> None:
    fields = RankMemory(CPU, rank=rank, world_size=3).summary_fields(4)
    assert fields["peak_memory_rank"] == rank
    assert [peak is not None for peak in fields["peak_memory_by_rank"]] == [r == rank for r in range(3)]
    assert fields["peak_memory_by_rank_step"] == [4 if r == rank else None for r in range(3)]


def test_the_last_gather_stands_for_the_others_and_says_when() -> None:
    memory = RankMemory(CPU, rank=0, world_size=3)
    big = 10 * device_peak_memory_bytes(CPU)
    memory._note([1, big, 5], 2)  # what the logging step 2 gathered
    fields = memory.summary_fields(7)
    assert fields["peak_memory_bytes"] == big and fields["peak_memory_rank"] == 1
    assert fields["peak_memory_by_rank"][1:] == [big, 5]
    assert fields["peak_memory_by_rank"][0] == device_peak_memory_bytes(CPU)  # its own, read now
    assert fields["peak_memory_by_rank_step"] == [7, 2, 2]
    assert memory.row_fields() == {"peak_memory_bytes": big, "peak_memory_rank": 1}


def test_a_tie_names_the_lowest_rank() -> None:
    memory = RankMemory(CPU, rank=2, world_size=3)
    memory._note([7, 9, 9], 1)
    assert memory.row_fields() == {"peak_memory_bytes": 9, "peak_memory_rank": 1}


def test_the_loss_riding_the_peaks_is_the_float32_all_reduce_mean(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 of 2, the other rank's loss and peak added in place as gloo's sum would: the mean is the
    one the float32 all-reduce gave (the logged loss is unchanged), the peaks exact past 2**24."""
    rng = random.Random(0)
    other: dict[str, Any] = {}

    def all_reduce(tensor: torch.Tensor, op: Any = None) -> None:
        tensor += torch.tensor([other["loss"], 0.0, float(other["peak"])], dtype=torch.float64)

    monkeypatch.setattr(rank_memory.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(rank_memory.dist, "all_reduce", all_reduce)
    for _ in range(500):
        mine, theirs = (
            torch.tensor(rng.uniform(-1, 1) * 10 ** rng.randint(-8, 8), dtype=torch.float32) for _ in range(2)
        )
        other.update(loss=float(theirs), peak=(1 << 40) + rng.randrange(1 << 20))
        memory = RankMemory(CPU, rank=0, world_size=2)
        expected = float((mine + theirs) / 2)  # what all_reduce_mean of float32 losses gives
        assert memory.mean_loss_and_peaks(mine, 1) == expected
        assert memory.by_rank[1] == other["peak"]


@pytest.mark.parametrize(
    ("train", "shown"),
    [
        ({"peak_memory_bytes": 2e9}, "2 GB"),  # an older summary: rank 0's alone
        ({"peak_memory_bytes": 2e9, "peak_memory_rank": 0, "peak_memory_by_rank": [2e9]}, "2 GB"),
        ({"peak_memory_bytes": 3e9, "peak_memory_rank": 1, "peak_memory_by_rank": [2e9, 3e9]}, "3 GB (rank 1 of 2)"),
        (
            {"peak_memory_bytes": 2e9, "peak_memory_rank": 0, "peak_memory_by_rank": [2e9, None]},
            "2 GB (rank 0 of 2; rank 1 not known)",
        ),
        (
            {"peak_memory_bytes": 2e9, "peak_memory_rank": 0, "peak_memory_by_rank": [2e9, None, None]},
            "2 GB (rank 0 of 3; ranks 1, 2 not known)",
        ),
    ],
)
def test_the_end_table_shows_the_largest_peak_and_its_rank(train: dict[str, Any], shown: str) -> None:
    assert dict(speed_rows(train))["peak memory"] == shown


def test_summary_shape_reads_old_and_new_summaries_alike() -> None:
    notes: list[str] = []
    old = {"status": "completed", "global_step": 3, "train": {"peak_memory_bytes": 5.0}}
    assert SUMMARY.check(old, "summary.json", notes)["train"] == {"peak_memory_bytes": 5.0} and not notes
    new = {
        **old,
        "train": {
            "peak_memory_bytes": 5,
            "peak_memory_rank": 1,
            "peak_memory_by_rank": [4, 5, None],
            "peak_memory_by_rank_step": [3, 3, None],
        },
    }
    assert SUMMARY.check(new, "summary.json", notes)["train"] == new["train"] and not notes
    bad = {**old, "train": {"peak_memory_by_rank": [4, "5"], "peak_memory_by_rank_step": [3.5]}}
    assert SUMMARY.check(bad, "summary.json", notes)["train"] == {}
    assert len(notes) == 2 and "peak_memory_by_rank" in notes[0]


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="Linux's /proc: VmHWM")
def test_a_process_reports_its_own_peak_not_the_one_of_the_process_that_started_it() -> None:
    """getrusage's ru_maxrss survives fork+exec: a child of a large parent read the parent's peak (2
    FSDP ranks spawned by a 700 MiB test runner both reported 772 MB). The child's own peak is small."""
    parent = r"""
import json, subprocess, sys
grown = bytearray(400 << 20)
for i in range(0, len(grown), 4096):
    grown[i] = 1
del grown
child = "import json; from gputrain.observe.rank_memory import host_peak_rss_bytes; print(host_peak_rss_bytes())"
print(json.dumps(int(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True).stdout)))
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, env=env, timeout=120, check=True)
    child_peak = json.loads(done.stdout.splitlines()[-1])
    assert child_peak < 300 << 20, f"the child reported {child_peak >> 20} MiB: its parent's 400 MiB peak"
