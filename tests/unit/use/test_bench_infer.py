"""gputrain bench-infer: one table of every mode against eager, and the figures in bench-infer.json."""

from __future__ import annotations

import json
import os

import pytest

from gputrain.cli import main
from gputrain.use.bench import BenchOptions, ModeResult, bench_inference, results_table
from gputrain.use.loaded import load_run
from tests.unit.use.conftest import needs_onnx

QUICK = ["--repeats", "3", "--batch", "1,4", "--device", "cpu", "--threads", "1"]


@needs_onnx
def test_the_table_times_each_mode_against_eager(tiny_run, capsys) -> None:
    run_dir = tiny_run("csv_regression")
    assert main(["bench-infer", str(run_dir), *QUICK, "--modes", "eager,export,onnxruntime", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "| device | mode | p50 ms (batch 1) | p99 ms (batch 1) | samples/s (batch 4) |" in out
    record = json.loads((run_dir / "bench-infer.json").read_text())
    rows = {r["mode"]: r for r in record["results"]}
    assert set(rows) == {"eager", "export", "onnxruntime"} and record["torch"] and record["cpu_threads"] == 1
    for row in rows.values():
        assert row["skipped"] is None and row["p50_ms"] > 0 and row["p99_ms"] >= row["p50_ms"]
        assert row["samples_per_s"] > 0 and (row["latency_batch"], row["throughput_batch"]) == (1, 4)
    assert rows["onnxruntime"]["runtime"].startswith("onnxruntime")
    # the table prints the recorded figures, each mode's speed-ups against eager's figures
    eager = rows["eager"]
    for mode, row in rows.items():
        latency, throughput = eager["p50_ms"] / row["p50_ms"], row["samples_per_s"] / eager["samples_per_s"]
        assert (f"| cpu | {mode} | {row['p50_ms']:.3f} | {row['p99_ms']:.3f} | {row['samples_per_s']:,.0f} | "
                f"{latency:.2f}x | {throughput:.2f}x |") in out, (mode, out)


def test_ratios_are_against_eager_on_the_same_device() -> None:
    results = [
        ModeResult("eager", "cpu", 1, 2.0, 3.0, 32, 100.0, 0.0),
        ModeResult("export", "cpu", 1, 1.0, 2.0, 32, 400.0, 1.0),
        ModeResult("onnxruntime", "cpu", 1, throughput_batch=32, skipped="onnxruntime not installed"),
    ]
    header, rows = results_table(results)
    assert header[5:7] == ["latency speed-up", "throughput speed-up"]
    assert rows[1][5:7] == ["2.00x", "4.00x"]
    assert rows[2][-1] == "skipped: onnxruntime not installed"


def test_a_language_model_also_reports_its_generation_rate(tiny_run, capsys) -> None:
    assert main(["bench-infer", str(tiny_run("text_gpt")), *QUICK, "--modes", "eager"]) == 0
    out = capsys.readouterr().out
    assert "generate on cpu, with the KV cache:" in out and "without the KV cache:" in out


def test_onnxruntime_missing_is_a_skipped_row_saying_how_to_install(tiny_run, monkeypatch) -> None:
    monkeypatch.setattr("gputrain.use.bench.missing_export_extra", lambda: ["onnxruntime"])
    loaded = load_run(tiny_run("csv_regression"), device="cpu")
    (row,) = bench_inference(loaded, BenchOptions(batches=(1, 2), modes=("onnxruntime",), devices=("cpu",), repeats=3))
    assert row.skipped is not None and "pip install 'gputrain[export]'" in row.skipped


def test_an_unknown_mode_is_a_usage_error(tiny_run, capsys) -> None:
    assert main(["bench-infer", str(tiny_run("csv_regression")), "--modes", "eager,tensorrt"]) == 2
    assert "--modes tensorrt: choose from eager, compile, export, aoti, onnxruntime" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("GPUTRAIN_TEST_COMPILE"),
    reason="torch.compile takes ~8 s on a 2-core CPU: set GPUTRAIN_TEST_COMPILE=1 (benchmarks/RESULTS.md's bench-infer "
    "tables time the compile mode)",
)
def test_torch_compile_is_timed_after_its_compilation(tiny_run) -> None:
    loaded = load_run(tiny_run("csv_regression"), device="cpu")
    (row,) = bench_inference(loaded, BenchOptions(batches=(1, 2), modes=("compile",), devices=("cpu",), repeats=3))
    assert row.skipped is None and row.setup_s is not None and row.setup_s > 0 and row.p50_ms is not None
    assert row.runtime == "torch.compile (inductor)"


def test_onnxruntime_asked_for_without_the_extra_says_how_to_install_it(tiny_run, monkeypatch, capsys) -> None:
    run_dir = tiny_run("csv_regression")
    capsys.readouterr()  # training's own output, when this test trains the run
    monkeypatch.setattr("gputrain.use.extras.missing_export_extra", lambda: ["onnxruntime"])
    assert main(["bench-infer", str(run_dir), "--modes", "eager,onnxruntime"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--modes onnxruntime needs onnxruntime, not installed: pip install 'gputrain[export]'" in err
    assert len(err.splitlines()) == 1
