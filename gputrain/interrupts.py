"""A process that a signal is ending exits 130 ("interrupted"), whatever further signals arrive.

Used from the first instruction of the entry point (`guard_the_start`: a signal while a command
starts is one line and exit 130), by a run that stopped for a signal (run/signals.py) and by the
launcher once its ranks have stopped (distributed/launch.py). Signal handlers belong to the main
thread: elsewhere these do nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from gputrain.errors import Interrupted

INTERRUPTED_EXIT = 130
HANDLED = [signal.SIGINT, signal.SIGTERM] + [
    getattr(signal, name) for name in ("SIGUSR1", "SIGHUP") if hasattr(signal, name)
]
"""The signals a run stops for; SIGUSR1 is what Slurm sends before pre-empting (--signal=USR1@90),
SIGHUP what a closed terminal or ssh session sends (its default action ends the process with 129)."""


def handled() -> list[int]:
    """The signals of HANDLED to catch now: SIGHUP is left alone where it is ignored (`nohup` ignores
    it, and its child inherits that, so that the command outlives the terminal it was started from)."""
    hangup = getattr(signal, "SIGHUP", None)
    return [sig for sig in HANDLED if not (sig == hangup and signal.getsignal(sig) == signal.SIG_IGN)]


RUN_COMMANDS = frozenset({"train", "rl", "profile", "sweep-trial"})
"""The commands that start a run: the start-up guard armed at the entry point stays armed until the
run arms its own handler (`startup_signals`, then run/signals.py); another command has it until its
own code runs, which then meets signals as it always did."""


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
    for sig in handled():
        signal.signal(sig, leave_now)
    arm_exit_hook()


def starting_message(command: str, signum: int) -> str:
    """The one line of a command stopped by signal `signum` while it started."""
    name = signal.Signals(signum).name
    if command in RUN_COMMANDS:
        return (
            f"gputrain {command}: stopped by {name} while starting, before training began (nothing to resume: "
            "run the command again to start it)"
        )
    return f"gputrain{f' {command}' if command else ''}: stopped by {name} while starting (run the command again)"


def _stop_starting(signum: int, frame: FrameType | None) -> None:
    """Leave at once: a run that has not armed its own handler has written nothing that needs
    saving. Raising instead would be swallowed by any library's bare `except:` around the import the
    signal lands in, and the command would go on (or end 0)."""
    if _STARTING and job_rank() == 0:  # a job's other ranks get the same signal: rank 0 speaks for them
        with contextlib.suppress(Exception):
            sys.stderr.write(starting_message(_STARTING[0], signum) + "\n")
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
"""The command `guard_the_start` or `startup_signals` guards (its name, for the line a signal prints)."""
_BEFORE_ENTRY: dict[int, Any] = {}
"""The handlers `guard_the_start` replaced (Python's own), given back when the command's start ends."""

_WORD = re.compile(r"[a-z][a-z-]*")


def guard_the_start(command: str | None = None) -> None:
    """The first instruction of the entry point (`gputrain`, `python -m gputrain`), before anything
    heavy loads: from here on a SIGINT, SIGTERM, SIGUSR1 or SIGHUP while the command starts prints
    one line naming it and exits 130 (`_stop_starting`), as it does later in the start-up, instead of
    ending the process with 128+N and no word (parsing the command line, importing its module,
    loading the config and checking the run directory take a few tenths of a second before the
    command's own start-up guard). `command`: the subcommand where known, else read from sys.argv
    (a word only: the line must not echo arbitrary text). Calling it again renames the command."""
    if threading.current_thread() is not threading.main_thread():
        return
    if command is None:
        word = sys.argv[1] if len(sys.argv) > 1 else ""
        command = word if _WORD.fullmatch(word) else ""
    _STARTING[:] = [command]
    for sig in handled():
        current = signal.getsignal(sig)
        if current is not _stop_starting:
            _BEFORE_ENTRY[sig] = current
            signal.signal(sig, _stop_starting)


def _stop_command(signum: int, frame: FrameType | None) -> None:
    """A command that starts no run, stopped in its own code by a signal other than Ctrl-C: one line
    and exit 130 at once, as its start-up would, instead of 128+N and no word. What it was writing is
    left as the signal's default action would have left it (its outputs are written whole or not at all)."""
    if _STARTING and job_rank() == 0:
        with contextlib.suppress(Exception):
            command = f" {_STARTING[0]}" if _STARTING[0] else ""
            sys.stderr.write(f"gputrain{command}: stopped by {signal.Signals(signum).name} (run the command again)\n")
    leave_now(signum, frame)


def end_of_the_start() -> None:
    """A command that starts no run: its own code runs now. Ctrl-C is Python's again (a
    KeyboardInterrupt, so the command cleans up and says `interrupted`, exit 130); SIGTERM, SIGUSR1
    and SIGHUP go on ending it with one line and exit 130 (`_stop_command`). A handler that was not
    Python's default before `guard_the_start` comes back as it was. Nothing where the guard was not armed."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig, handler in _BEFORE_ENTRY.items():
        if signal.getsignal(sig) is _stop_starting:
            signal.signal(sig, _stop_command if sig != signal.SIGINT and handler == signal.SIG_DFL else handler)
    _BEFORE_ENTRY.clear()


def is_startup_handler(handler: object) -> bool:
    """Whether `handler` is the one `startup_signals` armed (a run's own handler replaces it)."""
    return handler is _stop_starting


@contextlib.contextmanager
def startup_signals(command: str) -> Iterator[None]:
    """Around a command that starts a run, from before its heavy imports: a SIGINT, SIGTERM, SIGUSR1
    or SIGHUP while it starts prints one line and exits 130 at once, instead of ending the process
    with 128+N and no word. The run arms its own handler before it writes into its directory
    (run/start.py), which checkpoints and records, and gives this one back when it ends. Where the
    entry point armed the guard already (`guard_the_start`), it carries on, and Python's own
    handlers come back at the end."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _STARTING[:] = [command]
    # armed since the entry point (`guard_the_start`): at the end, Python's own handlers come back
    previous = {sig: signal.signal(sig, _stop_starting) for sig in handled()}
    previous.update({sig: _BEFORE_ENTRY.pop(sig) for sig in list(_BEFORE_ENTRY) if previous.get(sig) is _stop_starting})
    try:
        yield
    except (Interrupted, KeyboardInterrupt):
        leave_130_on_further_signals()  # the process is ending for a signal: no 128+N from here on
        raise
    finally:
        for sig, handler in previous.items():
            if signal.getsignal(sig) is _stop_starting:
                signal.signal(sig, handler)
