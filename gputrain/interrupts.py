"""A process that a signal is ending exits 130 ("interrupted"), whatever further signals arrive.

Used by a run that stopped for a signal (run/signals.py) and by the launcher once its ranks have
stopped (distributed/launch.py). Signal handlers belong to the main thread: elsewhere these do nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

from gputrain.errors import Interrupted

INTERRUPTED_EXIT = 130
HANDLED = [signal.SIGINT, signal.SIGTERM] + ([signal.SIGUSR1] if hasattr(signal, "SIGUSR1") else [])
"""The signals a run stops for; SIGUSR1 is what Slurm sends before pre-empting (--signal=USR1@90)."""


def leave_now(signum: int, frame: FrameType | None) -> None:
    """A further signal once a run has stopped for one: exit 130 ("interrupted") at once, as the
    second signal does, instead of the default action's 128+N (143 for SIGTERM)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(INTERRUPTED_EXIT)


def ignore_during_exit() -> None:
    """At interpreter exit, after a run stopped for a signal. Python resets its handlers to the
    defaults while it tears down (a second or more), so a further signal there would end the process
    with 128+N; the exit status (130) is decided by then, so such signals are ignored instead. A
    handler of the user's own is left alone."""
    for sig in HANDLED:
        if signal.getsignal(sig) in (leave_now, signal.default_int_handler):
            signal.signal(sig, signal.SIG_IGN)


_exit_hook: list[bool] = []


def arm_exit_hook() -> None:
    """Run `ignore_during_exit` at interpreter exit (registered once per process)."""
    if not _exit_hook:
        _exit_hook.append(True)
        atexit.register(ignore_during_exit)


def leave_130_on_further_signals() -> None:
    """For a process that is ending because of a signal and has no run of its own to finish (the
    launcher, once its ranks have stopped and checkpointed): a further SIGINT, SIGTERM or SIGUSR1
    exits 130 at once, and is ignored while the interpreter tears down."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in HANDLED:
        signal.signal(sig, leave_now)
    arm_exit_hook()


def _stop_starting(signum: int, frame: FrameType | None) -> None:
    """Leave at once: a run that has not armed its own handler has written nothing that needs
    saving. Raising instead would be swallowed by any library's bare `except:` around the import the
    signal lands in, and the command would go on (or end 0)."""
    if _STARTING and job_rank() == 0:  # a job's other ranks get the same signal: rank 0 speaks for them
        with contextlib.suppress(Exception):
            sys.stderr.write(
                f"gputrain {_STARTING[0]}: stopped by {signal.Signals(signum).name} while starting, before "
                "training began (nothing to resume: run the command again to start it)\n"
            )
    leave_now(signum, frame)


def job_rank() -> int:
    """This process's rank in a job of several processes started by torchrun (RANK, WORLD_SIZE)
    or srun (SLURM_PROCID, SLURM_NTASKS), else 0: read from the environment, before torch loads,
    for the lines that rank 0 says for the whole job."""
    try:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            return int(os.environ.get("RANK", "0"))
        if int(os.environ.get("SLURM_NTASKS", "1")) > 1:
            return int(os.environ.get("SLURM_PROCID", "0"))
    except ValueError:
        pass
    return 0


_STARTING: list[str] = []
"""The command `startup_signals` guards (its name, for the line a signal prints)."""


def is_startup_handler(handler: object) -> bool:
    """Whether `handler` is the one `startup_signals` armed (a run's own handler replaces it)."""
    return handler is _stop_starting


@contextlib.contextmanager
def startup_signals(command: str) -> Iterator[None]:
    """Around a command that starts a run, from before its heavy imports: a SIGINT, SIGTERM or
    SIGUSR1 while it starts prints one line and exits 130 at once, instead of ending the process
    with 128+N and no word. The run arms its own handler before it writes into its directory
    (run/start.py), which checkpoints and records, and gives this one back when it ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _STARTING[:] = [command]
    previous = {sig: signal.signal(sig, _stop_starting) for sig in HANDLED}
    try:
        yield
    except (Interrupted, KeyboardInterrupt):
        leave_130_on_further_signals()  # the process is ending for a signal: no 128+N from here on
        raise
    finally:
        for sig, handler in previous.items():
            if signal.getsignal(sig) is _stop_starting:
                signal.signal(sig, handler)
