"""scripts/gpu_smoke.py --device cpu: the smoke script's checks whose code runs on a CPU, so the script
a scarce GPU session runs first has not rotted (an assertion written against an old return type
would fail here, not on the GPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CHECKS = ["bf16 guard", "fsdp2 + fused optimizers on nccl", "pinned batches", "host syncs in 3 steps of in-memory data",
          "rng restore from more devices", "peak lookup", "prefetch under slow compute", "cuda_graphs with grad_accum=2"]
ON_CPU = {"bf16 guard", "fsdp2 + fused optimizers on nccl", "cuda_graphs with grad_accum=2"}


@pytest.mark.slow
def test_the_cpu_runnable_checks_pass_and_the_rest_say_why_they_skip(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_smoke.py"), "--device", "cpu"],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    for name in CHECKS:
        status = "PASS" if name in ON_CPU else "SKIP"
        assert any(line.startswith(f"{status}  {name}") for line in lines), (name, result.stdout)
    assert lines[-1].endswith(f"{len(ON_CPU)} passed, 0 failed"), lines[-1]
