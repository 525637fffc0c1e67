"""Every rank's peak memory, not rank 0's alone: what summary.json and the logged rows report.

Each rank knows only its own peak (`device_peak_memory_bytes`: the allocator's on CUDA, the
process's peak RSS elsewhere). The others' reach rank 0 only at points every rank passes
together, where a collective cannot hang:

- each logging step, on the all-reduce of the loss that step runs anyway (`mean_loss_and_peaks`):
  a vector with each rank's peak in its own slot is summed with the loss, so no collective and no
  host sync is added, and none at all on other steps;
- the run's normal end, after the final save (`gather`, from run/shell.py), and a stop for a
  signal the ranks agreed on, after its checkpoint.

Any other ending (a failure, a second signal, a peer that died) runs no collective: a rank there
cannot know whether its peers will ever join one. Each rank other than 0 leaves its peak on disk
as it records its ending, and rank 0 takes those already there (run/left_memory.py; it never waits
for one). Rank 0 then reports its own peak as it is and each other rank's as left, or else as of
the last point they met; `peak_memory_by_rank_step` says at which step each figure was read, and a
rank never met is null (missing), not a guess.
"""

from __future__ import annotations

import resource
import sys
from typing import Any

import torch
import torch.distributed as dist

from gputrain.observe.own_sync import own_sync

SUMMARY_FIELDS = ("peak_memory_bytes", "peak_memory_rank", "peak_memory_by_rank", "peak_memory_by_rank_step")
"""What `RankMemory.summary_fields` gives summary.json's "train" section (null before a run had one)."""


def host_peak_rss_bytes() -> int:
    """The process's peak resident set size: on Linux its memory image's own high-water mark (VmHWM),
    because getrusage's ru_maxrss carries the peak of the process it was forked from across exec: a
    rank spawned by a 700 MiB parent (a notebook, a test runner, a launcher script) reported 700 MiB
    however little it used itself. Elsewhere ru_maxrss."""
    hwm = _vm_hwm_bytes()
    if hwm is not None:
        return hwm
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # Linux reports KiB


def _vm_hwm_bytes() -> int | None:
    """VmHWM from /proc/self/status (kB), None where there is none."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def device_peak_memory_bytes(device: torch.device) -> int:
    """This process's peak: device memory allocated by tensors on CUDA; the host's peak RSS elsewhere."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return host_peak_rss_bytes()


class RankMemory:
    """Args:
    device: this rank's device (what its peak is read on).
    rank, world_size: this rank's place in the job; one process has nothing to gather.
    """

    def __init__(self, device: torch.device, rank: int = 0, world_size: int = 1) -> None:
        self.device, self.rank, self.world_size = device, rank, world_size
        self.by_rank: list[int | None] = [None] * world_size
        """Each rank's peak as last gathered (None: never met)."""
        self.steps: list[int | None] = [None] * world_size
        """The global step each of `by_rank` was read at."""

    def own(self) -> int:
        return device_peak_memory_bytes(self.device)

    def mean_loss_and_peaks(self, loss: torch.Tensor, step: int) -> float:
        """The loss averaged over the ranks (a float), and every rank's peak noted, on one all-reduce.
        Collective on several ranks: every rank calls it on the same logging step."""
        if self.world_size == 1 or not dist.is_initialized():
            with own_sync():
                value = loss.float().item()
            self._note_own(step)
            return value
        # float64: bytes stay exact to 2**53; the sum of float32 losses in float64, rounded back to
        # float32, is the float32 all-reduce's sum, so the logged loss is what it was. Filled on the
        # loss's device (a fill, not a copy from the host: no sync before the one that reads it)
        packed = torch.zeros(1 + self.world_size, dtype=torch.float64, device=loss.device)
        packed[0] = loss.detach().reshape(()).double()
        packed[1 + self.rank] = float(self.own())
        dist.all_reduce(packed, op=dist.ReduceOp.SUM)
        with own_sync():
            values = packed.tolist()
        self._note([int(v) for v in values[1:]], step)
        mean = torch.tensor(values[0], dtype=torch.float32) / self.world_size
        return float(mean)

    def gather(self, step: int) -> None:
        """Every rank's peak now. Collective: only where every rank arrives together (the normal end,
        an agreed stop); a no-op on one process."""
        if self.world_size == 1 or not dist.is_initialized():
            self._note_own(step)
            return
        device = self.device if self.device.type == "cuda" else torch.device("cpu")  # nccl sends CUDA tensors
        slots = torch.zeros(self.world_size, dtype=torch.float64, device=device)
        slots[self.rank] = float(self.own())
        dist.all_reduce(slots, op=dist.ReduceOp.SUM)
        with own_sync():
            self._note([int(v) for v in slots.tolist()], step)

    def take(self, rank: int, peak: int, step: int) -> bool:
        """Rank `rank`'s peak as it left it at its own ending (run/left_memory.py), where that is no
        older than the figure gathered; whether it was taken."""
        known = self.steps[rank]
        if known is not None and step < known:
            return False
        self.by_rank[rank], self.steps[rank] = max(peak, self.by_rank[rank] or 0), step
        return True

    def met_at(self, step: int) -> bool:
        """Whether every rank's figure was gathered at `step` (the ranks met at the end)."""
        return all(s == step for s in self.steps)

    def _note_own(self, step: int) -> None:
        self.by_rank[self.rank], self.steps[self.rank] = self.own(), step

    def _note(self, peaks: list[int], step: int) -> None:
        for rank, peak in enumerate(peaks):
            self.by_rank[rank], self.steps[rank] = peak, step

    def row_fields(self) -> dict[str, Any]:
        """A logged row's memory, as gathered on its step: the largest rank's peak (and, on several
        ranks, which rank)."""
        largest = self._largest()
        if largest is None:
            return {"peak_memory_bytes": self.own()}
        peak, rank = largest
        return {"peak_memory_bytes": peak, **({"peak_memory_rank": rank} if self.world_size > 1 else {})}

    def _largest(self) -> tuple[int, int] | None:
        """(peak, rank) of the largest peak known; the lowest such rank on a tie."""
        known = [(peak, rank) for rank, peak in enumerate(self.by_rank) if peak is not None]
        return max(known, key=lambda pr: (pr[0], -pr[1])) if known else None

    def summary_fields(self, step: int) -> dict[str, Any]:
        """summary.json's memory at step `step`: this rank's peak read now, every other rank's as last
        gathered; `peak_memory_bytes` is the largest known, `peak_memory_rank` the rank holding it."""
        self._note_own(step)  # a peak never falls: read now, it is at least what was gathered
        largest = self._largest()
        assert largest is not None  # this rank's own is known now
        peak, rank = largest
        return {
            "peak_memory_bytes": peak,
            "peak_memory_rank": rank,
            "peak_memory_by_rank": list(self.by_rank),
            "peak_memory_by_rank_step": list(self.steps),
        }
