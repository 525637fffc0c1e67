"""The real twin of test_checks: `python -m gputrain doctor` run as a user runs it, on this
CPU machine (no GPU at all: it must pass, say that training runs on the CPU, and ask for no CUDA
build), and a real gloo all-reduce across two processes for `--dist`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gputrain.cli import main
from gputrain.env.checks import gpu_present
from gputrain.env.facts import collect_env

REPO = Path(__file__).resolve().parents[3]
NO_GPU = not gpu_present(collect_env())
pytestmark = pytest.mark.slow


def doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([sys.executable, "-m", "gputrain", "doctor", *args], cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not NO_GPU, reason="asserts what a machine without any GPU must be told")
def test_machine_without_a_gpu_passes_and_trains_on_the_cpu():
    out = doctor()
    assert out.returncode == 0, out.stdout + out.stderr
    text = " ".join(out.stdout.split())
    assert "ok cpu training no GPU on this machine" in text and "gputrain trains on the CPU" in text
    assert "FAIL" not in text and "CUDA build" not in text.replace("CPU-only build", "")
    assert "fix:" not in text
    assert text.endswith("CPU training works; this machine has no GPU (0 fail, 0 warn, 7 ok)")


@pytest.mark.skipif(not NO_GPU, reason="asserts what a machine without any GPU must be told")
def test_require_gpu_exits_1_without_a_gpu_and_json_has_facts_and_checks():
    out = doctor("--json", "--require-gpu")
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    assert doc["facts"]["cuda_available"] is False and doc["facts"]["dist"] is None
    assert doc["facts"]["driver"]["pci_gpus"] in (0, None)
    failed = [c for c in doc["checks"] if c["status"] == "fail"]
    assert [c["name"] for c in failed] == ["gpu training"]
    assert failed[0]["detail"].startswith("no GPU on this machine")
    assert all(set(c) == {"name", "status", "detail", "fix"} for c in doc["checks"])
    assert doctor("--json").returncode == 0


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


def test_the_allocator_line_names_the_setting_of_the_ranks_and_fails_on_one_that_cannot_be():
    from gputrain.distributed.allocator import libc_name

    out = doctor()
    text = " ".join(out.stdout.split())
    if libc_name() is not None:
        assert "ok allocator ranks of a sharded job: glibc mmap threshold 128 KiB" in text, text
        assert "DDP and one process: the C library's malloc, untouched by gputrain" in text, text
    bad = doctor(env={"GPUTRAIN_ALLOCATOR": "jemalloc", "LD_PRELOAD": ""})
    text = " ".join(bad.stdout.split())
    from gputrain.distributed.allocator import find_malloc

    if find_malloc("jemalloc") is None:
        assert bad.returncode == 1 and "FAIL allocator GPUTRAIN_ALLOCATOR=jemalloc: no libjemalloc.so" in text, text
    else:
        assert bad.returncode == 0 and "allocator ranks gputrain starts: jemalloc" in text, text
