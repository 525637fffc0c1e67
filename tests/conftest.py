import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

import gputrain.interrupts
from gputrain.interrupts import HANDLED

ROOT = Path(__file__).resolve().parents[1]

# Tests never read or write the user's bench cache (~/.cache/gputrain): a cached peak would change
# what a run reports (MFU), and a test must not depend on what was benchmarked on the machine before.
os.environ["GPUTRAIN_CACHE_DIR"] = tempfile.mkdtemp(prefix="gputrain-test-cache-")


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 300
            ) -> subprocess.CompletedProcess:
    """Run `python -m gputrain ARGS` for real, with the package from this checkout."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "gputrain", *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


_RUN_SIGNALS = (*HANDLED, signal.SIGQUIT)  # every signal a run handles


@pytest.fixture(autouse=True)
def _signal_handlers_as_found() -> Iterator[None]:
    """Each test leaves the handlers of the signals a run stops for as it found them: a run stopped
    by a signal in-process leaves its exit handlers behind (run/signals.py), which would change what
    a later test of the signal handling sees."""
    saved = {sig: signal.getsignal(sig) for sig in _RUN_SIGNALS}
    yield
    for sig, handler in saved.items():
        if handler is not None:
            signal.signal(sig, handler)


# ---------------------------------------------------------------- Ctrl-C of the suite
# Tests run gputrain's commands and runs in this process, and those arm gputrain's own signal
# handlers, right for a command but not for pytest: a run's first Ctrl-C stops the run (checkpoint,
# exit 130) and the suite went on; a Ctrl-C while a command starts, or a second one after a run
# stopped, ended the process at once with os._exit(130), before pytest printed its failures. So
# in this process: (1) gputrain's "exit 130 now" (interrupts.leave_now, its only os._exit) raises
# KeyboardInterrupt instead, which pytest answers with its summary; (2) a SIGINT that reached this
# process during a test, not sent by the test to itself, stops the session after that test
# (`session.shouldstop`: the summary of the failures so far, exit 2), whichever handler took it.
_SESSION_PID: list[int] = []
"""The pytest process (set in pytest_configure: a process that imports this module for a test's
function, a spawned rank, is none of it and keeps gputrain's handling as it is)."""
INTERRUPTED_EXIT = gputrain.interrupts.INTERRUPTED_EXIT


class _OsForInterrupts:
    """gputrain.interrupts' `os`: the real one, but its exit for a signal is pytest's KeyboardInterrupt
    in the session's own process (a forked child, or another status, exits as it would)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    @staticmethod
    def _exit(status: int) -> NoReturn:
        in_session = os.getpid() in _SESSION_PID and threading.current_thread() is threading.main_thread()
        if status == INTERRUPTED_EXIT and in_session:
            raise KeyboardInterrupt
        os._exit(status)


_sigint_sent_here = [0]
"""SIGINTs the tests sent to this process themselves (a test of the signal handling), not Ctrl-C."""
_real_kill, _real_raise_signal, _real_pthread_kill = os.kill, signal.raise_signal, signal.pthread_kill


def _count(sig: int) -> None:
    if sig == signal.SIGINT:
        _sigint_sent_here[0] += 1


def _kill(pid: int, sig: int) -> None:
    if pid in (0, os.getpid()):
        _count(sig)
    _real_kill(pid, sig)


def _raise_signal(sig: int) -> None:
    _count(sig)
    _real_raise_signal(sig)


def _pthread_kill(thread_id: int, sig: int) -> None:
    _count(sig)
    _real_pthread_kill(thread_id, sig)


_wakeup_read, _wakeup_write = os.pipe()
os.set_blocking(_wakeup_read, False)
os.set_blocking(_wakeup_write, False)


def pytest_configure(config: pytest.Config) -> None:
    _SESSION_PID[:] = [os.getpid()]
    gputrain.interrupts.os = _OsForInterrupts()  # type: ignore[assignment]
    os.kill, signal.raise_signal, signal.pthread_kill = _kill, _raise_signal, _pthread_kill  # type: ignore[assignment]
    # Python writes each signal's number to the wakeup fd, whichever Python handler then takes it
    signal.set_wakeup_fd(_wakeup_write, warn_on_full_buffer=False)


def _sigints_arrived() -> int:
    arrived = 0
    while True:
        try:
            chunk = os.read(_wakeup_read, 4096)
        except BlockingIOError:
            return arrived
        if not chunk:
            return arrived
        arrived += chunk.count(bytes([signal.SIGINT]))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _sigints_arrived()
    _sigint_sent_here[0] = 0
    yield
    if _sigints_arrived() > _sigint_sent_here[0]:  # a Ctrl-C that a run's handler took: stop here
        item.session.shouldstop = f"interrupted by Ctrl-C (SIGINT) during {item.nodeid}"


@pytest.fixture
def cli():
    return run_cli


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def gputrain_warnings() -> Iterator[list[str]]:
    """Warnings of the `gputrain` logger (it does not propagate to the root logger pytest watches)."""
    logger = logging.getLogger("gputrain")
    handler = _Collect()
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(min(previous or logging.WARNING, logging.WARNING))
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
