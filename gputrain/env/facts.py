"""Collect facts about the machine as plain data: no judgements here (those live in `checks`).

`collect_env()` must stay cheap (the trainer calls it for every run's `env.json`): it reads
torch's build info, NVML (nvidia-ml-py) and a few files, and only runs `nvidia-smi` when NVML
itself cannot be loaded but the tool exists.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from gputrain.distributed.allocator import AllocatorFacts, collect_allocator_facts
from gputrain.env.driver import DriverFacts, GpuFacts, collect_driver

__all__ = [
    "DistFacts",
    "DriverFacts",
    "EnvReport",
    "GpuFacts",
    "ShmFacts",
    "TorchInstall",
    "collect_env",
    "collect_shm",
    "collect_torch_installs",
]

TorchBuild = Literal["cuda", "rocm", "cpu"]


@dataclass(kw_only=True)
class TorchInstall:
    """One copy of the `torch` package found on `sys.path`."""

    path: str
    """Directory holding the `torch/` package (a `sys.path` entry)."""
    version: str | None
    """Version from the neighbouring `torch-*.dist-info`, when there is one."""


@dataclass(kw_only=True)
class ShmFacts:
    """Size of `/dev/shm`, where DataLoader workers pass batches to the main process."""

    path: str
    total_bytes: int
    free_bytes: int


@dataclass(kw_only=True)
class DistFacts:
    """Result of the all-reduce smoke test (`gputrain doctor --dist`)."""

    backend: str
    world_size: int
    ok: bool
    seconds: float
    failed_rank: int | None = None
    """The first rank that failed (crashed, gave a wrong sum, or timed out)."""
    error: str | None = None


@dataclass(kw_only=True)
class EnvReport:
    """Everything the doctor knows about the machine. Serialisable with `to_dict()`."""

    python: str
    python_executable: str
    platform: str
    cpu_count: int
    memory_total_bytes: int | None
    torch: str
    torch_path: str
    torch_build: TorchBuild
    torch_cuda: str | None
    """CUDA runtime the wheel was built for (`torch.version.cuda`), None for CPU/ROCm builds."""
    torch_hip: str | None
    cuda_available: bool
    device_count: int
    mps_available: bool
    """Apple-silicon GPU through a macOS build of torch (which has no CUDA)."""
    cuda_visible_devices: str | None
    cudnn_version: int | None
    nccl_version: str | None
    driver: DriverFacts
    gpus: list[GpuFacts] = field(default_factory=list)
    torch_installs: list[TorchInstall] = field(default_factory=list)
    shm: ShmFacts | None = None
    dist: DistFacts | None = None
    allocator: AllocatorFacts | None = None
    """What decides the C allocator of the ranks gputrain starts (distributed/allocator.py)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable dict (what `env.json` and `doctor --json` hold under "facts")."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EnvReport:
        """Rebuild a report from `to_dict()` output (recorded facts in tests, old `env.json`)."""
        # Keys this version does not know (an env.json from a newer gputrain) are dropped.
        data = {k: v for k, v in data.items() if k in {f.name for f in dataclasses.fields(cls)}}
        data.setdefault("mps_available", False)
        data["driver"] = DriverFacts(**data["driver"])
        data["gpus"] = [GpuFacts(**g) for g in data.get("gpus", [])]
        data["torch_installs"] = [TorchInstall(**t) for t in data.get("torch_installs", [])]
        data["shm"] = ShmFacts(**data["shm"]) if data.get("shm") else None
        data["dist"] = DistFacts(**data["dist"]) if data.get("dist") else None
        known = {f.name for f in dataclasses.fields(AllocatorFacts)}
        allocator = data.get("allocator")
        data["allocator"] = AllocatorFacts(**{k: v for k, v in allocator.items() if k in known}) if allocator else None
        return cls(**data)


def _torch_build() -> TorchBuild:
    if getattr(torch.version, "hip", None):
        return "rocm"
    return "cuda" if torch.version.cuda else "cpu"


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend and backend.is_available())


def _nccl_version() -> str | None:
    if not torch.version.cuda:
        return None  # CPU builds have no NCCL binding at all
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    return ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)


def _memory_total() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _cpu_count() -> int:
    # The affinity mask is what a container or `taskset` actually grants; os.cpu_count() is the host.
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _dist_info_version(entry: str) -> str | None:
    try:
        names = os.listdir(entry)
    except OSError:
        return None
    for name in names:
        if name.startswith("torch-") and name.endswith((".dist-info", ".egg-info")):
            return name[len("torch-") :].rsplit(".", 1)[0]
    return None


def collect_torch_installs(paths: list[str] | None = None) -> list[TorchInstall]:
    """Every distinct `torch` package on `paths` (default `sys.path`), in import order."""
    found: list[TorchInstall] = []
    seen: set[str] = set()
    for entry in sys.path if paths is None else paths:
        entry = entry or os.getcwd()
        if not os.path.isfile(os.path.join(entry, "torch", "__init__.py")):
            continue
        real = os.path.realpath(entry)
        if real in seen:
            continue
        seen.add(real)
        found.append(TorchInstall(path=entry, version=_dist_info_version(entry)))
    return found


def collect_shm(path: str = "/dev/shm") -> ShmFacts | None:
    """Size of the shared-memory file system, or None where there is none (macOS, Windows)."""
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):
        return None
    return ShmFacts(path=path, total_bytes=st.f_blocks * st.f_frsize, free_bytes=st.f_bavail * st.f_frsize)


def collect_env() -> EnvReport:
    """Gather the facts about this machine: Python, torch build, driver, GPUs, /dev/shm.

    Cheap (well under a second, no subprocess unless NVML is missing while nvidia-smi exists)
    and free of judgements: `gputrain.env.checks.run_checks` reads the result.
    """
    cuda_available = torch.cuda.is_available()
    driver, nvml_gpus = collect_driver()
    return EnvReport(
        python=platform.python_version(),
        python_executable=sys.executable,
        platform=platform.platform(),
        cpu_count=_cpu_count(),
        memory_total_bytes=_memory_total(),
        torch=torch.__version__,
        torch_path=os.path.dirname(os.path.dirname(torch.__file__)),
        torch_build=_torch_build(),
        torch_cuda=torch.version.cuda,
        torch_hip=getattr(torch.version, "hip", None),
        cuda_available=cuda_available,
        device_count=torch.cuda.device_count() if cuda_available else 0,
        mps_available=_mps_available(),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        cudnn_version=torch.backends.cudnn.version() if cuda_available else None,
        nccl_version=_nccl_version(),
        driver=driver,
        gpus=nvml_gpus or _torch_gpus(cuda_available),
        torch_installs=collect_torch_installs(),
        shm=collect_shm(),
        allocator=collect_allocator_facts(),
    )


def _torch_gpus(cuda_available: bool) -> list[GpuFacts]:
    """GPU facts from torch alone, for when NVML is missing (ROCm, some containers)."""
    if not cuda_available:
        return []
    gpus = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        gpus.append(
            GpuFacts(
                index=i,
                name=props.name,
                memory_total_bytes=props.total_memory,
                memory_used_bytes=None,
                capability=f"{props.major}.{props.minor}",
                utilization_pct=None,
                temperature_c=None,
                mig_enabled=None,
            )
        )
    return gpus
