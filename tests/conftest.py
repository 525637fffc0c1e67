import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

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
