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
from pathlib import Path
from typing import Any

import pytest

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
