"""Facts about the NVIDIA driver and the physical GPUs, read through NVML (nvidia-ml-py).

NVML sees every GPU on the machine whatever `CUDA_VISIBLE_DEVICES` says, which is exactly what
the doctor needs to tell "no GPU" from "GPUs hidden from this process".
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

__all__ = ["DriverFacts", "GpuFacts", "collect_driver", "count_pci_gpus", "find_libcuda"]

# Where distributions and the CUDA images put the driver's user-space library. Scanning files is
# cheaper than ctypes.util.find_library, which shells out to ldconfig (and gcc) on Linux.
_LIBCUDA_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/usr/local/cuda/compat",
    "/usr/lib/wsl/lib",
)


@dataclass(kw_only=True)
class GpuFacts:
    """One physical GPU as NVML (or, without NVML, torch) reports it."""

    index: int
    name: str
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    capability: str | None
    """CUDA compute capability "major.minor" (8.0 and later have bf16 and tf32 tensor cores)."""
    utilization_pct: int | None
    temperature_c: int | None
    mig_enabled: bool | None
    bf16: bool | None = None
    tf32: bool | None = None

    def __post_init__(self) -> None:
        # Both arrive with Ampere tensor cores (compute capability 8.0).
        if self.capability and self.bf16 is None:
            self.bf16 = _capability_at_least(self.capability, 8, 0)
        if self.capability and self.tf32 is None:
            self.tf32 = _capability_at_least(self.capability, 8, 0)


@dataclass(kw_only=True)
class DriverFacts:
    """Whether an NVIDIA driver is installed, its version and the newest CUDA it supports."""

    libcuda_path: str | None
    nvidia_smi_path: str | None
    proc_driver: bool
    """`/proc/driver/nvidia/version` exists (the kernel module is loaded)."""
    driver_version: str | None
    driver_cuda_version: str | None
    """Newest CUDA runtime the driver supports, "major.minor" (NVML's CUDA driver version)."""
    nvml_gpu_count: int | None
    """Physical GPUs NVML counts (None when NVML could not be loaded)."""
    nvml_error: str | None
    pci_gpus: int | None = None
    """NVIDIA display and 3D controllers on the PCI bus (sysfs): GPUs whether or not a driver is
    installed. None where sysfs cannot be read (macOS, Windows, some sandboxes) or in old env.json."""

    @property
    def present(self) -> bool:
        """Any sign of an NVIDIA driver at all."""
        return bool(self.libcuda_path or self.nvidia_smi_path or self.proc_driver or self.driver_version)


def _capability_at_least(capability: str, major: int, minor: int) -> bool:
    try:
        got = tuple(int(x) for x in capability.split(".")[:2])
    except ValueError:
        return False
    return got >= (major, minor)


def find_libcuda(extra_dirs: list[str] | None = None) -> str | None:
    """Path of the driver's `libcuda.so.1`, or None when no driver library is found."""
    dirs = list(extra_dirs or [])
    dirs += [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    dirs += list(_LIBCUDA_DIRS)
    for d in dirs:
        for name in ("libcuda.so.1", "libcuda.so"):
            path = os.path.join(d, name)
            if os.path.exists(path):
                return path
    return None


# PCI vendor id of NVIDIA, and the base class of display controllers (0x0300 VGA, 0x0302 3D:
# every NVIDIA GPU; NVSwitches and audio functions are other classes).
_NVIDIA_VENDOR = "0x10de"
_DISPLAY_CLASS = "0x03"


def count_pci_gpus(root: str = "/sys/bus/pci/devices") -> int | None:
    """NVIDIA GPUs on the PCI bus as Linux lists them, or None where the bus cannot be read."""
    try:
        devices = os.listdir(root)
    except OSError:
        return None
    count = 0
    for device in devices:
        try:
            with open(os.path.join(root, device, "vendor")) as vendor, open(os.path.join(root, device, "class")) as cls:
                if vendor.read().strip().lower() == _NVIDIA_VENDOR and cls.read().strip().startswith(_DISPLAY_CLASS):
                    count += 1
        except OSError:
            continue
    return count


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_gpu(pynvml: Any, index: int) -> GpuFacts:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)

    def optional(fn: Any, *args: Any) -> Any:
        # Telemetry that a given GPU or vGPU does not expose is "unknown", not an error.
        try:
            return fn(handle, *args)
        except pynvml.NVMLError:
            return None

    memory = optional(pynvml.nvmlDeviceGetMemoryInfo)
    util = optional(pynvml.nvmlDeviceGetUtilizationRates)
    capability = optional(pynvml.nvmlDeviceGetCudaComputeCapability)
    mig = optional(pynvml.nvmlDeviceGetMigMode)
    return GpuFacts(
        index=index,
        name=_text(pynvml.nvmlDeviceGetName(handle)),
        memory_total_bytes=int(memory.total) if memory else None,
        memory_used_bytes=int(memory.used) if memory else None,
        capability=f"{capability[0]}.{capability[1]}" if capability else None,
        utilization_pct=int(util.gpu) if util else None,
        temperature_c=optional(pynvml.nvmlDeviceGetTemperature, pynvml.NVML_TEMPERATURE_GPU),
        mig_enabled=bool(mig[0]) if mig else None,
    )


def _collect_nvml() -> tuple[dict[str, Any], list[GpuFacts]]:
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return {"nvml_error": "nvidia-ml-py is not installed"}, []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return {"nvml_error": f"{type(err).__name__}: {err}"}, []
    try:
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()  # e.g. 12040 -> "12.4"
        count = pynvml.nvmlDeviceGetCount()
        facts = {
            "driver_version": _text(pynvml.nvmlSystemGetDriverVersion()),
            "driver_cuda_version": f"{cuda // 1000}.{(cuda % 1000) // 10}",
            "nvml_gpu_count": int(count),
            "nvml_error": None,
        }
        return facts, [_nvml_gpu(pynvml, i) for i in range(count)]
    except pynvml.NVMLError as err:
        return {"nvml_error": f"{type(err).__name__}: {err}"}, []
    finally:
        pynvml.nvmlShutdown()


def _nvidia_smi_driver(smi: str) -> str | None:
    """Driver version from nvidia-smi: the fallback when NVML cannot be loaded."""
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def collect_driver() -> tuple[DriverFacts, list[GpuFacts]]:
    """The driver facts and the GPUs NVML sees (an empty list without NVML)."""
    nvml, gpus = _collect_nvml()
    smi = shutil.which("nvidia-smi")
    driver_version = nvml.get("driver_version")
    if driver_version is None and smi:
        driver_version = _nvidia_smi_driver(smi)
    facts = DriverFacts(
        libcuda_path=find_libcuda(),
        nvidia_smi_path=smi,
        proc_driver=os.path.exists("/proc/driver/nvidia/version"),
        driver_version=driver_version,
        driver_cuda_version=nvml.get("driver_cuda_version"),
        nvml_gpu_count=nvml.get("nvml_gpu_count"),
        nvml_error=nvml.get("nvml_error"),
        pci_gpus=count_pci_gpus(),
    )
    return facts, gpus
