"""The per-machine cache: round trip through GPUTRAIN_CACHE_DIR, keyed by name + driver + torch."""

from __future__ import annotations

import json

import pytest
import torch

from gputrain.bench import cache
from gputrain.bench.cache import cache_path, load_cached_peak, machine_key, save_results


def matmul(dtype: str, value: float) -> dict:
    return {"bench": "matmul", "device": "cuda", "dtype": dtype, "size": "8192x8192x8192",
            "value": value, "unit": "FLOP/s"}


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUTRAIN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cache, "driver_version", lambda: "570.133.20")
    return tmp_path


def test_round_trip_keeps_the_best_matmul_per_dtype(cache_dir):
    results = [matmul("bf16", 7.1e14), matmul("bf16", 7.4e14), matmul("fp32", 5.1e13),
               {"bench": "memory_copy", "device": "cuda", "dtype": "fp32", "size": "1024 MiB",
                "value": 3.0e12, "unit": "B/s"}]
    path = save_results("NVIDIA H100 80GB HBM3", "full", results)
    assert path == cache_dir / "bench.json" == cache_path()
    assert load_cached_peak("NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(7.4e14)
    assert load_cached_peak("NVIDIA H100 80GB HBM3", "fp32") == pytest.approx(5.1e13)
    assert load_cached_peak("NVIDIA H100 80GB HBM3", "fp16") is None  # not measured
    assert load_cached_peak("NVIDIA A100-SXM4-80GB", "bf16") is None  # another GPU
    entry = json.loads(path.read_text())["machines"][machine_key("NVIDIA H100 80GB HBM3")]
    assert entry["results"] == results and entry["mode"] == "full"


def test_key_is_device_driver_and_torch(monkeypatch):
    key = machine_key("NVIDIA H100 80GB HBM3")
    assert key == f"NVIDIA H100 80GB HBM3 | driver 570.133.20 | torch {torch.__version__}"
    save_results("NVIDIA H100 80GB HBM3", "full", [matmul("bf16", 7e14)])
    monkeypatch.setattr(cache, "driver_version", lambda: "580.65.06")
    # A driver upgrade can move the peak: the old figure no longer applies.
    assert load_cached_peak("NVIDIA H100 80GB HBM3", "bf16") is None
    # CPU figures do not depend on the GPU driver.
    assert machine_key("cpu: AMD EPYC x2") == f"cpu: AMD EPYC x2 | driver - | torch {torch.__version__}"


def test_several_machines_share_the_file_and_corruption_is_survived(cache_dir):
    save_results("cpu: AMD EPYC x2", "full", [matmul("fp32", 1.8e11)])
    save_results("NVIDIA L4", "full", [matmul("bf16", 1.0e14)])
    assert load_cached_peak("cpu: AMD EPYC x2", "fp32") == pytest.approx(1.8e11)
    assert load_cached_peak("NVIDIA L4", "bf16") == pytest.approx(1.0e14)
    (cache_dir / "bench.json").write_text("{not json")
    assert load_cached_peak("NVIDIA L4", "bf16") is None
    save_results("NVIDIA L4", "full", [matmul("bf16", 1.1e14)])
    assert load_cached_peak("NVIDIA L4", "bf16") == pytest.approx(1.1e14)


def test_quick_results_are_kept_but_never_become_the_peak(cache_dir):
    save_results("NVIDIA H100 80GB HBM3", "quick", [matmul("bf16", 6.0e14)])
    assert load_cached_peak("NVIDIA H100 80GB HBM3", "bf16") is None
    save_results("NVIDIA H100 80GB HBM3", "full", [matmul("bf16", 7.4e14)])
    save_results("NVIDIA H100 80GB HBM3", "quick", [matmul("bf16", 6.0e14)])
    assert load_cached_peak("NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(7.4e14)
    entry = cache.load_cached("NVIDIA H100 80GB HBM3")
    assert entry["mode"] == "quick" and entry["results"] == [matmul("bf16", 6.0e14)]


def test_default_location(monkeypatch, tmp_path):
    monkeypatch.delenv("GPUTRAIN_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_path() == tmp_path / ".cache" / "gputrain" / "bench.json"


def test_cpu_device_name_carries_the_thread_count():
    name = cache.device_name("cpu")
    assert name.startswith("cpu: ") and name.endswith(f" x{torch.get_num_threads()}")
