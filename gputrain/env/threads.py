"""How many intra-op threads a run uses (`torch.set_num_threads`), chosen from the cores this
process may really use, and the reason, for the device line.

torch starts one intra-op thread per core it sees. On a machine where other processes already use
those cores, the threads of each op wait for one another (OpenMP's barriers spin): a small
convolution ran ~50x slower with 2 threads than with 1 on a busy 2-core machine. So the count is:

    limit  = min(cores in this process's affinity mask, the cgroup's CPU quota)
    others = cores busy with other processes (sampled from /proc/stat for ~40 ms), less what the
             job's other ranks on this node may be using (limit / local ranks each)
    auto   = (limit - others) / local ranks, at least 1 (on a GPU at most HOST_THREADS: the host
             side needs a few)

A core counts as free when at least 75% of it is idle. The load is left out with
`train.deterministic=true`, so that a reproducible run does not depend on what else ran beside it.
Auto never goes above what torch had before the run (torch's default, or the program's own
`torch.set_num_threads`). `train.num_threads=N`, or OMP_NUM_THREADS / MKL_NUM_THREADS in the
environment (not the share `gputrain train --nproc-per-node` sets for its ranks), win.

Facts (`collect_cpu_share`) and the judgement (`auto_threads`) are apart, so the choice is tested
with recorded facts; `apply_threads` does both and sets torch.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from gputrain.distributed.launch import LAUNCHER_SHARE_ENV

HOST_THREADS = 4
"""Intra-op threads of a rank that trains on a GPU: collation, host-side optimizer bookkeeping."""
SAMPLE_S = 0.04
"""How long /proc/stat is sampled for the current load (its counters tick every 10 ms)."""
FREE_CORE = 0.75
"""Idle share of a core from which it counts as free."""
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass(frozen=True, slots=True)
class CpuShare:
    """Facts: the cores this process may use and how busy they are."""

    cores: int
    """CPUs in this process's affinity mask (os.cpu_count() where the mask cannot be read)."""
    quota: float | None
    """The cgroup's CPU quota in cores (cpu.max, or cpu.cfs_quota_us / cpu.cfs_period_us); None: no limit."""
    busy: float | None
    """Cores of the affinity mask busy with other processes just now; None: not measured."""
    busy_source: str = "/proc/stat"
    local_ranks: int = 1
    """Ranks of this job on this node, sharing the cores."""

    @property
    def usable(self) -> float:
        """Cores this rank may use, before the load."""
        limit = self.cores if self.quota is None else min(self.cores, self.quota)
        return limit / max(1, self.local_ranks)


@dataclass(frozen=True, slots=True)
class ThreadChoice:
    threads: int
    reason: str

    def describe(self) -> str:
        """For the device line: `2 CPU threads (auto: 2 cores free)`."""
        return f"{self.threads} CPU thread{'s' if self.threads != 1 else ''} ({self.reason})"


def _affinity_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return os.cpu_count() or 1


def cgroup_quota(root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup in cores, the tightest of its own and its ancestors'
    (v2 `cpu.max`: "<quota> <period>" or "max <period>"; v1 `cpu.cfs_quota_us`, -1 for none, and
    `cpu.cfs_period_us`); None where there is none or it cannot be read."""
    dirs: list[Path] = []
    try:
        for line in proc_cgroup.read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            rel = path.strip("/")
            if controllers == "":  # v2: one unified hierarchy
                base = root
            elif "cpu" in controllers.split(","):  # v1: the cpu controller's hierarchy
                base = next(
                    (root / name for name in (controllers, "cpu", "cpu,cpuacct") if (root / name).is_dir()), root
                )
            else:
                continue
            here = base / rel if rel else base
            dirs += [here, *[p for p in here.parents if p.is_relative_to(base)]]
    except (OSError, ValueError):
        pass
    dirs = dirs or [root, root / "cpu", root / "cpu,cpuacct"]
    quotas = [q for q in map(_quota_in, dict.fromkeys(dirs)) if q is not None]
    return min(quotas) if quotas else None


def _quota_in(folder: Path) -> float | None:
    try:
        v2 = folder / "cpu.max"
        if v2.is_file():
            quota, period = [*v2.read_text().split(), "100000"][:2]
            return None if quota == "max" else int(quota) / int(period)
        v1 = folder / "cpu.cfs_quota_us"
        if v1.is_file():
            quota_us = int(v1.read_text())
            return None if quota_us <= 0 else quota_us / int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError, ZeroDivisionError):
        return None
    return None


def _cpu_times(stat: Path, cpus: set[int] | None) -> tuple[int, int] | None:
    """(busy, total) clock ticks of the CPUs in `cpus` (all where None) from /proc/stat."""
    busy = total = 0
    try:
        for line in stat.read_text().splitlines():
            name, *fields = line.split()
            if not (name.startswith("cpu") and name[3:].isdigit()):
                continue
            if cpus is not None and int(name[3:]) not in cpus:
                continue
            ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
            total += sum(ticks)
            busy += sum(ticks) - ticks[3] - ticks[4]
    except (OSError, ValueError, IndexError):
        return None
    return (busy, total) if total else None


def busy_cores(
    stat: Path = Path("/proc/stat"), cpus: set[int] | None = None, window_s: float = SAMPLE_S
) -> float | None:
    """Cores of `cpus` busy over the next `window_s` seconds, this process asleep meanwhile (so
    what it counts is the others' work); None where /proc/stat cannot be read."""
    before = _cpu_times(stat, cpus)
    if before is None:
        return None
    time.sleep(window_s)
    after = _cpu_times(stat, cpus)
    if after is None or after[1] <= before[1]:
        return None
    n = len(cpus) if cpus is not None else _affinity_cores()
    return n * (after[0] - before[0]) / (after[1] - before[1])


def collect_cpu_share(local_ranks: int = 1, sample_load: bool = True) -> CpuShare:
    """The facts about this machine's cores that `auto_threads` reads (~40 ms when sampling)."""
    try:
        mask: set[int] | None = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        mask = None
    cores = len(mask) if mask else (os.cpu_count() or 1)
    busy, source = (busy_cores(cpus=mask), "/proc/stat") if sample_load else (None, "")
    if sample_load and busy is None and hasattr(os, "getloadavg"):  # no /proc: the 1-minute load, less ourselves
        busy, source = max(0.0, os.getloadavg()[0] - 1.0), "load average"
    return CpuShare(cores, cgroup_quota(), busy, source, max(1, local_ranks))


def local_ranks(world_size: int) -> int:
    """Ranks of this job on this node (torchrun's LOCAL_WORLD_SIZE), 1 for a single process."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))) if world_size > 1 else 1
    except ValueError:
        return 1


def _plural(n: float, word: str) -> str:
    text = f"{n:g}" if isinstance(n, int) or float(n).is_integer() else f"{n:.1f}"
    return f"{text} {word}{'' if n == 1 else 's'}"


def explicit_threads(setting: int | Literal["auto"], env: Mapping[str, str]) -> ThreadChoice | None:
    """The count the user gave: train.num_threads, else OMP_NUM_THREADS or MKL_NUM_THREADS (not the
    share gputrain's launcher set); None for auto."""
    if setting != "auto":
        return ThreadChoice(setting, "train.num_threads")
    for name in THREAD_ENV:
        value = env.get(name, "").strip()
        if (
            value.isdigit()
            and int(value) > 0
            and not (name == "OMP_NUM_THREADS" and value == env.get(LAUNCHER_SHARE_ENV))
        ):
            return ThreadChoice(int(value), f"{name}={value}")
    return None


def auto_threads(share: CpuShare, device_type: str, ceiling: int | None = None) -> ThreadChoice:
    """The free cores of `share`, at least 1 (see the module docstring).

    Args:
        device_type: on "cuda" at most HOST_THREADS.
        ceiling: torch's thread count before the run; auto does not go above it.
    """
    parts = [_plural(share.cores, "core")]
    if share.quota is not None and share.quota < share.cores:
        parts.append(f"cgroup quota {share.quota:g}")
    if share.local_ranks > 1:
        parts.append(f"÷ {share.local_ranks} local ranks")
    free = share.usable
    if share.busy is not None:
        # the ranks beside this one are busy too; only what they cannot explain is someone else's
        others = max(0.0, share.busy - (share.local_ranks - 1) * share.usable)
        free = max(0.0, share.usable - others / share.local_ranks)
        parts.append(f"{share.busy:.1f} busy with other processes")
    threads = max(1, math.floor(free + (1 - FREE_CORE)))
    if device_type == "cuda" and threads > HOST_THREADS:
        threads = HOST_THREADS
        parts.append(f"GPU run: {HOST_THREADS} for the host side")
    if ceiling is not None and threads > ceiling:
        threads = ceiling
        parts.append(f"torch had {ceiling}")
    return ThreadChoice(threads, "auto: " + ", ".join(parts))


_set_by_gputrain: tuple[int, int] | None = None
"""(torch's count before gputrain first set it, the count gputrain set): a later run in the same
process takes its ceiling from before, unless the program has set a count of its own since."""


def apply_threads(
    setting: int | Literal["auto"], device: torch.device, deterministic: bool, local_ranks: int
) -> ThreadChoice:
    """Choose the run's intra-op thread count and set it in torch; returns the choice for the device line."""
    global _set_by_gputrain
    now = torch.get_num_threads()
    ceiling = _set_by_gputrain[0] if _set_by_gputrain is not None and _set_by_gputrain[1] == now else now
    choice = explicit_threads(setting, os.environ) or auto_threads(
        collect_cpu_share(local_ranks, sample_load=not deterministic), device.type, ceiling
    )
    if choice.threads != now:
        torch.set_num_threads(choice.threads)
        _set_by_gputrain = (ceiling, choice.threads)
    return choice
