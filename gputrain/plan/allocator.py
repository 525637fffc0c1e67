"""The CPU allocator's own count of live bytes: what the plan is checked against.

The plan counts tensor storages at the dispatcher (tracker.py), on fake tensors. This counts at the
allocator, during a real run: c10's CPU allocator reports every allocation and free to the profiler
(`torch.profiler.profile(profile_memory=True)`), each with its running total of bytes allocated
(what torch's memory timeline is drawn from). By default that total only moves on the profiled
thread; with c10's flag `caffe2_report_cpu_memory_usage` set the allocator keeps it for every
thread, so tensors made or freed by gloo's worker threads count too. It sees what the dispatcher
cannot: buffers allocated inside kernels (oneDNN's reorders and convolution workspace), tensors of
other threads, whatever the model and the loop really allocate.

Two limits. The peak is read at the profiled thread's allocation events, each of which carries the
process-wide total: a temporary that another thread makes and frees while this one allocates nothing
(gloo's flattened all-gather output, while the main thread waits on it) is not seen at its peak, so
2-rank peaks vary by such a buffer from run to run. And the allocator's table of sizes outlives a
profile: a block allocated while it counted and freed after it stopped leaves its size behind, and
when that address is freed again while it counts, the total drops by a size it never added. So the
flag, once set, stays set, and a measurement belongs in a process of its own that nothing profiled
before (benchmarks/peak_memory.py's `measure_training_fresh`; torchrun's ranks are). This is torch's CPU
allocator only: no CUDA, none of glibc's or Python's own memory.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field
from typing import Any

import torch

MARK = "gputrain.plan.mark"


def count_all_threads() -> bool:
    """Set c10's flag: the CPU allocator counts every thread's bytes, from now on in this process.
    False where this build of torch has no such flag (then only the profiled thread is counted)."""
    flag = _report_flag()
    if flag is None:
        return False
    flag.value = True
    return True


def _report_flag() -> Any:
    """c10's `FLAGS_caffe2_report_cpu_memory_usage`, a bool in libc10 (None where it is not found)."""
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so")
    try:
        return ctypes.c_bool.in_dll(ctypes.CDLL(path), "FLAGS_caffe2_report_cpu_memory_usage")
    except (OSError, ValueError):
        return None


@dataclass(slots=True)
class AllocatorPeak:
    """Live bytes of torch's CPU allocator between marks, from its own reports.

    Use: `with AllocatorPeak() as peak: ...; peak.mark(); ...; peak.mark()`, then
    `peak.peak_between(1, 2) - peak.live_at(0)`. Mark 0 is set on entry.
    """

    all_threads: bool = True
    """Count every thread (`count_all_threads`, which stays set); False: the profiled thread only."""
    _marks: list[int] = field(default_factory=list)
    _events: list[tuple[int, int, bool]] = field(default_factory=list)
    """(time ns, total allocated after the event, whether it is a mark's probe)."""
    _profile: Any = None

    def __enter__(self) -> AllocatorPeak:
        from torch.profiler import ProfilerActivity, profile

        if self.all_threads:
            count_all_threads()
        self._profile = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._profile.__enter__()
        self.mark()
        return self

    def mark(self) -> None:
        """A point in time to read the live bytes at (a 1-byte probe allocation, inside a labelled range)."""
        with torch.profiler.record_function(MARK):
            probe = torch.empty(1, dtype=torch.uint8)
            del probe

    def __exit__(self, *exc: object) -> None:
        from torch._C._profiler import _EventType

        self._profile.__exit__(*exc)
        if exc[0] is not None:
            return
        allocations: list[tuple[int, int, int]] = []  # (time ns, bytes, total allocated after it)
        marks: list[tuple[int, int]] = []  # each mark's range (start, end ns)
        stack = list(self._profile.profiler.kineto_results.experimental_event_tree())
        while stack:
            node = stack.pop()
            kind = node.typed[0]
            if kind == _EventType.Allocation:
                alloc = node.typed[1]
                if alloc.device.type == "cpu":
                    allocations.append((node.start_time_ns, alloc.alloc_size, alloc.total_allocated))
            elif kind == _EventType.TorchOp and _name(node) == MARK:
                marks.append((node.start_time_ns, node.end_time_ns))
            stack.extend(node.children)
        allocations.sort(key=lambda e: e[0])
        marks.sort()
        events, m = [], 0
        for time_ns, size, total in allocations:
            while m < len(marks) and marks[m][1] < time_ns:
                m += 1
            probe = size == 1 and m < len(marks) and marks[m][0] <= time_ns
            events.append((time_ns, total, probe))
        self._events = events
        self._marks = [i for i, e in enumerate(events) if e[2]]

    @property
    def marks(self) -> int:
        return len(self._marks)

    def live_at(self, mark: int) -> int:
        """Bytes allocated at mark `mark` (0: on entry), the probe left out."""
        return self._events[self._marks[mark]][1] - 1

    def peak_between(self, start: int, end: int) -> int:
        """The most bytes allocated at once from mark `start` to mark `end` (the probes left out)."""
        lo, hi = self._marks[start], self._marks[end]
        return max(total - (1 if probe else 0) for _, total, probe in self._events[lo : hi + 1])


def _name(node: Any) -> str:
    try:
        return str(node.name)
    except UnicodeDecodeError:  # some Python frames' names do not decode: not a mark
        return ""
