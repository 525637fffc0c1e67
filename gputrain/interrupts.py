"""Which signals stop a command, and how: a process that a signal is ending exits 130
("interrupted"), whatever further signals arrive.

One set for every command (HANDLED, and SIGQUIT): a run checkpoints and records for them
(run/signals.py); another command is ended as Ctrl-C ends it, so that it cleans up what it was
writing (`StoppedAtOnce`, raised by `_stop_command`); torchrun's agent passes them on to the ranks
(distributed/launch.py). Used from the first instruction of the entry point (`guard_the_start`: a
signal while a command starts is one line and exit 130), by a run that stopped for a signal and by
the launcher once its ranks have stopped. Signal handlers belong to the main thread: elsewhere these
do nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
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
    getattr(signal, name) for name in ("SIGUSR1", "SIGHUP", "SIGUSR2", "SIGALRM") if hasattr(signal, name)
]
"""The signals a run stops for (checkpoint, summary.json `interrupted`, exit 130); SIGUSR1 is what
Slurm sends before pre-empting (--signal=USR1@90), SIGUSR2 what Grid Engine sends before it kills a
job (qsub -notify), SIGHUP what a closed terminal or ssh session sends, SIGALRM what a timer sends
(`timeout -s ALRM`): their default actions end the process with 128+N and no record."""
QUIT = getattr(signal, "SIGQUIT", None)
"""Ctrl-\\ (SIGQUIT): quit now, as its default action (a core dump) would, but with a record: every
thread's stack on stderr (where it was stuck), summary.json `interrupted` naming SIGQUIT, exit 130.
No checkpoint is written: the last one stands."""
OWN_HANDLERS_KEPT = frozenset(
    getattr(signal, name) for name in ("SIGUSR2", "SIGALRM", "SIGQUIT") if hasattr(signal, name)
)
"""Signals a program embedding the Trainer may use for itself (a timer, a stack dump of its own):
taken only where their handler is the default or gputrain's."""
SIGHUP_ENV = "GPUTRAIN_ON_SIGHUP"
"""`stop` (the default: a run saves, records and exits 130, as for SIGTERM) or `ignore` (the command
goes on when its terminal closes, as under `nohup`; inherited by the processes it starts)."""
SIGHUP_CHOICES = ("stop", "ignore")


def check_sighup_choice() -> None:
    """GPUTRAIN_ON_SIGHUP is one of SIGHUP_CHOICES (checked at the entry, before anything starts).

    Raises:
        UsageError: naming the variable and the choices.
    """
    value = os.environ.get(SIGHUP_ENV)
    if value is not None and value not in SIGHUP_CHOICES:
        from gputrain.errors import UsageError

        raise UsageError(f"{SIGHUP_ENV}={value!r}: choose {' or '.join(SIGHUP_CHOICES)} (stop is the default)")


def _ours_or_default(handler: object) -> bool:
    return handler in (signal.SIG_DFL, None) or str(getattr(handler, "__module__", "")).startswith("gputrain.")


def handled(with_quit: bool = False) -> list[int]:
    """The signals of HANDLED (and SIGQUIT with `with_quit`) to catch now: one that is ignored is left
    alone (`nohup` ignores SIGHUP, and its child inherits that, so that the command outlives the
    terminal it was started from; GPUTRAIN_ON_SIGHUP=ignore asks for the same), and so is a handler of
    the program's own for SIGUSR2, SIGALRM or SIGQUIT."""
    hangup = getattr(signal, "SIGHUP", None)
    if hangup is not None and os.environ.get(SIGHUP_ENV) == "ignore" and _in_main_thread():
        signal.signal(hangup, signal.SIG_IGN)
    chosen = [*HANDLED, *([QUIT] if with_quit and QUIT is not None else [])]
    return [
        sig
        for sig in chosen
        if signal.getsignal(sig) != signal.SIG_IGN
        and (sig not in OWN_HANDLERS_KEPT or _ours_or_default(signal.getsignal(sig)))
    ]


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def dump_stacks() -> None:
    """Every thread's stack on stderr (SIGQUIT's record of where the process was)."""
    with contextlib.suppress(Exception):
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)


class StoppedAtOnce(KeyboardInterrupt):
    """A signal that ends the command at once, raised from its handler where the command runs: as
    Ctrl-C's KeyboardInterrupt does, every `finally` runs (temporaries are removed, the run is
    recorded), and the entry says `stopped by <signal>` and exits 130."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


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
    for sig in [*HANDLED, *([QUIT] if QUIT is not None else [])]:
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
    for sig in handled(with_quit=True):
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
    if signum == QUIT:
        dump_stacks()
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
    for sig in handled(with_quit=True):
        current = signal.getsignal(sig)
        if current is not _stop_starting:
            _BEFORE_ENTRY[sig] = current
            signal.signal(sig, _stop_starting)


def _stop_command(signum: int, frame: FrameType | None) -> None:
    """A command that starts no run, stopped in its own code by a signal other than Ctrl-C: ended as
    Ctrl-C ends it (`StoppedAtOnce`, a KeyboardInterrupt), so that what it was writing is cleaned up
    (a `-o` file's temporary, an export's folder), then one line naming the signal and exit 130, no
    traceback. A further signal while it cleans up leaves at once (130). SIGQUIT first prints every
    thread's stack."""
    if signum == QUIT:
        dump_stacks()
    leave_130_on_further_signals()
    raise StoppedAtOnce(signal.Signals(signum).name)


def end_of_the_start() -> None:
    """A command that starts no run: its own code runs now. Ctrl-C is Python's again (a
    KeyboardInterrupt, so the command cleans up and says `interrupted`, exit 130); the other signals
    of HANDLED and SIGQUIT end it the same way with one line naming the signal (`_stop_command`). A handler that was not
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
    previous = {sig: signal.signal(sig, _stop_starting) for sig in handled(with_quit=True)}
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
