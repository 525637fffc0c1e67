"""Benchmark results cached per machine, where training finds them for MFU.

The key is device name + driver + torch version: a driver or torch upgrade can move the
measured peak, so it invalidates the figures. The file is `$GPUTRAIN_CACHE_DIR/bench.json`, or
`~/.cache/gputrain/bench.json`:

    {"version": 1, "machines": {KEY: {"device_name", "driver", "torch", "mode", "measured_at",
                                      "peaks": {"fp32": FLOP/s, ...}, "peaks_measured_at",
                                      "results": [...]}}}

`peaks` come from the last full run only (see `save_results`).
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "CACHE_ENV",
    "cache_path",
    "cpu_peaks_by_threads",
    "device_name",
    "driver_version",
    "load_cached",
    "load_cached_peak",
    "machine_key",
    "save_results",
]

CACHE_ENV = "GPUTRAIN_CACHE_DIR"
_FORMAT_VERSION = 1


def cache_path() -> Path:
    """Where the cache lives: `$GPUTRAIN_CACHE_DIR/bench.json` or `~/.cache/gputrain/bench.json`."""
    root = os.environ.get(CACHE_ENV)
    return Path(root) / "bench.json" if root else Path.home() / ".cache" / "gputrain" / "bench.json"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def device_name(device: torch.device | str = "cpu") -> str:
    """The name results are filed under: the CUDA device name, or `cpu: <model> x<threads>`.

    Training passes the same name to `load_cached_peak`, so use this for CPUs. The thread count
    is part of a CPU's name because a container's share of cores sets its throughput.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu: {_cpu_model()} x{torch.get_num_threads()}"


def _cpu_prefix() -> str:
    """What every thread count's name of this CPU starts with (`device_name` less the count)."""
    return f"cpu: {_cpu_model()} x"


def driver_version() -> str | None:
    """The NVIDIA driver version from NVML, or None without a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - ImportError or any NVMLError: no driver to speak of
        return None
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    finally:
        pynvml.nvmlShutdown()


def machine_key(device_name_: str | None = None) -> str:
    """`<device name> | driver <version> | torch <version>`: figures are valid for that only.

    Args:
        device_name_: as `device_name()` gives it; default the first GPU, else the CPU.
    """
    if device_name_ is None:
        device_name_ = device_name("cuda" if torch.cuda.is_available() else "cpu")
    # A CPU's speed does not depend on the GPU driver, so CPU keys leave it out.
    driver = "-" if device_name_.startswith("cpu:") else (driver_version() or "none")
    return f"{device_name_} | driver {driver} | torch {torch.__version__}"


def _read() -> dict[str, Any]:
    try:
        data = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {"version": _FORMAT_VERSION, "machines": {}}
    if not isinstance(data, dict) or data.get("version") != _FORMAT_VERSION:
        return {"version": _FORMAT_VERSION, "machines": {}}
    data.setdefault("machines", {})
    return data


def save_results(device_name_: str, mode: str, results: list[dict[str, Any]], suspect: str | None = None) -> Path:
    """File these results under this machine's key; a full run's matmul figures also become the
    peak per dtype that MFU is measured against.

    Only a full run sets the peak: `--quick` multiplies smaller matrices (4096² on a GPU), which
    do not reach the device's peak, and a peak set too low inflates every MFU. A quick run keeps
    the peak of an earlier full run. `suspect` says why the figures may be low (a busy machine):
    kept with the peaks, so an MFU measured against them says so. The write is atomic (temp file +
    rename), so a concurrent reader never sees half a file.
    """
    key = machine_key(device_name_)
    data = _read()
    previous = data["machines"].get(key, {})
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if mode == "full":
        peaks: dict[str, float] = {}
        for r in results:
            if r["bench"] == "matmul" and r["unit"] == "FLOP/s":
                peaks[r["dtype"]] = max(peaks.get(r["dtype"], 0.0), float(r["value"]))
        peaks_measured_at: str | None = now
        peaks_suspect = suspect
    else:
        peaks, peaks_measured_at = previous.get("peaks", {}), previous.get("peaks_measured_at")
        peaks_suspect = previous.get("peaks_suspect")
    data["machines"][key] = {
        "device_name": device_name_,
        "driver": key.split(" | ")[1].removeprefix("driver "),
        "torch": torch.__version__,
        "mode": mode,
        "measured_at": now,
        "peaks": peaks,
        "peaks_measured_at": peaks_measured_at,
        "peaks_suspect": peaks_suspect,
        "results": results,
    }
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".bench-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)
    return path


def load_cached(device_name_: str) -> dict[str, Any] | None:
    """This machine's cached entry for `device_name_`, or None."""
    return _read()["machines"].get(machine_key(device_name_))


def busy_machine() -> str | None:
    """Why figures measured now would be low, or None: other processes keep this machine's cores
    busy (the 1-minute load average, read before a benchmark starts, is over half the cores)."""
    try:
        load = os.getloadavg()[0]
        cores = len(os.sched_getaffinity(0))
    except (OSError, AttributeError):
        return None
    return f"measured under load {load:.1f} on {cores} cores" if load > 0.5 * cores else None


def load_cached_peak(device_name: str, dtype: str) -> float | None:
    """Measured matmul FLOP/s for `dtype` on this machine (same driver and torch), or None.

    Args:
        device_name: `torch.cuda.get_device_name()` for a GPU; `gputrain.bench.cache.device_name("cpu")`
            for the CPU.
        dtype: "fp32", "tf32", "bf16" or "fp16".
    """
    entry = load_cached(device_name)
    if entry is None:
        return None
    value = entry.get("peaks", {}).get(dtype)
    return float(value) if value else None


def cpu_peaks_by_threads(dtype: str) -> dict[int, tuple[float, str | None]]:
    """This CPU's measured matmul peaks for `dtype` (same torch), by the thread count they were
    measured with: {threads: (FLOP/s, why it may be low or None)}. A run picks its thread count
    from the load when it starts (env/threads.py), often not the one `gputrain bench` ran with."""
    prefix = _cpu_prefix()
    found: dict[int, tuple[float, str | None]] = {}
    for key, entry in _read()["machines"].items():
        name = str(entry.get("device_name", ""))
        count = name.removeprefix(prefix)
        if not name.startswith(prefix) or not count.isdigit() or key != machine_key(name):
            continue
        value = (entry.get("peaks") or {}).get(dtype)
        if value:
            found[int(count)] = (float(value), entry.get("peaks_suspect"))
    return found
