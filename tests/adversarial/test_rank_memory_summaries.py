"""summary.json's memory by rank as a reader meets it: written by an older gputrain (rank 0's peak
alone), by one process, by several ranks of which some were never gathered or gathered before the
end, or edited by hand (text, booleans, NaN, integers past a float's range, lists of the wrong length
or kind, a rank past the list). The report renders every one (no traceback), shows each rank's peak
only where the file really holds two or more, marks the largest, says which figures are older or
missing, and shows no field a wrong kind left out.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from gputrain.report.build import write_report

GB = 10**9
END = 6
"""The runs' last step."""

# (train fields, the table's rows (rank, data-value or None, "read" text) or None where no table is
# drawn, texts the page must hold, texts it must not)
CASES: dict[str, tuple[dict[str, Any], list[tuple[int, float | None, str]] | None, list[str], list[str]]] = {
    "older summary: rank 0's figure alone": (
        {"peak_memory_bytes": 2 * GB},
        None,
        ["peak memory (host RSS)"],
        ["peak memory by rank", "rank 0 of"],
    ),
    "one process": (
        {
            "peak_memory_bytes": GB,
            "peak_memory_rank": 0,
            "peak_memory_by_rank": [GB],
            "peak_memory_by_rank_step": [END],
        },
        None,
        [],
        ["peak memory by rank", "rank 0 of 1"],
    ),
    "two ranks, both at the end": (
        {
            "peak_memory_bytes": 3 * GB,
            "peak_memory_rank": 1,
            "peak_memory_by_rank": [2 * GB, 3 * GB],
            "peak_memory_by_rank_step": [END, END],
        },
        [(0, 2e9, "at the end"), (1, 3e9, "at the end")],
        ["rank 1 of 2"],
        ["ended without its ranks meeting"],
    ),
    "rank 1 as of an earlier step": (
        {
            "peak_memory_bytes": 3 * GB,
            "peak_memory_rank": 1,
            "peak_memory_by_rank": [2 * GB, 3 * GB],
            "peak_memory_by_rank_step": [END, 4],
        },
        [(0, 2e9, "at the end"), (1, 3e9, "at step 4")],
        ["ended without its ranks meeting"],
        [],
    ),
    "rank 1 never gathered": (
        {
            "peak_memory_bytes": 2 * GB,
            "peak_memory_rank": 0,
            "peak_memory_by_rank": [2 * GB, None],
            "peak_memory_by_rank_step": [END, None],
        },
        [(0, 2e9, "at the end"), (1, None, "missing: never gathered")],
        ["ended without its ranks meeting", "rank 0 of 2"],
        [],
    ),
    "no rank gathered at all": (
        {
            "peak_memory_bytes": None,
            "peak_memory_rank": None,
            "peak_memory_by_rank": [None, None, None],
            "peak_memory_by_rank_step": [None, None, None],
        },
        [
            (0, None, "missing: never gathered"),
            (1, None, "missing: never gathered"),
            (2, None, "missing: never gathered"),
        ],
        ["ended without its ranks meeting"],
        ["rank 0 of 3"],
    ),
    "eight ranks, the largest in the middle": (
        {
            "peak_memory_bytes": 9 * GB,
            "peak_memory_rank": 5,
            "peak_memory_by_rank": [GB * (9 if r == 5 else 1 + r % 3) for r in range(8)],
            "peak_memory_by_rank_step": [END] * 8,
        },
        [(r, float(GB * (9 if r == 5 else 1 + r % 3)), "at the end") for r in range(8)],
        ["rank 5 of 8"],
        [],
    ),
    "by rank is text": (
        {"peak_memory_bytes": GB, "peak_memory_rank": 0, "peak_memory_by_rank": "<b>2 GB</b>"},
        None,
        ["peak_memory_by_rank is &#x27;&lt;b&gt;2 GB&lt;/b&gt;&#x27;", "left out"],
        ["peak memory by rank"],
    ),
    "by rank holds text": (
        {"peak_memory_bytes": GB, "peak_memory_rank": 1, "peak_memory_by_rank": [GB, "3 GB"]},
        None,
        ["peak_memory_by_rank is"],
        ["peak memory by rank", "rank 1 of"],
    ),
    "by rank holds a boolean": (
        {"peak_memory_bytes": GB, "peak_memory_by_rank": [GB, True]},
        None,
        ["peak_memory_by_rank is"],
        ["peak memory by rank"],
    ),
    "by rank holds NaN": (
        {"peak_memory_bytes": GB, "peak_memory_by_rank": [GB, math.nan]},
        None,
        ["peak_memory_by_rank is"],
        ["peak memory by rank"],
    ),
    "by rank holds an integer past a float": (
        {"peak_memory_bytes": GB, "peak_memory_by_rank": [GB, 10**400]},
        None,
        ["peak_memory_by_rank is"],
        ["peak memory by rank"],
    ),
    "by rank holds a nested list": (
        {"peak_memory_bytes": GB, "peak_memory_by_rank": [[GB], [GB]]},
        None,
        ["peak_memory_by_rank is"],
        ["peak memory by rank"],
    ),
    "by rank is an object": (
        {"peak_memory_bytes": GB, "peak_memory_by_rank": {"0": GB, "1": GB}},
        None,
        ["peak_memory_by_rank is"],
        ["peak memory by rank"],
    ),
    "by rank is empty": (
        {"peak_memory_bytes": GB, "peak_memory_rank": 0, "peak_memory_by_rank": []},
        None,
        [],
        ["peak memory by rank"],
    ),
    "the rank is past the list": (
        {
            "peak_memory_bytes": 2 * GB,
            "peak_memory_rank": 7,
            "peak_memory_by_rank": [GB, 2 * GB],
            "peak_memory_by_rank_step": [END, END],
        },
        [(0, 1e9, "at the end"), (1, 2e9, "at the end")],
        [],
        ["rank 7 of"],
    ),
    "the rank is negative": (
        {
            "peak_memory_bytes": 2 * GB,
            "peak_memory_rank": -1,
            "peak_memory_by_rank": [GB, 2 * GB],
            "peak_memory_by_rank_step": [END, END],
        },
        [(0, 1e9, "at the end"), (1, 2e9, "at the end")],
        [],
        ["rank -1 of"],
    ),
    "the rank is text": (
        {
            "peak_memory_bytes": 2 * GB,
            "peak_memory_rank": "1",
            "peak_memory_by_rank": [GB, 2 * GB],
            "peak_memory_by_rank_step": [END, END],
        },
        [(0, 1e9, "at the end"), (1, 2e9, "at the end")],
        ["peak_memory_rank is &#x27;1&#x27;"],
        ["rank 1 of 2"],
    ),
    "steps shorter than the ranks": (
        {
            "peak_memory_bytes": 2 * GB,
            "peak_memory_rank": 1,
            "peak_memory_by_rank": [GB, 2 * GB],
            "peak_memory_by_rank_step": [END],
        },
        [(0, 1e9, "at the end"), (1, 2e9, "step not recorded")],
        ["rank 1 of 2"],
        [],
    ),
    "steps hold text": (
        {
            "peak_memory_bytes": 2 * GB,
            "peak_memory_rank": 1,
            "peak_memory_by_rank": [GB, 2 * GB],
            "peak_memory_by_rank_step": ["<i>6</i>", END],
        },
        [(0, 1e9, "step not recorded"), (1, 2e9, "step not recorded")],
        ["peak_memory_by_rank_step is"],
        [],
    ),
    "steps are text": (
        {
            "peak_memory_bytes": 2 * GB,
            "peak_memory_rank": 1,
            "peak_memory_by_rank": [GB, 2 * GB],
            "peak_memory_by_rank_step": "6",
        },
        [(0, 1e9, "step not recorded"), (1, 2e9, "step not recorded")],
        ["peak_memory_by_rank_step is &#x27;6&#x27;"],
        [],
    ),
    "a negative peak": (
        {
            "peak_memory_bytes": GB,
            "peak_memory_rank": 0,
            "peak_memory_by_rank": [GB, -5],
            "peak_memory_by_rank_step": [END, END],
        },
        [(0, 1e9, "at the end"), (1, -5.0, "at the end")],
        [],
        [],
    ),
    "floats where integers are written": (
        {
            "peak_memory_bytes": 2.5e9,
            "peak_memory_rank": 1,
            "peak_memory_by_rank": [1.5e9, 2.5e9],
            "peak_memory_by_rank_step": [END, END],
        },
        [(0, 1.5e9, "at the end"), (1, 2.5e9, "at the end")],
        ["rank 1 of 2"],
        [],
    ),
}


def _run(root: Path, train: dict[str, Any]) -> Path:
    run = root / "run"
    run.mkdir()
    (run / "config.toml").write_text('[train]\ndevice = "cpu"\n')
    summary = {"status": "completed", "global_step": END, "world_size": 2, "device": "cpu", "train": train}
    (run / "summary.json").write_text(json.dumps(summary))
    rows = [{"step": s, "loss": 1.0 / s, "peak_memory_bytes": 1e9} for s in range(1, END + 1)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def _table(html: str) -> str | None:
    start = html.find("<h3>peak memory by rank</h3>")
    return None if start < 0 else html[start : html.index("</table>", start)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_report_shows_each_ranks_peak_only_as_the_file_holds_it(case: str, tmp_path: Path) -> None:
    train, rows, present, absent = CASES[case]
    html = write_report([_run(tmp_path, train)], tmp_path / "report.html").path.read_text()
    table = _table(html)
    if rows is None:
        assert table is None, case
    else:
        assert table is not None, case
        cells = table.split("<tr>")[2:]  # past the head
        assert len(cells) == len(rows), (case, table)
        known = [v for _, v, _ in rows if v is not None]
        for (rank, value, read), row in zip(rows, cells):
            assert row.startswith(f"<td>{rank}</td>"), (case, row)
            assert (f'data-value="{value!r}"' in row) == (value is not None), (case, row)
            assert f"<td>{read}</td>" in row, (case, row)
            assert ('class="num best"' in row) == (value is not None and value == max(known)), (case, row)
    for text in present:
        assert text in html, (case, text)
    for text in absent:
        assert text not in html, (case, text)


# ----------------------------------------------------------------- what a rank leaves on disk (run/left_memory.py)

ATTEMPT = {"TORCHELASTIC_RUN_ID": "job", "TORCHELASTIC_RESTART_COUNT": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
GATHERED = 5 * GB
"""Rank 1's figure as the logging step 2 gathered it, before its file is read."""


def _left(**fields: Any) -> str:
    record = {"rank": 1, "peak_memory_bytes": 7 * GB, "step": 3, "attempt": "job/0/h/1"}
    return json.dumps({k: v for k, v in {**record, **fields}.items() if v is not ...})


def _write(text: str) -> Any:
    return lambda path: path.write_text(text)


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _link_out(path: Path) -> None:
    outside = path.parent.parent / "outside.json"
    outside.write_text(_left())
    path.symlink_to(outside)


# (how memory-rank1.json is made, whether rank 0 takes it: rank 1's figure 7 GB at step 3)
LEFT_CASES: dict[str, tuple[Any, bool]] = {
    "as a rank leaves it": (_write(_left()), True),
    "another attempt's": (_write(_left(attempt="job/1/h/1")), False),
    "another rank's, under rank 1's name": (_write(_left(rank=2)), False),
    "the rank as text": (_write(_left(rank="1")), False),
    "the peak as text": (_write(_left(peak_memory_bytes="7 GB")), False),
    "the peak NaN": (_write(_left(peak_memory_bytes=math.nan)), False),
    "the peak a boolean": (_write(_left(peak_memory_bytes=True)), False),
    "no step": (_write(_left(step=...)), False),
    "no attempt": (_write(_left(attempt=...)), False),
    "older than the gathered figure": (_write(_left(step=1)), False),
    "not JSON": (_write("{rank: 1"), False),
    "empty": (_write(""), False),
    "a list": (_write("[1, 2]"), False),
    "nested past the parser's depth": (_write("[" * 100_000 + "]" * 100_000), False),
    "larger than a run file may be": (_write(_left()[:-1] + ', "pad": "' + "x" * (5 << 20) + '"}'), False),
    "a directory": (lambda path: path.mkdir(), False),
    "a FIFO": (_fifo, False),
    "a link out of the run directory": (_link_out, False),
}


@pytest.mark.parametrize("case", sorted(LEFT_CASES))
def test_rank_0_takes_only_what_a_rank_of_this_attempt_left(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gputrain.observe.rank_memory import RankMemory
    from gputrain.run.left_memory import take

    for key, value in ATTEMPT.items():
        monkeypatch.setenv(key, value)
    make, taken = LEFT_CASES[case]
    run = tmp_path / "run"
    run.mkdir()
    make(run / "memory-rank1.json")
    memory = RankMemory(torch.device("cpu"), rank=0, world_size=2)
    memory._note([GB, GATHERED], 2)
    take(run, memory)  # never raises, never blocks
    assert (memory.by_rank[1], memory.steps[1]) == ((7 * GB, 3) if taken else (GATHERED, 2)), case
    assert os.path.lexists(run / "memory-rank1.json") != taken, case  # a file taken is removed, no other


def test_a_rank_leaves_its_figure_for_this_attempt_and_nothing_where_it_cannot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gputrain.observe.rank_memory import RankMemory
    from gputrain.run.left_memory import leave, take

    for key, value in ATTEMPT.items():
        monkeypatch.setenv(key, value)
    rank1 = RankMemory(torch.device("cpu"), rank=1, world_size=2)
    leave(tmp_path / "missing" / "run", rank1, 3)  # no directory: nothing, no error
    leave(tmp_path, rank1, 3)
    rank0 = RankMemory(torch.device("cpu"), rank=0, world_size=2)
    take(tmp_path, rank0)
    assert rank0.steps == [None, 3] and rank0.by_rank[1] == rank1.own()
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # the restarted job does not take it
    leave(tmp_path, rank1, 3)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    fresh = RankMemory(torch.device("cpu"), rank=0, world_size=2)
    take(tmp_path, fresh)
    assert fresh.by_rank == [None, None]
