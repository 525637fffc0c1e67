"""The loop's cadences and limits on 2 real gloo ranks (issue 29 part 3): train.max_time is agreed
(rank 0's clock, on logging steps), so both ranks stop at the same step with one checkpoint and
continue together; eval.every_steps validates on both at the same steps; a smoke run on 2 ranks
passes its round trip and leaves nothing.

The time limit is a microsecond: any step takes longer, so the stop falls at the first logging
step, whatever the machine's load (no wall-clock threshold)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.dist.harness import run_ranks

QUIET = {"train.device": "cpu", "log.progress": "none", "log.tensorboard": False, "train.batch_size": 16,
         "train.epochs": 2, "log.every_steps": 3, "eval.every_steps": 4, "eval.every_epochs": 0,
         "parallel.strategy": "ddp"}


def _job(rank: int, root: str) -> list[dict[str, Any]]:
    import torch
    import torch.nn.functional as F
    from torch import nn

    from gputrain import Trainer
    from tests.adversarial.helpers import linear_data

    def trainer(run_dir: str, **config: Any) -> Trainer:
        torch.manual_seed(0)
        return Trainer(nn.Linear(6, 3), linear_data(256), val_data=linear_data(32), loss_fn=F.cross_entropy,
                       config={**QUIET, **config}, run_dir=run_dir)

    out = []
    for run_dir, config in ((f"{root}/timed", {"train.max_time": 1e-6}), (f"{root}/timed", {}),
                            (f"{root}/smoke", {"train.smoke_steps": 2})):
        t = trainer(run_dir, **config)
        summary = t.fit()
        saved = sorted(p.name for p in (t.run_dir / "checkpoints").glob("step-*")) if t.run_dir.exists() else []
        out.append({"status": summary["status"], "step": summary["global_step"], "run_dir": str(t.run_dir),
                    "checkpoints": saved})
    return out


def test_max_time_every_steps_and_smoke_on_two_ranks(tmp_path: Path) -> None:
    by_rank = run_ranks(_job, str(tmp_path), world=2, timeout_s=240)
    assert by_rank[0] == by_rank[1]  # the same ending on both ranks, at the same step
    timed, continued, smoke = by_rank[0]
    assert (timed["status"], timed["step"]) == ("timed_out", 3)  # the first logging step
    assert timed["checkpoints"] == ["step-3"]  # saved where it stopped; the continuation resumed from it
    assert (continued["status"], continued["step"]) == ("completed", 32)  # 16 global batches of 16 per epoch
    rows = [json.loads(line) for line in (tmp_path / "timed" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if row.get("split") == "val"] == list(range(4, 33, 4))
    assert (smoke["status"], smoke["step"]) == ("completed", 2)
    assert not Path(smoke["run_dir"]).exists() and not (tmp_path / "smoke").exists()
