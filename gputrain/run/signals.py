"""Ctrl-C, SIGTERM and the other signals of interrupts.HANDLED: finish the current step, checkpoint,
exit 130. A second signal exits at once; SIGQUIT at once too, after every thread's stack."""

from __future__ import annotations

import shlex
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, TypeAlias

import torch
import torch.distributed as dist

from gputrain.distributed.context import DistContext
from gputrain.errors import Interrupted
from gputrain.interrupts import QUIT, StoppedAtOnce, arm_exit_hook, dump_stacks, handled, is_startup_handler, leave_now
from gputrain.observe.own_sync import own_sync

Handler: TypeAlias = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None
"""What `signal.signal` answers: a handler, SIG_DFL / SIG_IGN, or None (one not set from Python)."""


class StopRequest:
    """Set by a signal; the loop polls `requested` between steps (a plain bool: no cost).

    The first signal asks the loop to checkpoint and stop (exit 130); a second one stops at once
    (KeyboardInterrupt, exit 130). Once a signal has come, the handlers are not given back to the
    defaults that would end the process with 128+N: a SIGTERM or SIGUSR1 that arrives while the
    stopped run finishes (summary, interpreter shutdown) exits 130 at once too. SIGINT gets its
    previous handler back (Python's KeyboardInterrupt, exit 130 as well)."""

    def __init__(self) -> None:
        self.requested: str | None = None
        """The name of the signal that asked the run to stop (or "a signal to another rank"), or None."""
        self._previous: dict[int, Handler] = {}
        self.early: str | None = None
        """Why the loop asked itself to stop early on this rank (a callback's `request_stop`), or None."""
        self.early_agreed: str | None = None
        """Set by `agreed` once every rank stops early: the reason (the first rank's that asked)."""

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == QUIT:  # quit now, with a record: where it was, and summary.json naming SIGQUIT
            dump_stacks()
            self.requested = self.requested or "SIGQUIT"
            self.uninstall()
            raise StoppedAtOnce("SIGQUIT")
        if self.requested is not None:  # second signal: stop now
            self.uninstall()
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in handled(with_quit=True):
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            if self.requested is not None and (handler is signal.SIG_DFL or is_startup_handler(handler)):
                handler = leave_now  # the default would end the process with 128+N, not 130
            signal.signal(sig, handler)
        if self.requested is not None and self._previous:
            arm_exit_hook()
        self._previous.clear()

    def agreed(self, job: DistContext, device: torch.device, sync_point: bool) -> bool:
        """Whether to stop for a signal now. One process stops as soon as one came. Several ranks
        agree first, on logging steps (which sync anyway): a signal reaches each rank at a slightly
        different moment, and a rank that stopped alone would leave its peers waiting in the next
        collective, where all ranks save the same step together."""
        if not job.enabled:
            self.early_agreed = self.early
            return self.requested is not None
        if not sync_point:
            return False
        # an early stop asked on any rank is agreed on the same all-reduce (and read on the same sync)
        flag = torch.tensor([self.requested is not None, self.early is not None], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        with own_sync():
            stop, early = (bool(v) for v in flag.tolist())
        if stop and self.requested is None:
            self.requested = "a signal to another rank"
        if early and self.early_agreed is None:  # once a run: every rank learns the reason
            reasons: list[str | None] = [None] * job.world_size
            dist.all_gather_object(reasons, self.early)
            self.early_agreed = next(r for r in reasons if r is not None)
        return stop


class StoppedBySignal(Interrupted):
    """A signal stopped `fit()`, after a checkpoint was saved. The message says how to resume in
    Python; the command line says it in its own terms (`for_cli`)."""

    def __init__(self, what: str, run_dir: Path) -> None:
        self.what = what
        self.run_dir = run_dir
        super().__init__(f"{what}call fit() again on a Trainer with run_dir={str(run_dir)!r} to resume")

    def for_cli(self, command: str) -> Interrupted:
        """The message with the command that resumes the run as written: in a directory holding a
        run, `gputrain <command> --run-dir DIR` continues it with its own config.toml."""
        return Interrupted(f"{self.what}resume with: gputrain {command} --run-dir {shlex.quote(str(self.run_dir))}")
