"""Trainer callbacks on 2 real gloo ranks under FSDP (issue 29 §2): the EMA of each rank's shards is
the hand-computed one; a stop asked on one rank only stops both at the same step, none left waiting;
and an EMA resumed from a sharded checkpoint equals the unbroken run's bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file

from tests.dist.callback_jobs import callbacks_job
from tests.dist.harness import run_ranks


def test_callbacks_under_fsdp_on_two_ranks(tmp_path: Path) -> None:
    dirs = {name: str(tmp_path / name) for name in ("ema", "stop", "whole", "broken")}
    results = run_ranks(callbacks_job, dirs, timeout_s=240)
    for rank, out in enumerate(results):
        assert out["sharded"], rank
        assert out["ema_exact"], rank
        # rank 1 asked at step 5; both stopped at the next logging step, 6, with its reason
        assert out["stop"] == ("stopped_early", 6, "rank 1 had enough", 6), rank
        assert out["interrupted"] and out["resumed_exact"], rank
    stopped = json.loads((tmp_path / "stop" / "summary.json").read_text())
    assert stopped["stop_reason"] == "rank 1 had enough"
    assert (tmp_path / "stop" / "checkpoints" / "step-6" / "COMMITTED").is_file()
    # the EMA's weights file, written by both ranks in place, is the same whether the run was broken or not
    whole, broken = (
        load_file(tmp_path / "whole" / "model-ema.safetensors"),
        load_file(tmp_path / "broken" / "model-ema.safetensors"),
    )
    assert whole.keys() == broken.keys() and all((whole[k] == broken[k]).all() for k in whole)
    assert load_file(tmp_path / "whole" / "model.safetensors").keys() == whole.keys()
