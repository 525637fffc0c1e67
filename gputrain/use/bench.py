"""`bench-infer`: how fast a run's model serves, in each runtime, against eager PyTorch.

Every mode runs the served model (preprocessing inside, fp32, eval mode) on held-out samples of
the run's data, tiled to the batch size:
- eager: the module as it is;
- compile: `torch.compile` (the compilation happens in the warm-up, untimed, and is reported);
- export: the `torch.export` ExportedProgram's module;
- aoti: its AOTInductor package (only when asked: compiling takes tens of seconds on a CPU);
- onnxruntime: the ONNX export in ONNX Runtime (its CUDA provider on a GPU where installed). Its
  timings include handing numpy arrays in and out, which the PyTorch modes do not pay.

Timing is gputrain.bench.timing's: warm-up first, then each call timed on its own (CUDA events on a
GPU). Latency is the p50 and p99 of single calls at the smallest batch; throughput is samples per
second at the largest, from the median call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gputrain.bench.timing import measure
from gputrain.errors import UsageError
from gputrain.use import artifacts
from gputrain.use.extras import INSTALL_HINT, missing_export_extra, require_export_extra
from gputrain.use.held_out import example_pair, held_out_batch, tile
from gputrain.use.loaded import LoadedRun
from gputrain.use.options import use_device

MODES = ("eager", "compile", "export", "aoti", "onnxruntime")
DEFAULT_MODES = ("eager", "compile", "export", "onnxruntime")
WARMUP_S = 0.3
"""Warm-up time at least, per mode and batch size: a CPU's thread pool and clocks take a fraction of
a second to come up to speed (gputrain/bench/timing.py), more than a tiny model's few calls."""


@dataclass(frozen=True, slots=True)
class ModeResult:
    mode: str
    device: str
    latency_batch: int
    p50_ms: float | None = None
    p99_ms: float | None = None
    throughput_batch: int = 0
    samples_per_s: float | None = None
    setup_s: float | None = None
    """Compiling or exporting before the first call."""
    runtime: str = ""
    skipped: str | None = None
    """Why the mode did not run (a missing package, no such provider)."""


@dataclass(frozen=True, slots=True)
class BenchOptions:
    batches: tuple[int, ...] = (1, 32)
    modes: tuple[str, ...] = DEFAULT_MODES
    devices: tuple[str, ...] = ()
    """Empty: the CPU, and CUDA where there is a GPU."""
    repeats: int = 100
    warmup: int = 10
    budget_s: float = 5.0
    """Timed seconds per mode and batch at most (fewer repeats on a slow machine)."""
    threads: int | None = None
    """CPU threads of PyTorch and ONNX Runtime alike (default: each its own, usually one per core)."""


def check_modes(modes: tuple[str, ...], *, asked: bool = False) -> None:
    """Raises UsageError for an unknown mode, or for onnxruntime `asked` for by name without the
    export extra (left to the defaults, its row says it was skipped and how to install it)."""
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise UsageError(f"--modes {','.join(unknown)}: choose from {', '.join(MODES)}")
    if asked and "onnxruntime" in modes:
        require_export_extra("--modes onnxruntime")


def bench_inference(loaded: LoadedRun, options: BenchOptions) -> list[ModeResult]:
    """Every (device, mode) of `options`, timed (module docstring)."""
    check_modes(options.modes)
    held = held_out_batch(loaded, max(options.batches))
    inputs = {b: tile(held.raw, b) for b in options.batches}
    results = []
    with _cpu_threads(options.threads):
        for name in bench_devices(options.devices):
            device = torch.device(name)
            served = loaded.served().to(device)
            for mode in options.modes:
                results.append(_bench_mode(mode, served, inputs, loaded, device, options))
    return results


@contextlib.contextmanager
def _cpu_threads(threads: int | None) -> Iterator[None]:
    """PyTorch's intra-op threads set to `threads` for the block (ONNX Runtime's are set per session)."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def bench_devices(asked: tuple[str, ...]) -> tuple[str, ...]:
    """The devices asked for, each checked to be on this machine (the `use` commands' check);
    none asked: the CPU, and CUDA where there is a GPU. Every name comes out as `use_device` spells
    it (`cuda:0`), so the answer passed back in (the CLI checks first, bench_inference again) is
    itself: the same names in the figures whichever way the devices were given.

    Raises:
        UsageError: a device that is unknown or not here, in one line.
    """
    names = asked or (("cpu", "cuda") if torch.cuda.is_available() else ("cpu",))
    return tuple(dict.fromkeys(str(use_device(name)) for name in names))


def _bench_mode(
    mode: str,
    served: torch.nn.Module,
    inputs: dict[int, torch.Tensor],
    loaded: LoadedRun,
    device: torch.device,
    options: BenchOptions,
) -> ModeResult:
    small, large = min(inputs), max(inputs)
    base = ModeResult(mode, str(device), small, throughput_batch=large)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gputrain-bench-infer-") as work:
        try:
            prepared = _prepare(mode, served, inputs[large], loaded, device, Path(work), options)
        except _Skip as skip:
            return dataclasses.replace(base, skipped=str(skip))
        call, runtime, on_host = prepared
        batches = {b: (x if on_host else x.to(device)) for b, x in inputs.items()}
        call(batches[small])  # compiles, where the mode compiles: the setup time
        setup_s = time.perf_counter() - start
        clock_device = "cpu" if on_host else device  # onnxruntime returns host arrays: host clock
        latency = measure(
            lambda: call(batches[small]),
            clock_device,
            warmup=options.warmup,
            repeats=options.repeats,
            budget_s=options.budget_s,
            min_warmup_s=WARMUP_S,
        )
        throughput = measure(
            lambda: call(batches[large]),
            clock_device,
            warmup=max(1, options.warmup // 5),
            repeats=max(3, options.repeats // 5),
            budget_s=options.budget_s,
            min_warmup_s=WARMUP_S,
        )
    times_ms = np.array(latency.times_s) * 1000
    return dataclasses.replace(
        base,
        p50_ms=float(np.percentile(times_ms, 50)),
        p99_ms=float(np.percentile(times_ms, 99)),
        samples_per_s=large / throughput.median_s,
        setup_s=setup_s,
        runtime=runtime,
    )


class _Skip(Exception):
    """A mode that cannot run here: the reason goes into its row."""


def _prepare(
    mode: str,
    served: torch.nn.Module,
    example: torch.Tensor,
    loaded: LoadedRun,
    device: torch.device,
    work: Path,
    options: BenchOptions,
) -> tuple[Callable[[torch.Tensor], Any], str, bool]:
    """(the call, what runs it, whether it takes host tensors)."""
    if mode == "eager":
        return _no_grad(served), f"torch {torch.__version__}", False
    if mode == "compile":
        return _no_grad(torch.compile(served)), "torch.compile (inductor)", False
    example = example_pair(example).to(device)
    if mode in ("export", "aoti"):
        program = artifacts.export_program(served, example, loaded.pre)  # type: ignore[arg-type]
        if mode == "export":
            return _no_grad(program.module()), "torch.export ExportedProgram.module()", False
        try:
            package = artifacts.compile_aoti(program, work)
        except Exception as err:  # noqa: BLE001 - no compiler here: the row says so
            raise _Skip(f"AOTInductor cannot compile here ({str(err).strip()[:120]})") from None
        run = artifacts.load_aoti(work / package, device)  # compiled just now into this process's private folder
        return run, "AOTInductor", False
    missing = missing_export_extra()
    if missing:
        raise _Skip(f"{', '.join(missing)} not installed: {INSTALL_HINT}")
    artifacts.write_onnx(served, example, loaded.pre, work)  # type: ignore[arg-type]
    run, runtime = artifacts.load_onnx(work, device, options.threads)
    if device.type == "cuda" and "CUDA" not in runtime:
        raise _Skip("onnxruntime has no CUDA provider here (pip install onnxruntime-gpu)")
    return run, runtime, True


def _no_grad(module: Callable[[torch.Tensor], Any]) -> Callable[[torch.Tensor], Any]:
    def call(x: torch.Tensor) -> Any:
        with torch.no_grad():
            return module(x)

    return call


def results_table(results: list[ModeResult]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) with each mode's ratios against eager on the same device."""
    eager = {r.device: r for r in results if r.mode == "eager" and r.skipped is None}
    small = results[0].latency_batch if results else 1
    large = results[0].throughput_batch if results else 1
    header = [
        "device",
        "mode",
        f"p50 ms (batch {small})",
        f"p99 ms (batch {small})",
        f"samples/s (batch {large})",
        "latency speed-up",
        "throughput speed-up",
        "setup s",
    ]
    rows = []
    for r in results:
        if r.skipped is not None:
            rows.append([r.device, r.mode, "—", "—", "—", "—", "—", f"skipped: {r.skipped}"])
            continue
        ref = eager.get(r.device)
        assert r.p50_ms is not None and r.p99_ms is not None and r.samples_per_s is not None
        speedup = f"{ref.p50_ms / r.p50_ms:.2f}x" if ref is not None and ref.p50_ms else "—"
        gain = f"{r.samples_per_s / ref.samples_per_s:.2f}x" if ref is not None and ref.samples_per_s else "—"
        rows.append(
            [
                r.device,
                r.mode,
                f"{r.p50_ms:.3f}",
                f"{r.p99_ms:.3f}",
                f"{r.samples_per_s:,.0f}",
                speedup,
                gain,
                f"{r.setup_s:.1f}" if r.setup_s is not None else "",
            ]
        )
    return header, rows


@dataclass(frozen=True, slots=True)
class GenerationRate:
    device: str
    cache: bool
    tokens_per_s: float


def generation_rates(loaded: LoadedRun, devices: tuple[str, ...], new_tokens: int = 64) -> list[GenerationRate]:
    """A language model's sampling speed (one sequence, greedy, from a one-token prompt), with and
    without the KV cache, on each device."""
    from gputrain.models.gpt import GPT
    from gputrain.use.generate import Sampling, generate

    if not isinstance(loaded.model, GPT):
        return []
    rates = []
    for name in bench_devices(devices):
        model = loaded.model.to(torch.device(name))
        sampling = Sampling(max_new_tokens=new_tokens, temperature=0.0)
        for cache in (True, False):
            list(generate(model, [0], Sampling(max_new_tokens=4, temperature=0.0), use_cache=cache))  # warm-up
            start = time.perf_counter()
            for token in generate(model, [0], sampling, use_cache=cache):
                token.item()  # each token reaches the host, as when it is printed
            rates.append(GenerationRate(name, cache, new_tokens / (time.perf_counter() - start)))
    loaded.model.to(loaded.device)
    return rates
