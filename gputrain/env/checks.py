"""Judge the facts: each `check_*` reads an `EnvReport` only and says ok, warn or fail.

A `fail` means something this machine has cannot be used until it is fixed (a GPU that torch
cannot reach, a broken all-reduce), or, with `require_gpu`, that there is no GPU to train on;
`warn` means it works but slower or less reliably than it should. Every non-ok result carries
the fix. A machine without any GPU is healthy: training runs on the CPU, and nothing there asks
for a CUDA build or a driver.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from gputrain.distributed.allocator import ALLOCATOR_ENV, CUDA_ALLOC_SETTING, choose_allocator, launched_rank_choice
from gputrain.env.facts import EnvReport, GpuFacts
from gputrain.errors import UsageError
from gputrain.torch_builds import PYTORCH_INDEX

__all__ = [
    "CHECKS",
    "Check",
    "Status",
    "check_allocator",
    "check_cuda_available",
    "check_cuda_visible_devices",
    "check_cudnn",
    "check_dist",
    "check_driver",
    "check_driver_cuda_version",
    "check_gpus",
    "check_nccl",
    "check_python",
    "check_shm",
    "check_torch_build",
    "check_torch_installs",
    "check_torch_version",
    "gpu_present",
    "passed",
    "run_checks",
    "why_cuda_unavailable",
]

Status = Literal["ok", "warn", "fail"]

# CUDA variants of the torch wheels (newest first); the default when the driver is unknown.
WHEEL_CUDA_VERSIONS = ("13.0", "12.8", "12.6")
DEFAULT_WHEEL_CUDA = "12.8"
MIN_PYTHON = (3, 10)
MIN_TORCH = (2, 10)
# DataLoader workers hand every batch over through /dev/shm; Docker's default is 64 MiB.
MIN_SHM_BYTES = 1 << 30
GIB = 1 << 30


@dataclass(frozen=True)
class Check:
    """One judgement: `fix` is set whenever `status` is not ok."""

    name: str
    status: Status
    detail: str
    fix: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _version_tuple(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    parts = []
    for piece in text.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            return None
        parts.append(int(digits))
    return tuple(parts)


def _gpus_exist(f: EnvReport) -> bool:
    return bool(f.driver.nvml_gpu_count) or bool(f.gpus)


def gpu_present(f: EnvReport) -> bool:
    """Any sign of a GPU on this machine, usable by torch or not: one torch sees, NVML's or the PCI
    bus's NVIDIA GPUs, a loaded NVIDIA kernel module (/proc/driver/nvidia) or a driver that answers,
    Apple's MPS, or a ROCm build (installed for an AMD GPU). A CUDA library or nvidia-smi alone is
    no sign: CUDA container images carry them on machines without a GPU."""
    d = f.driver
    return bool(
        f.cuda_available
        or f.mps_available
        or f.torch_build == "rocm"
        or f.gpus
        or d.nvml_gpu_count
        or d.pci_gpus
        or d.proc_driver
        or d.driver_version
    )


def _no_gpu_detail(f: EnvReport) -> str:
    where = "on the PCI bus, " if f.driver.pci_gpus is not None else ""
    return f"no GPU on this machine (no NVIDIA GPU {where}no NVIDIA driver, no Apple MPS)"


def check_python(f: EnvReport) -> Check:
    got = _version_tuple(f.python)
    if got is not None and got < MIN_PYTHON:
        return Check(
            "python", "fail", f"Python {f.python} is older than gputrain supports (3.10)", "use Python 3.10 or newer"
        )
    return Check("python", "ok", f"Python {f.python} ({f.python_executable})")


def check_torch_version(f: EnvReport) -> Check:
    got = _version_tuple(f.torch)
    if got is not None and got < MIN_TORCH:
        return Check(
            "torch version",
            "fail",
            f"torch {f.torch} is older than gputrain supports (2.10)",
            "pip install -U 'torch>=2.10'",
        )
    return Check("torch version", "ok", f"torch {f.torch} ({f.torch_path})")


def install_cuda_build(driver_cuda: str | None) -> str:
    """The fix for a CPU-only wheel: the newest CUDA wheel the driver can run."""
    have = _version_tuple(driver_cuda)
    cuda = DEFAULT_WHEEL_CUDA
    if have is not None:
        fitting = [v for v in WHEEL_CUDA_VERSIONS if (_version_tuple(v) or (0,)) <= have]
        if not fitting:
            return (
                f"upgrade the NVIDIA driver (it supports CUDA {driver_cuda}; torch wheels need "
                f"{WHEEL_CUDA_VERSIONS[-1]} or newer), then install a CUDA build of torch"
            )
        cuda = fitting[0]
    tag = "cu" + cuda.replace(".", "")
    return f"install a CUDA build: pip install torch --index-url {PYTORCH_INDEX}/{tag}"


def check_torch_build(f: EnvReport) -> Check:
    """A `+cpu` wheel is the most common reason for "no CUDA device" on a machine with a GPU."""
    if f.torch_build == "cpu" and not gpu_present(f):
        return Check("torch build", "ok", f"torch {f.torch}: CPU-only build, and this machine has no GPU")
    if f.torch_build == "cpu" and f.mps_available:
        return Check("torch build", "ok", f"torch {f.torch}: macOS build, Apple GPU through MPS")
    if f.torch_build == "cpu":
        return Check(
            "torch build",
            "fail",
            f"torch {f.torch} is a CPU-only build: it cannot use any GPU",
            install_cuda_build(f.driver.driver_cuda_version),
        )
    if f.torch_build == "rocm":
        return Check("torch build", "ok", f"ROCm build (HIP {f.torch_hip})")
    return Check("torch build", "ok", f"CUDA build (CUDA runtime {f.torch_cuda})")


def check_driver(f: EnvReport) -> Check | None:
    if f.torch_build == "rocm" or f.mps_available or not gpu_present(f):
        return None  # AMD and Apple GPUs, or none: the NVIDIA driver is irrelevant
    d = f.driver
    if not d.present:
        return Check(
            "nvidia driver",
            "fail",
            "no NVIDIA driver found (no libcuda, no nvidia-smi, no /proc/driver/nvidia)",
            "install the NVIDIA driver (or run on a machine with an NVIDIA GPU)",
        )
    if d.driver_version is None:
        return Check(
            "nvidia driver",
            "warn",
            f"driver files found but NVML cannot read the driver ({d.nvml_error})",
            "check the driver install (nvidia-smi should list the GPUs); reboot after a driver upgrade",
        )
    return Check("nvidia driver", "ok", f"driver {d.driver_version}, supports CUDA {d.driver_cuda_version or '?'}")


def check_driver_cuda_version(f: EnvReport) -> Check | None:
    """The driver's newest CUDA (from NVML) against the runtime the wheel was built with."""
    need, have = _version_tuple(f.torch_cuda), _version_tuple(f.driver.driver_cuda_version)
    if need is None or have is None:
        return None
    detail = (
        f"driver {f.driver.driver_version} supports CUDA {f.driver.driver_cuda_version}, "
        f"torch was built for CUDA {f.torch_cuda}"
    )
    if have[0] < need[0]:
        return Check(
            "driver vs CUDA runtime",
            "fail",
            f"driver too old: {detail}",
            f"upgrade the NVIDIA driver to one supporting CUDA {f.torch_cuda}, or install a "
            f"torch wheel built for CUDA {f.driver.driver_cuda_version} or older",
        )
    if have < need:
        # Same major: CUDA minor-version compatibility runs it, but without PTX JIT.
        return Check(
            "driver vs CUDA runtime",
            "warn",
            f"driver older than the runtime: {detail} "
            "(runs via minor-version compatibility; kernels needing PTX JIT fail)",
            f"upgrade the NVIDIA driver to one supporting CUDA {f.torch_cuda}",
        )
    return Check("driver vs CUDA runtime", "ok", detail)


def _hides_every_gpu(visible: str, gpu_count: int | None) -> bool:
    # CUDA exposes the listed devices up to the first invalid entry, so only the first matters:
    # "" and "-1" hide everything, and so does an index past the last GPU.
    first = visible.split(",")[0].strip()
    if first == "" or first.startswith("-"):
        return True
    return first.isdigit() and gpu_count is not None and int(first) >= gpu_count


def check_cuda_visible_devices(f: EnvReport) -> Check | None:
    visible = f.cuda_visible_devices
    if visible is None or not gpu_present(f):
        return None  # nothing to hide on a machine without a GPU (CUDA_VISIBLE_DEVICES="" is how CI says "CPU")
    if _hides_every_gpu(visible, f.driver.nvml_gpu_count):
        return Check(
            "CUDA_VISIBLE_DEVICES",
            "fail",
            f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU ({f.driver.nvml_gpu_count or 0} on the machine)",
            "unset CUDA_VISIBLE_DEVICES or list the GPUs to use, e.g. CUDA_VISIBLE_DEVICES=0,1",
        )
    return Check("CUDA_VISIBLE_DEVICES", "ok", f"CUDA_VISIBLE_DEVICES={visible!r}")


def why_cuda_unavailable(f: EnvReport) -> tuple[str, str]:
    """The most likely cause of `torch.cuda.is_available()` being False, and its fix (no fix when
    the machine has no GPU: then the CPU is the right device, not a problem)."""
    if not gpu_present(f):
        return _no_gpu_detail(f), ""
    for check in (check_torch_build, check_cuda_visible_devices, check_driver, check_driver_cuda_version):
        result = check(f)
        if result is not None and result.status == "fail":
            return result.detail, result.fix or ""
    if f.torch_build != "cpu" and not _gpus_exist(f) and f.driver.present:
        return "the driver sees no GPU", "check that the GPU is attached (nvidia-smi should list it)"
    return (
        f"CUDA did not initialise for torch {f.torch} (CUDA {f.torch_cuda})",
        "run `python -c 'import torch; torch.cuda.init()'` to see CUDA's own error",
    )


def check_cuda_available(f: EnvReport, require_gpu: bool = False) -> Check:
    """The verdict: what will training run on here? A GPU that exists but cannot be used fails; a
    machine without a GPU trains on the CPU (ok), unless `require_gpu` (`doctor --require-gpu`)."""
    if f.cuda_available and f.device_count > 0:
        return Check("gpu training", "ok", f"{f.device_count} GPU(s) visible to torch")
    if f.mps_available:
        return Check("gpu training", "ok", "Apple GPU through MPS (train.device=mps)")
    if not gpu_present(f):
        if require_gpu:
            return Check(
                "gpu training",
                "fail",
                _no_gpu_detail(f),
                "run on a machine with a GPU (without --require-gpu, training on the CPU passes)",
            )
        return Check("cpu training", "ok", f"{_no_gpu_detail(f)}: gputrain trains on the CPU ({f.cpu_count} cores)")
    cause, fix = why_cuda_unavailable(f)
    return Check("gpu training", "fail", f"torch.cuda.is_available() is False: {cause}", fix)


def _gpu_check(gpu: GpuFacts) -> Check:
    def gib(size: int | None) -> str:
        return "?" if size is None else f"{size / GIB:.1f}"

    detail = (
        f"{gpu.name}, {gib(gpu.memory_used_bytes)}/{gib(gpu.memory_total_bytes)} GiB used, "
        f"cc {gpu.capability or '?'}, bf16 {'yes' if gpu.bf16 else 'no'}, "
        f"tf32 {'yes' if gpu.tf32 else 'no'}, util {gpu.utilization_pct if gpu.utilization_pct is not None else '?'}%, "
        f"{gpu.temperature_c if gpu.temperature_c is not None else '?'} C, "
        f"MIG {'on' if gpu.mig_enabled else 'off'}"
    )
    name = f"gpu {gpu.index}"
    if gpu.mig_enabled:
        return Check(
            name,
            "warn",
            detail + ": MIG is on, so torch sees MIG slices, not the whole GPU",
            "use the MIG instance UUIDs in CUDA_VISIBLE_DEVICES, or disable MIG: nvidia-smi -i N -mig 0",
        )
    used = gpu.memory_used_bytes or 0
    if gpu.memory_total_bytes and used > 0.5 * gpu.memory_total_bytes:
        return Check(
            name,
            "warn",
            detail + ": another process holds over half the memory",
            "find it with nvidia-smi and stop it, or pick another GPU",
        )
    if gpu.utilization_pct is not None and gpu.utilization_pct >= 50:
        return Check(
            name,
            "warn",
            detail + ": the GPU is busy with another process",
            "find it with nvidia-smi, or pick another GPU; benchmarks will read low",
        )
    if gpu.temperature_c is not None and gpu.temperature_c >= 85:
        return Check(name, "warn", detail + ": hot enough to throttle its clocks", "check the cooling")
    return Check(name, "ok", detail)


def check_gpus(f: EnvReport) -> list[Check]:
    return [_gpu_check(g) for g in f.gpus]


def check_cudnn(f: EnvReport) -> Check | None:
    if f.torch_build != "cuda" or not f.cuda_available:
        return None
    if f.cudnn_version is None:
        return Check(
            "cudnn",
            "warn",
            "cuDNN is not available: convolutions run on slow fallbacks",
            "reinstall the torch CUDA wheel (it bundles cuDNN)",
        )
    return Check("cudnn", "ok", f"cuDNN {f.cudnn_version}")


def check_nccl(f: EnvReport) -> Check | None:
    if f.torch_build != "cuda" or not f.platform.startswith("Linux"):
        return None  # NCCL ships only in the Linux CUDA wheels
    if f.nccl_version is None:
        return Check(
            "nccl",
            "warn",
            "NCCL is not available: multi-GPU training falls back to gloo (slow)",
            "reinstall the torch CUDA wheel for Linux (it bundles NCCL)",
        )
    return Check("nccl", "ok", f"NCCL {f.nccl_version}")


def check_torch_installs(f: EnvReport) -> Check:
    installs = f.torch_installs
    if len(installs) > 1:
        listed = "; ".join(f"{i.path} ({i.version or '?'})" for i in installs)
        return Check(
            "torch installs",
            "warn",
            f"{len(installs)} torch installations on sys.path, the first wins: {listed}",
            "pip uninstall torch until one remains, or clear PYTHONPATH / --user site-packages; "
            "a fresh virtual env avoids it",
        )
    return Check("torch installs", "ok", "one torch installation on sys.path")


def check_shm(f: EnvReport) -> Check | None:
    shm = f.shm
    if shm is None:
        return None
    size = f"{shm.path} is {shm.total_bytes / (1 << 20):.0f} MiB ({shm.free_bytes / (1 << 20):.0f} MiB free)"
    fix = "give the container more: docker run --shm-size=16g (or --ipc=host), or set data.num_workers=0"
    if shm.total_bytes < MIN_SHM_BYTES:
        return Check(
            "shared memory",
            "warn",
            f"{size}: too small for data-loader workers (they fail with 'bus error' or 'No space left on device')",
            fix,
        )
    if shm.free_bytes < MIN_SHM_BYTES // 2:
        return Check("shared memory", "warn", f"{size}: almost full, data-loader workers may fail", fix)
    return Check("shared memory", "ok", size)


def check_dist(f: EnvReport) -> Check | None:
    d = f.dist
    if d is None:
        return None
    name = f"all-reduce ({d.backend})"
    if d.ok:
        return Check(name, "ok", f"{d.world_size} ranks agreed in {d.seconds:.1f} s")
    who = f"rank {d.failed_rank}" if d.failed_rank is not None else "the launcher"
    return Check(
        name,
        "fail",
        f"{who} of {d.world_size} failed: {d.error}",
        "check that every rank can reach MASTER_ADDR:MASTER_PORT (firewall, NCCL_SOCKET_IFNAME), "
        "rerun with NCCL_DEBUG=INFO",
    )


def check_allocator(f: EnvReport) -> Check | None:
    """Which C allocator setting the ranks of a job that shards its parameters on the CPU side run
    with, and those of DDP and one process (informational; a GPUTRAIN_ALLOCATOR that cannot be
    honoured fails, as the launch would)."""
    a = f.allocator
    if a is None:
        return None
    try:
        if a.setting in ("jemalloc", "tcmalloc") and a.user_setting is None:  # a process cannot preload itself
            ranks = launched_rank_choice(a, shards=True).describe()
            alone = f"{a.setting} only where started with LD_PRELOAD={a.found}"
            detail = f"ranks gputrain starts: {ranks}; one process: {alone}"
        else:
            sharded, replicated = choose_allocator(a, shards=True), choose_allocator(a, shards=False)
            detail = f"ranks of a sharded job: {sharded.describe()}; DDP and one process: {replicated.describe()}"
    except UsageError as err:
        return Check("allocator", "fail", str(err), f"unset {ALLOCATOR_ENV}, or set it to one that works here")
    if f.torch_build == "cuda":
        conf = f"{a.cuda_alloc_conf} (yours)" if a.cuda_alloc_conf is not None else f"{CUDA_ALLOC_SETTING} (gputrain's)"
        detail += f"; CUDA caching allocator: {conf}"
    return Check("allocator", "ok", detail)


CheckFn = Callable[[EnvReport], "Check | list[Check] | None"]
CHECKS: tuple[CheckFn, ...] = (
    check_python,
    check_torch_version,
    check_torch_build,
    check_driver,
    check_driver_cuda_version,
    check_cuda_visible_devices,
    check_cuda_available,
    check_gpus,
    check_cudnn,
    check_nccl,
    check_torch_installs,
    check_shm,
    check_allocator,
    check_dist,
)


def run_checks(facts: EnvReport | Mapping[str, Any], require_gpu: bool = False) -> list[Check]:
    """Every check that applies to these facts, in a fixed order; `require_gpu`: no GPU is a failure."""
    report = facts if isinstance(facts, EnvReport) else EnvReport.from_dict(dict(facts))
    results: list[Check] = []
    verdict = functools.partial(check_cuda_available, require_gpu=require_gpu)
    for check in (verdict if c is check_cuda_available else c for c in CHECKS):
        out = check(report)
        if out is None:
            continue
        results.extend(out if isinstance(out, list) else [out])
    return results


def passed(checks: Iterable[Check]) -> bool:
    """True when no check failed: the doctor's exit code is 0 exactly then."""
    return all(c.status != "fail" for c in checks)
