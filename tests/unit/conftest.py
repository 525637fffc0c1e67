"""Fixtures shared by tests/unit/reliability/ (kill/resume, signals, bad data) and
tests/unit/checkpoint/ (damaged checkpoints, kills while saving): one unbroken reference run of the
tiny config, and the warnings of the `gputrain` logger."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.reliability.chaos import TINY, run_train


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    assert run_train(run_dir, TINY) == 0, run_dir.with_suffix(".log").read_text()
    return run_dir


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
