"""summary.json's peak memory is every rank's, on 2 real gloo ranks of FSDP: rank 1 alone takes and holds
HOLD bytes more than rank 0 (an allocation in `fit(on_step=...)`), so its peak RSS is the larger. A run
that completes, one stopped by a signal both ranks got, and one whose rank 1 fails, each record both
ranks' peaks, the largest and which rank: the failed run's rank 1 figure is the one it left on disk as
it failed; a rank killed outright leaves none, and its figure is the one gathered on its last logging
step, which the summary and the report say. The report shows each rank's."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.dist.harness import run_ranks
from tests.dist.jobs import BASE

HOLD = 128 << 20
"""What rank 1 takes more at each chosen moment: above the two ranks' difference in RSS by anything else."""
FSDP = ["parallel.strategy=fsdp", "parallel.timeout_s=60"]
FAILING = [*BASE, *FSDP, "train.max_steps=8", "log.every_steps=2"]


def killed_run(rank: int, root: str) -> str:
    """Rank 1 grows at step 1 (the row of step 2 gathers it) and again at step 3, then dies outright
    (as a kill would) in its 4th forward: it leaves nothing on disk, and rank 0's summary has its
    figure from the row of step 2."""
    import torch

    from gputrain.errors import RunError
    from gputrain.train.trainer import Trainer

    held: list[torch.Tensor] = []
    steps = [0]

    def grow() -> None:
        steps[0] += 1
        if rank == 1 and steps[0] in (1, 3):
            held.append(torch.ones(HOLD, dtype=torch.uint8))

    os.environ["GPUTRAIN_TEST_FAULT"] = "rank=1,forward=4,action=exit"
    try:
        Trainer.from_config(None, run_dir=f"{root}/killed", overrides=FAILING).fit(on_step=grow)
    except RunError as err:
        return str(err)
    return "completed"


def memory_runs(rank: int, root: str) -> dict[str, Any]:
    """The three runs, in turn on these two ranks; how each rank's fit ended. Rank 1 takes HOLD more
    bytes (held for the process's life: a peak RSS never falls) at a moment only one gather sees."""
    import signal

    import torch

    from gputrain.errors import Interrupted, RunError
    from gputrain.train.trainer import Trainer

    held: list[torch.Tensor] = []
    steps = [0]

    def grow_at(step: int, then: Any = None) -> Any:
        def on_step() -> None:  # after the step's row: its gather has been
            steps[0] += 1
            if steps[0] == step:
                if rank == 1:
                    held.append(torch.ones(HOLD, dtype=torch.uint8))
                if then is not None:
                    then()

        steps[0] = 0
        return on_step

    ended: dict[str, Any] = {}
    # both ranks get SIGTERM at step 2, after its row: they agree to stop there, and only the stop's
    # gather (after its checkpoint) sees rank 1's growth
    stop = [*BASE, *FSDP, "train.max_steps=8", "checkpoint.enabled=true"]
    try:
        Trainer.from_config(None, run_dir=f"{root}/interrupted", overrides=stop).fit(
            on_step=grow_at(2, lambda: os.kill(os.getpid(), signal.SIGTERM))
        )
    except Interrupted:
        ended["interrupted"] = "interrupted"
    # rank 1 grows after the last step's row: only the end's gather sees it
    Trainer.from_config(None, run_dir=f"{root}/completed", overrides=[*BASE, *FSDP]).fit(on_step=grow_at(4))
    ended["completed"] = "completed"
    # rank 1 grows at step 3, after the row of step 2 (rows every 2 steps), and raises in its 4th
    # training forward: it leaves its peak on disk as it records the failure, before rank 0 learns of it
    os.environ["GPUTRAIN_TEST_FAULT"] = "rank=1,forward=4,action=raise"
    try:
        Trainer.from_config(None, run_dir=f"{root}/failed", overrides=FAILING).fit(on_step=grow_at(3))
    except RunError as err:
        ended["failed"] = str(err)
    finally:
        del os.environ["GPUTRAIN_TEST_FAULT"]
    return ended


def _train(run_dir: Path) -> dict[str, Any]:
    summary = json.loads((run_dir / "summary.json").read_text())
    return {**summary["train"], "status": summary["status"], "global_step": summary["global_step"]}


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if "peak_memory_bytes" in row]


def test_summary_and_report_hold_every_ranks_peak_however_the_run_ends(tmp_path: Path) -> None:
    from gputrain.report.build import write_report

    ended = run_ranks(memory_runs, str(tmp_path), timeout_s=240)
    assert ended[1]["failed"] and "test fault injected" in ended[1]["failed"]
    assert "failed" in ended[0], ended[0]  # rank 0 fails once its peer is gone, and writes the summary
    runs = {name: _train(tmp_path / name) for name in ("interrupted", "completed", "failed")}
    grown = 0  # rank 1's peak before each run: each run's growth is HOLD over it
    for name, train in runs.items():
        assert train["status"] == name, train
        by_rank = train["peak_memory_by_rank"]
        assert len(by_rank) == 2 and all(isinstance(peak, int) for peak in by_rank), (name, by_rank)
        assert by_rank[1] - max(by_rank[0], grown) >= HOLD // 2, (name, by_rank, grown)  # rank 1's own figure
        assert train["peak_memory_bytes"] == by_rank[1] and train["peak_memory_rank"] == 1, (name, train)
        grown = by_rank[1]

    # the agreed stop and the normal end gather at the end: rank 1's growth after the last row is there
    for name in ("interrupted", "completed"):
        train, last_row = runs[name], _rows(tmp_path / name)[-1]
        assert train["peak_memory_by_rank_step"] == [train["global_step"]] * 2, (name, train)
        assert last_row["step"] == train["global_step"], (name, last_row)
        assert train["peak_memory_bytes"] - last_row["peak_memory_bytes"] >= HOLD // 2, (name, train, last_row)
    # the failure gathers nothing: rank 1 left its peak (grown after the row of step 2) on disk as it
    # recorded its failure, and rank 0 took it (and removed the file)
    failed, rows = runs["failed"], _rows(tmp_path / "failed")
    assert failed["global_step"] == 3 and failed["peak_memory_by_rank_step"] == [3, 3], failed
    assert rows[-1]["step"] == 2 and failed["peak_memory_by_rank"][1] - rows[-1]["peak_memory_bytes"] >= HOLD // 2
    assert not (tmp_path / "failed" / "memory-rank1.json").exists()

    # killed outright: nothing left on disk, rank 1's figure is the one its last row gathered (step 2),
    # on the loss's all-reduce; the report says so
    with pytest.raises(RuntimeError, match="exited without reporting"):
        run_ranks(killed_run, str(tmp_path), timeout_s=180)
    killed, rows = _train(tmp_path / "killed"), _rows(tmp_path / "killed")
    assert killed["status"] == "failed" and killed["global_step"] == 3, killed
    assert killed["peak_memory_by_rank_step"] == [3, 2], killed
    assert (rows[-1]["step"], rows[-1]["peak_memory_rank"]) == (2, 1), rows
    assert killed["peak_memory_by_rank"][1] == rows[-1]["peak_memory_bytes"] == killed["peak_memory_bytes"]
    assert not (tmp_path / "killed" / "memory-rank1.json").exists()
    html = write_report([tmp_path / "killed"], tmp_path / "killed.html").path.read_text()
    assert "at step 2" in html and "ended without its ranks meeting" in html

    for name in ("completed", "failed"):
        html = write_report([tmp_path / name], tmp_path / f"{name}.html").path.read_text()
        assert "peak memory by rank" in html and "rank 1 of 2" in html
        for peak in runs[name]["peak_memory_by_rank"]:
            assert f'data-value="{float(peak)!r}"' in html, (name, peak)
        assert "at step" not in html
