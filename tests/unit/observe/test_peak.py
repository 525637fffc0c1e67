"""resolve_peak: the bench cache first, then the datasheet; nothing invented for a CPU."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from gputrain.observe.peak import resolve_peak

H100 = "NVIDIA H100 80GB HBM3"


def _install_fakes(monkeypatch: pytest.MonkeyPatch, cached: dict[tuple[str, str], float]) -> list[tuple[str, str]]:
    """Stand-ins for gputrain.env.peaks and gputrain.bench.cache with an H100's facts."""
    asked: list[tuple[str, str]] = []
    peaks = types.ModuleType("gputrain.env.peaks")

    def datasheet_peak_flops(device_name: str, dtype: str) -> tuple[float, str] | None:
        table = {"bf16": 989e12, "fp16": 989e12, "tf32": 494.5e12, "fp32": 67e12}
        if "H100" not in device_name:
            return None
        return table[dtype], f"H100 SXM datasheet {dtype}"

    peaks.datasheet_peak_flops = datasheet_peak_flops  # type: ignore[attr-defined]
    bench = types.ModuleType("gputrain.bench")
    cache = types.ModuleType("gputrain.bench.cache")

    def load_cached_peak(device_name: str, dtype: str) -> float | None:
        asked.append((device_name, dtype))
        return cached.get((device_name, dtype))

    cache.load_cached_peak = load_cached_peak  # type: ignore[attr-defined]
    cache.device_name = lambda device: H100 if torch.device(device).type == "cuda" else "cpu: fake x2"  # type: ignore[attr-defined]
    bench.cache = cache  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gputrain.env.peaks", peaks)
    monkeypatch.setitem(sys.modules, "gputrain.bench", bench)
    monkeypatch.setitem(sys.modules, "gputrain.bench.cache", cache)
    return asked


def test_datasheet_peak_for_gpu_and_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _install_fakes(monkeypatch, {})
    peak, source = resolve_peak(torch.device("cuda", 0), "bf16")
    assert peak == 989e12
    assert source == "datasheet: H100 SXM datasheet bf16"
    assert asked == [(H100, "bf16")]  # the cache was asked first
    assert resolve_peak(torch.device("cuda", 0), "fp32")[0] == 67e12  # fp32 is not tf32


def test_measured_peak_wins_over_datasheet(monkeypatch: pytest.MonkeyPatch) -> None:
    _install_fakes(monkeypatch, {(H100, "bf16"): 760e12})
    assert resolve_peak(torch.device("cuda", 0), "bf16") == (760e12, "bench")


def test_cpu_only_from_bench_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    _install_fakes(monkeypatch, {("cpu: fake x2", "fp32"): 1.5e11})
    assert resolve_peak(torch.device("cpu"), "fp32") == (1.5e11, "bench")
    assert resolve_peak(torch.device("cpu"), "bf16") == (None, None)  # no datasheet guess for a CPU


def test_real_cpu_call_without_cache(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("GPUTRAIN_CACHE_DIR", str(tmp_path))
    assert resolve_peak(torch.device("cpu"), "fp32") == (None, None)
    assert resolve_peak(torch.device("cpu"), "auto") == (None, None)
