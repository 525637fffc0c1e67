"""resolve_peak: the bench cache first, then the datasheet; nothing invented for a CPU.

The cache and the datasheet table are the real ones; only the GPU's name is faked (this machine
has none), and the real CPU path runs beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

from gputrain.bench.cache import device_name, save_results
from gputrain.env.peaks import datasheet_peak_flops
from gputrain.observe import peak

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(autouse=True)
def _empty_cache(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("GPUTRAIN_CACHE_DIR", str(tmp_path))


def _matmul(dtype: str, value: float) -> dict:
    return {"bench": "matmul", "device": "x", "dtype": dtype, "size": "n", "value": value, "unit": "FLOP/s"}


def _as_h100(monkeypatch: pytest.MonkeyPatch, name: str = H100, sms: int = 132) -> None:
    monkeypatch.setattr(peak, "device_name", lambda device: name if torch.device(device).type == "cuda" else "cpu")
    monkeypatch.setattr(peak, "_sm_count", lambda device: sms)


def test_datasheet_peak_for_gpu_and_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    _as_h100(monkeypatch)
    bf16, source = peak.resolve_peak(torch.device("cuda", 0), "bf16")
    assert (bf16, source) == (datasheet_peak_flops(H100, "bf16")[0], f"datasheet: {datasheet_peak_flops(H100, 'bf16')[1]}")
    assert 900e12 < bf16 < 1100e12  # H100 SXM dense bf16 ≈ 989 TFLOP/s
    fp32 = peak.resolve_peak(torch.device("cuda", 0), "fp32")[0]
    assert fp32 is not None and fp32 < bf16 / 10  # fp32 is not tf32


def test_a_mig_slice_gets_its_share_of_the_sms(monkeypatch: pytest.MonkeyPatch) -> None:
    _as_h100(monkeypatch, name="NVIDIA H100 80GB HBM3 MIG 1g.10gb", sms=16)
    bf16, source = peak.resolve_peak(torch.device("cuda", 0), "bf16")
    assert bf16 == pytest.approx(989.5e12 * 16 / 132)  # not the whole GPU's 989.5: MFU ~8x too low
    assert "16/132 SMs (MIG slice 1g.10gb)" in source


def test_measured_peak_wins_over_datasheet(monkeypatch: pytest.MonkeyPatch) -> None:
    _as_h100(monkeypatch)
    save_results(H100, "full", [_matmul("bf16", 760e12)])
    assert peak.resolve_peak(torch.device("cuda", 0), "bf16") == (760e12, "bench")


def test_real_cpu_uses_only_a_bench_result() -> None:
    cpu = torch.device("cpu")
    assert peak.resolve_peak(cpu, "fp32") == (None, None)  # no datasheet guess for a CPU
    save_results(device_name(cpu), "full", [_matmul("fp32", 1.5e11)])
    assert peak.resolve_peak(cpu, "fp32") == (1.5e11, "bench")
    assert peak.resolve_peak(cpu, "bf16") == (None, None)
    assert peak.resolve_peak(cpu, "auto") == (None, None)


def test_a_quick_bench_never_sets_the_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    # --quick multiplies 4096² matrices, below what an H100 reaches: as a peak it would inflate MFU
    _as_h100(monkeypatch)
    cuda = torch.device("cuda", 0)
    save_results(H100, "quick", [_matmul("bf16", 600e12)])
    assert peak.resolve_peak(cuda, "bf16")[1].startswith("datasheet: ")
    save_results(H100, "full", [_matmul("bf16", 760e12)])
    save_results(H100, "quick", [_matmul("bf16", 600e12)])  # a later quick run keeps the full run's peak
    assert peak.resolve_peak(cuda, "bf16") == (760e12, "bench")


def test_mfu_above_one_warns_that_the_peak_is_wrong(monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    from torch import nn

    from gputrain.observe import speed

    monkeypatch.setattr(speed, "resolve_peak", lambda device, precision: (1e6, "bench"))  # a 1 MFLOP/s "peak"
    monkeypatch.setattr(speed.log, "propagate", True)  # a Trainer run earlier may have given it its own handler
    meter = speed.SpeedMeter(nn.Linear(64, 64), torch.device("cpu"), "fp32", world_size=1, global_batch=32,
                             seq_len=None, breakdown_every=0)
    model = nn.Linear(64, 64)
    with meter.step_context():
        model(torch.randn(32, 64)).sum().backward()
    with caplog.at_level("WARNING", logger="gputrain"):
        fields = meter.summary_fields(steps=10, seconds=0.01)
    # never a figure above 100%: the peak is stale, so no MFU, and the warning says why
    assert fields["achieved_flops"] > 1e6 and fields["mfu"] is None and fields["mfu_peak_source"] is None
    assert meter.record_fields(steps=10, seconds=0.01)["mfu"] is None  # nor in metrics.jsonl's rows
    assert "so that peak is too low and MFU is not shown (it was measured on a busy machine? run `gputrain bench` " \
           "again on an idle one)" in caplog.text


def test_a_peak_measured_on_a_busy_machine_is_marked_and_mfu_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from gputrain.bench import cache

    cpu = torch.device("cpu")
    monkeypatch.setattr(cache.os, "getloadavg", lambda: (8.0, 8.0, 8.0))
    monkeypatch.setattr(cache.os, "sched_getaffinity", lambda pid: {0, 1})
    suspect = cache.busy_machine()
    assert suspect == "measured under load 8.0 on 2 cores"
    save_results(device_name(cpu), "full", [_matmul("fp32", 1.2e10)], suspect=suspect)
    assert peak.resolve_peak(cpu, "fp32") == (1.2e10, "bench (measured under load 8.0 on 2 cores: it may be too low)")
    save_results(device_name(cpu), "quick", [_matmul("fp32", 1e10)])  # a quick run keeps the mark with the peak
    assert peak.resolve_peak(cpu, "fp32")[1].startswith("bench (measured under load 8.0")
    monkeypatch.setattr(cache.os, "getloadavg", lambda: (0.4, 0.4, 0.4))
    assert cache.busy_machine() is None


def test_a_cpu_without_a_measured_peak_says_once_how_to_get_mfu(monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    from torch import nn

    from gputrain.observe import speed

    monkeypatch.setattr(speed.log, "propagate", True)
    monkeypatch.setattr(speed, "_mfu_hint_given", False)  # whatever ran before in this process
    meter = speed.SpeedMeter(nn.Linear(8, 8), torch.device("cpu"), "fp32", world_size=1, global_batch=4,
                             seq_len=None, breakdown_every=0)
    with meter.step_context():
        nn.Linear(8, 8)(torch.randn(4, 8)).sum().backward()
    with caplog.at_level("INFO", logger="gputrain"):
        fields = meter.summary_fields(steps=10, seconds=0.01)
    assert fields["mfu"] is None and fields["achieved_flops"]
    assert "MFU on a CPU needs a measured peak (CPUs have no datasheet figure): run `gputrain bench`" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="gputrain"):
        meter.summary_fields(steps=10, seconds=0.01)
    assert "needs a measured peak" not in caplog.text  # once per process


# ---------------------------------------------------------------- a CPU's peak per thread count
def _save_cpu(threads: int, value: float, mode: str = "full") -> None:
    from gputrain.bench import cache

    save_results(f"{cache._cpu_prefix()}{threads}", mode, [_matmul("fp32", value)])


@pytest.fixture
def threads() -> Iterator[Callable[[int], None]]:
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("measured", "run_threads", "expected", "source"),
    [
        ({1: 4e10, 2: 7e10}, 1, 4e10, "bench"),  # bench measured the run's own count: that figure
        ({1: 4e10, 2: 7e10}, 2, 7e10, "bench"),
        ({1: 4e10}, 2, 8e10, "bench (1 thread measured, scaled to 2)"),  # the best per thread, times the threads
        ({1: 4e10, 2: 7e10}, 3, 12e10, "bench (1 thread measured, scaled to 3)"),
        ({2: 7e10}, 1, 3.5e10, "bench (2 threads measured, scaled to 1)"),  # an older cache without 1 thread
        ({}, 1, None, None),
    ],
)
def test_a_cpu_run_finds_a_peak_for_the_threads_it_chose(threads, measured, run_threads, expected, source) -> None:
    for count, value in measured.items():
        _save_cpu(count, value)
    threads(run_threads)
    got, got_source = peak.resolve_peak(torch.device("cpu"), "fp32")
    assert (got, got_source) == (pytest.approx(expected) if expected else None, source)


def test_a_quick_bench_or_another_torch_gives_no_cpu_peak(threads, monkeypatch: pytest.MonkeyPatch) -> None:
    _save_cpu(1, 4e10, mode="quick")
    threads(1)
    assert peak.resolve_peak(torch.device("cpu"), "fp32") == (None, None)
    _save_cpu(1, 4e10)
    monkeypatch.setattr(torch, "__version__", "9.9.9")  # the figures were measured with another torch
    assert peak.resolve_peak(torch.device("cpu"), "fp32") == (None, None)


def _cpu_meter_summary(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> tuple[dict, str]:
    from torch import nn

    from gputrain.observe import speed

    monkeypatch.setattr(speed.log, "propagate", True)
    monkeypatch.setattr(speed, "_mfu_hint_given", False)
    meter = speed.SpeedMeter(nn.Linear(8, 8), torch.device("cpu"), "fp32", world_size=1, global_batch=4,
                             seq_len=None, breakdown_every=0)
    with meter.step_context():
        nn.Linear(8, 8)(torch.randn(4, 8)).sum().backward()
    with caplog.at_level("INFO", logger="gputrain"):
        fields = meter.summary_fields(steps=10, seconds=1.0)
    return fields, caplog.text


def test_after_a_full_bench_at_another_thread_count_a_run_reports_mfu_and_no_hint(
    threads, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _save_cpu(2, 7e10)  # bench on an idle 2-core machine; the run chose 1 thread under load
    threads(1)
    fields, log_text = _cpu_meter_summary(monkeypatch, caplog)
    assert 0 < fields["mfu"] < 1 and fields["mfu_peak_source"] == "bench (2 threads measured, scaled to 1)"
    assert "run `gputrain bench`" not in log_text


def test_after_a_quick_bench_the_hint_says_a_full_one_is_needed(
    threads, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    threads(1)
    _save_cpu(1, 4e10, mode="quick")
    fields, log_text = _cpu_meter_summary(monkeypatch, caplog)
    assert fields["mfu"] is None
    assert "run `gputrain bench` (without --quick: its small matrices do not set the peak) once" in log_text


def test_bench_on_several_threads_also_measures_one(threads, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from gputrain.bench import cache
    from gputrain.cli import main

    monkeypatch.setenv("GPUTRAIN_BENCH_TINY", "1")
    threads(2)
    assert main(["bench", "--device", "cpu", "--quick"]) == 0
    assert torch.get_num_threads() == 2  # given back
    one = cache.load_cached(f"{cache._cpu_prefix()}1")
    assert one is not None and {(r["bench"], r["dtype"]) for r in one["results"]} == {("matmul", "fp32"),
                                                                                      ("matmul", "bf16")}
    assert cache.load_cached(f"{cache._cpu_prefix()}2") is not None
    assert "matmul with 1 thread (a run on a busy machine uses 1): fp32 " in capsys.readouterr().out
