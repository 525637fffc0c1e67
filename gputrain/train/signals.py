"""Ctrl-C / SIGTERM: finish the current step, checkpoint, exit 130. A second signal exits at once."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

import torch
import torch.distributed as dist

from gputrain.distributed.context import DistContext
from gputrain.errors import Interrupted
from gputrain.observe.own_sync import own_sync

INTERRUPTED_EXIT = 130
_HANDLED = [signal.SIGINT, signal.SIGTERM] + ([signal.SIGUSR1] if hasattr(signal, "SIGUSR1") else [])


def _leave_now(signum: int, frame: FrameType | None) -> None:
    """A further signal once a run has stopped for one: exit 130 ("interrupted") at once, as the
    second signal does, instead of the default action's 128+N (143 for SIGTERM)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(INTERRUPTED_EXIT)


def _ignore_during_exit() -> None:
    """At interpreter exit, after a run stopped for a signal. Python resets its handlers to the
    defaults while it tears down (a second or more), so a further signal there would end the process
    with 128+N; the exit status (130) is decided by then, so such signals are ignored instead. A
    handler of the user's own is left alone."""
    for sig in _HANDLED:
        if signal.getsignal(sig) in (_leave_now, signal.default_int_handler):
            signal.signal(sig, signal.SIG_IGN)


_exit_hook: list[bool] = []


def _arm_exit_hook() -> None:
    if not _exit_hook:
        _exit_hook.append(True)
        atexit.register(_ignore_during_exit)


def leave_130_on_further_signals() -> None:
    """For a process that is ending because of a signal and has no run of its own to finish (the
    launcher, once its ranks have stopped and checkpointed): a further SIGINT, SIGTERM or SIGUSR1
    exits 130 at once, and is ignored while the interpreter tears down."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in _HANDLED:
        signal.signal(sig, _leave_now)
    _arm_exit_hook()


class StopRequest:
    """Set by a signal; the loop polls `requested` between steps (a plain bool: no cost).

    The first signal asks the loop to checkpoint and stop (exit 130); a second one stops at once
    (KeyboardInterrupt, exit 130). Once a signal has come, the handlers are not given back to the
    defaults that would end the process with 128+N: a SIGTERM or SIGUSR1 that arrives while the
    stopped run finishes (summary, interpreter shutdown) exits 130 at once too. SIGINT gets its
    previous handler back (Python's KeyboardInterrupt, exit 130 as well)."""

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
            if self.requested is not None and handler is signal.SIG_DFL:
                handler = _leave_now  # the default would end the process with 128+N, not 130
            signal.signal(sig, handler)  # type: ignore[arg-type]
        if self.requested is not None and self._previous:
            _arm_exit_hook()
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


class StoppedBySignal(Interrupted):
    """A signal stopped `fit()`, after a checkpoint was saved. The message says how to resume in
    Python; the command line says it in its own terms (`for_cli`)."""

    def __init__(self, what: str, run_dir: Path) -> None:
        self.what = what
        self.run_dir = run_dir
        super().__init__(f"{what}call fit() again on a Trainer with run_dir={str(run_dir)!r} to resume")

    def for_cli(self) -> Interrupted:
        return Interrupted(f"{self.what}run again with --run-dir {self.run_dir} to resume")
