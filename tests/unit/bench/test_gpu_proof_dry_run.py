"""benchmarks/gpu_proof.py --dry-run: the GPU proof's own code at tiny sizes on the CPU, so the one
command a scarce GPU session runs has not rotted when it gets there. Every part must run and appear
in both the JSON and the markdown, with its figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PARTS = ["doctor", "nccl", "smoke", "pipeline", "default_job", "gpt2", "fp8", "resnet50", "tests_gpu", "bench"]


@pytest.mark.slow
def test_dry_run_runs_every_part_and_reports_it(tmp_path):
    out = tmp_path / "proof"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_proof.py"), str(out), "--dry-run"],
                            capture_output=True, text=True, timeout=600, cwd=tmp_path)
    proof = json.loads((out / "gpu_proof.json").read_text())
    by_part = {r["part"]: r for r in proof["parts"]}
    assert list(by_part) == PARTS and proof["dry_run"] is True
    broken = {name: (r["status"], r.get("error"), r.get("log_tail"))
              for name, r in by_part.items() if r["status"] != "ok"}
    assert not broken and result.returncode == 0, (broken, result.stdout[-2000:], result.stderr[-2000:])
    assert all(r["result"]["summary"] for r in by_part.values())

    assert by_part["nccl"]["result"]["backend"] == "gloo"
    smoke = by_part["smoke"]["result"]["checks"]
    assert smoke["bf16 guard"] == "PASS" and smoke["cuda_graphs with grad_accum=2"] == "PASS"
    assert smoke["pinned batches"] == "SKIP" and len(smoke) == 8
    gpt2 = by_part["gpt2"]["result"]
    assert gpt2["gputrain"]["tokens_per_s"] > 0 and gpt2["hand"]["tokens_per_s"] > 0 and gpt2["throughput_ratio"] > 0
    fp8 = by_part["fp8"]["result"]
    assert fp8["candidate"] == "fp32" and "sm_89" in fp8["refusal"]  # a CPU refuses fp8, then compares fp32
    assert fp8["max_relative_loss_gap"] < fp8["loss_tolerance"]
    resnet = by_part["resnet50"]["result"]
    assert resnet["disk"]["images_per_s"] > 0 and resnet["disk_vs_synthetic"] > 0
    pipeline = by_part["pipeline"]["result"]
    assert 0 <= pipeline["overlap"]["hidden_share"] <= 1
    assert set(pipeline["syncs"]) == {"in_memory", "dataloader"}
    assert by_part["default_job"]["result"]["device"] == "cpu"
    assert by_part["doctor"]["result"]["doctor"]["checks"] and by_part["bench"]["result"]["bench"]["results"]

    markdown = (out / "gpu_proof.md").read_text()
    assert "DRY RUN" in markdown
    for name in PARTS:
        assert f"| {name} | ok |" in markdown, name
    assert "| gpt2 | GPT-2 124M MFU" in markdown and "| resnet50 | ResNet-50 from disk" in markdown
    assert (out / "gpu_proof.log").stat().st_size > 0
