"""Ctrl-C / SIGTERM: finish the current step, checkpoint, exit 130. A second signal exits at once."""

from __future__ import annotations

import signal
import threading
from types import FrameType

import torch
import torch.distributed as dist

from gputrain.distributed.context import DistContext
from gputrain.observe.own_sync import own_sync

_HANDLED = [signal.SIGINT, signal.SIGTERM] + ([signal.SIGUSR1] if hasattr(signal, "SIGUSR1") else [])


class StopRequest:
    """Set by a signal; the loop polls `requested` between steps (a plain bool: no cost)."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested is not None:  # second signal: stop now
            self.uninstall()
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in _HANDLED:  # SIGUSR1 is what Slurm sends before pre-empting (--signal=USR1@90)
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def agreed(self, job: DistContext, device: torch.device, sync_point: bool) -> bool:
        """Whether to stop for a signal now. One process stops as soon as one came. Several ranks
        agree first, on logging steps (which sync anyway): a signal reaches each rank at a slightly
        different moment, and a rank that stopped alone would leave its peers waiting in the next
        collective, where all ranks save the same step together."""
        if not job.enabled:
            return self.requested is not None
        if not sync_point:
            return False
        flag = torch.tensor([0 if self.requested is None else 1], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        with own_sync():
            stop = bool(flag.item())
        if stop and self.requested is None:
            self.requested = "a signal to another rank"
        return stop
