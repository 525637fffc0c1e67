"""The real twin of test_checks: `python -m gputrain doctor` run as a user runs it, on this
CPU machine (where it must say: CPU-only build, install a CUDA build), and a real gloo
all-reduce across two processes for `--dist`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gputrain.cli import main

REPO = Path(__file__).resolve().parents[3]
CPU_ONLY = torch.version.cuda is None and not torch.version.hip
pytestmark = pytest.mark.slow


def doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([sys.executable, "-m", "gputrain", "doctor", *args], cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not CPU_ONLY, reason="asserts what a CPU-only torch build must be told")
def test_table_says_cpu_only_build_and_exits_1():
    out = doctor()
    assert out.returncode == 1, out.stderr
    text = " ".join(out.stdout.split())
    assert "FAIL torch build" in text and "CPU-only build" in text
    assert "fix: install a CUDA build: pip install torch --index-url" in text
    assert "GPU training is NOT possible" in text


@pytest.mark.skipif(not CPU_ONLY, reason="asserts what a CPU-only torch build must be told")
def test_json_has_facts_and_checks():
    out = doctor("--json")
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    assert doc["facts"]["torch_build"] == "cpu" and doc["facts"]["cuda_available"] is False
    assert doc["facts"]["dist"] is None
    build = next(c for c in doc["checks"] if c["name"] == "torch build")
    assert build["status"] == "fail" and "CPU-only build" in build["detail"]
    assert build["fix"].startswith("install a CUDA build")
    assert all(set(c) == {"name", "status", "detail", "fix"} for c in doc["checks"])


def test_dist_smoke_test_passes_with_two_gloo_processes():
    out = doctor("--json", "--dist", "--timeout", "60")
    doc = json.loads(out.stdout)
    dist = doc["facts"]["dist"]
    if doc["facts"]["device_count"] == 0:
        assert dist["backend"] == "gloo" and dist["world_size"] == 2
    assert dist["ok"] is True and dist["failed_rank"] is None
    check = next(c for c in doc["checks"] if c["name"].startswith("all-reduce"))
    assert check["status"] == "ok" and "ranks agreed" in check["detail"]


def test_dist_smoke_test_names_the_rank_that_fails():
    # Rank 1 raises before the all-reduce; rank 0 is then stuck in (or torn out of) the
    # collective: the doctor must blame rank 1, kill rank 0, and come back well within the timeout.
    out = doctor("--json", "--dist", "--timeout", "60", env={"GPUTRAIN_DOCTOR_DIST_FAIL_RANK": "1"})
    assert out.returncode == 1
    doc = json.loads(out.stdout)
    assert doc["facts"]["dist"]["failed_rank"] == 1
    assert doc["facts"]["dist"]["seconds"] < 60
    check = next(c for c in doc["checks"] if c["name"].startswith("all-reduce"))
    assert check["status"] == "fail"
    assert check["detail"].startswith("rank 1 of 2 failed: RuntimeError: injected failure on rank 1")


def test_bad_timeout_is_a_usage_error(capsys):
    assert main(["doctor", "--timeout", "0"]) == 2
    err = capsys.readouterr().err
    assert "--timeout must be > 0" in err and "Traceback" not in err
