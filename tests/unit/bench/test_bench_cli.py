"""`python -m gputrain bench` for real on this machine."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gputrain.bench.cache import load_cached, load_cached_peak
from gputrain.bench.comms import bus_bandwidth
from gputrain.bench.dist_run import spawn_allreduce_benchmark
from gputrain.bench.render import format_value
from gputrain.cli import main

REPO = Path(__file__).resolve().parents[3]
KEYS = {"bench", "device", "dtype", "size", "value", "unit"}


def bench(*args: str, cache_dir: Path, tiny: bool = True, launcher: list[str] | None = None):
    env = dict(os.environ, PYTHONPATH=str(REPO), GPUTRAIN_CACHE_DIR=str(cache_dir))
    if tiny:
        env["GPUTRAIN_BENCH_TINY"] = "1"
    else:
        env.pop("GPUTRAIN_BENCH_TINY", None)
    cmd = [sys.executable, *(launcher or []), "-m", "gputrain", "bench", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_quick_json_measures_the_cpu_and_fills_the_cache(tmp_path, monkeypatch):
    out = bench("--quick", "--json", "--device", "cpu", cache_dir=tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["device"]["type"] == "cpu" and doc["device"]["name"].startswith("cpu: ")
    got = {(r["bench"], r["dtype"]) for r in doc["results"]}
    assert got == {("matmul", "fp32"), ("matmul", "bf16"), ("conv2d_fwd_bwd", "fp32"), ("memory_copy", "fp32")}
    for r in doc["results"]:
        assert set(r) == KEYS and r["device"] == "cpu"
        assert math.isfinite(r["value"]) and r["value"] > 0
        assert r["unit"] == ("B/s" if r["bench"] == "memory_copy" else "FLOP/s")
    monkeypatch.setenv("GPUTRAIN_CACHE_DIR", str(tmp_path))
    assert load_cached(doc["device"]["name"])["results"] == doc["results"]
    assert load_cached_peak(doc["device"]["name"], "fp32") is None  # small matrices: never the MFU peak
    assert any("not used as the MFU peak" in note for note in doc["notes"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_device_cuda_without_cuda_is_a_usage_error(capsys):
    assert main(["bench", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "CUDA is not available" in err and "Traceback" not in err


@pytest.mark.slow
def test_real_quick_run_measures_with_the_real_sizes(tmp_path):
    # --quick with the real sizes (not the tiny test ones). How long it takes is a figure of the
    # machine and its load, not a test: docs/doctor-bench.md gives it for an idle 2-core CPU.
    out = bench("--quick", "--no-cache", cache_dir=tmp_path, tiny=False)
    assert out.returncode == 0, out.stderr
    assert "quick mode" in out.stdout
    assert "matmul" in out.stdout and "FLOP/s" in out.stdout and "GB/s" in out.stdout
    assert not (tmp_path / "bench.json").exists()  # --no-cache


@pytest.mark.slow
def test_allreduce_bus_bandwidth_with_two_gloo_ranks_under_torchrun(monkeypatch):
    # What `bench` does by itself on a multi-GPU machine, here with two CPU ranks and gloo.
    monkeypatch.setenv("GPUTRAIN_BENCH_TINY", "1")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    result, note = spawn_allreduce_benchmark("cpu", 2, quick=True, timeout_s=120)
    assert note is None
    assert result.bench == "allreduce_busbw" and result.device == "cpu x2 (gloo)"
    assert result.unit == "B/s" and result.value > 0


def test_bus_bandwidth_and_units():
    # A ring all-reduce moves 2(n-1)/n of the data over each link: 1x for 2 ranks, 1.75x for 8.
    assert bus_bandwidth(1000, 1.0, 2) == pytest.approx(1000)
    assert bus_bandwidth(1000, 1.0, 8) == pytest.approx(1750)
    assert format_value(1.834e11, "FLOP/s") == "183 GFLOP/s"
    assert format_value(3.35e12, "B/s") == "3.35 TB/s"
    assert format_value(7.25, "x") == "7.2x"
