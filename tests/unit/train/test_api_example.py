"""examples/own_optimizer_and_callbacks.py runs as the README says, and does what it claims: its
optimizer's groups, its schedule, the EMA beside the raw weights, validation on a step cadence."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_api_example_trains_with_its_own_optimizer_schedule_and_callbacks(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "own_optimizer_and_callbacks.py"), "--run-dir", str(run_dir),
         "--steps", "200"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] in ("completed", "stopped_early")
    groups = summary["optimizer"]["param_groups"]
    assert summary["optimizer"]["class"] == "torch.optim.adamw.AdamW" and len(groups) == 3  # decay, no decay, head
    assert summary["optimizer"]["scheduler"] == "OneCycleLR"
    assert "ema/accuracy" in summary["test"] and (run_dir / "model-ema.safetensors").is_file()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r.get("split") == "val"][:2] == [100, 200]
    assert "last logged step" in done.stdout and "test accuracy" in done.stdout
