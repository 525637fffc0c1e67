"""The memory one rank on this node can have, and which limit binds it (`rank_memory_limit`).

Each limit is applied the way it binds:
- a GPU's memory belongs to the one rank that uses it;
- this process's own limits, RLIMIT_AS (`ulimit -v`, `prlimit --as`) and RLIMIT_DATA (`ulimit -d`,
  `prlimit --data`), bound each process apart (every rank inherits its own copy), so they are NOT
  divided by the ranks. They count address space, not resident memory, and a rank maps a good part
  of it before it allocates anything: an idle rank that imported torch and gputrain maps ~0.6 GiB
  (VmSize; VmData ~0.18 GiB), one with a gloo process group ~0.75 GiB (VmData ~0.21 GiB), of which
  only ~0.23 GiB is resident. What a plan or a check adds comes on top of that, so each is taken
  less what the process maps already (VmSize, VmData in /proc/self/status) when it is read. For
  `gputrain plan` that is the plan process's own, standing in for a rank's (the same imports, data
  and model on the meta device; a rank's process group adds ~0.15 GiB, within the plan's headroom);
  for the config check, which runs before torch is imported, it is less than a rank's: that check
  is a lower bound anyway;
- a cgroup's limit (v2 `memory.max`, v1 `memory.limit_in_bytes`, its own cgroup's and every
  ancestor's) and physical memory are shared by the processes inside, so each is divided by the
  ranks of this node (LOCAL_WORLD_SIZE, or the ranks a plan is asked about). Their resident baseline
  is not subtracted: it is small against them, and the plan's headroom (`plan/layouts.py`) holds it.

No torch here (the config is checked before it is imported) except to read a GPU's memory.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CGROUP_ROOT", "MemoryLimit", "local_ranks", "rank_memory_limit"]

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_STATUS = Path("/proc/self/status")
ADDRESS_SPACE = "this process's address-space limit (ulimit -v / prlimit --as)"
DATA_SEGMENT = "this process's data limit (ulimit -d / prlimit --data)"


@dataclass(frozen=True, slots=True)
class MemoryLimit:
    """Bytes one rank can have, and what binds them, in words for the user."""

    bytes: int
    what: str


def _size(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _cgroup_paths(self_cgroup: str) -> list[Path]:
    """The memory-limit files that bound this process, from /proc/self/cgroup's text: its own cgroup's
    and every ancestor's (a limit set higher up bounds it too), for cgroup v2 (`0::/path`,
    memory.max) and v1 (`N:memory:/path`, memory/memory.limit_in_bytes). Inside a container the path
    may not exist under /sys/fs/cgroup (its root is the container's own cgroup): the root's file
    is then the container's limit, so it is always among them."""
    files: list[Path] = []
    for line in self_cgroup.splitlines():
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if controllers == "":  # v2
            base, name = CGROUP_ROOT, "memory.max"
        elif "memory" in controllers.split(","):  # v1
            base, name = CGROUP_ROOT / "memory", "memory.limit_in_bytes"
        else:
            continue
        parts = Path(path.strip() or "/").parts[1:]
        files += [base.joinpath(*parts[:depth]) / name for depth in range(len(parts), -1, -1)]
    return files or [CGROUP_ROOT / "memory.max", CGROUP_ROOT / "memory" / "memory.limit_in_bytes"]


def _self_cgroup() -> str:
    """/proc/self/cgroup: which cgroup (of each hierarchy) this process is in; "" where there is none."""
    try:
        return Path("/proc/self/cgroup").read_text()
    except OSError:
        return ""


def _mapped(field: str) -> int:
    """This process's `field` of /proc/self/status (VmSize, VmData) in bytes; 0 where it cannot be read."""
    try:
        for line in PROC_STATUS.read_text().splitlines():
            name, _, value = line.partition(":")
            if name == field:
                return int(value.split()[0]) * 1024  # "kB"
    except (OSError, ValueError, IndexError):
        pass
    return 0


def local_ranks() -> int:
    """Ranks of this job on this node: torchrun's LOCAL_WORLD_SIZE, 1 outside a job."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    except ValueError:
        return 1


def _shared(total: int, what: str, ranks: int) -> MemoryLimit:
    if ranks == 1:
        return MemoryLimit(total, f"{what} of {_size(total)}")
    return MemoryLimit(total // ranks, f"{what} of {_size(total)}, shared by {ranks} ranks")


def _host_limits(ranks: int) -> list[MemoryLimit]:
    found: list[MemoryLimit] = []
    with contextlib.suppress(ValueError, OSError, AttributeError):
        found.append(_shared(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this machine's memory", ranks))
    for limit_file in _cgroup_paths(_self_cgroup()):
        try:
            text = limit_file.read_text().strip()
        except OSError:
            continue
        if text.isdigit():  # "max": no limit at this level
            found.append(_shared(int(text), f"the cgroup's memory limit ({limit_file})", ranks))
    try:
        import resource
    except ImportError:
        return found
    for which, what, field in (
        (resource.RLIMIT_AS, ADDRESS_SPACE, "VmSize"),
        (resource.RLIMIT_DATA, DATA_SEGMENT, "VmData"),
    ):
        try:
            soft = resource.getrlimit(which)[0]
        except (ValueError, OSError):
            continue
        if soft == resource.RLIM_INFINITY or soft <= 0:
            continue
        used = _mapped(field)
        found.append(
            MemoryLimit(
                max(0, soft - used), f"{what} of {_size(soft)}, less the {_size(used)} this process maps already"
            )
        )
    return found


def rank_memory_limit(device: Any = None, ranks: int | None = None) -> MemoryLimit | None:
    """The memory one rank on this node can have, and what binds it: on a CUDA `device` (a
    torch.device), the GPU's memory; else (None, the CPU) the lowest of physical memory and this
    process's cgroup limits, each divided by the `ranks` of this node that share them
    (default: LOCAL_WORLD_SIZE), and its own address-space and data limits, each less what it maps
    already (not divided: each process has its own). None where none can be read."""
    if device is not None and getattr(device, "type", None) == "cuda":
        import torch  # only asked once a run on a GPU is being laid out

        return MemoryLimit(int(torch.cuda.get_device_properties(device).total_memory), f"{device}'s memory")
    found = _host_limits(max(1, ranks) if ranks is not None else local_ranks())
    return min(found, key=lambda limit: limit.bytes) if found else None
