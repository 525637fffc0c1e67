"""Fixtures shared by tests/unit/reliability/ (kill/resume, signals, bad data) and
tests/unit/checkpoint/ (damaged checkpoints, kills while saving): one unbroken reference run of the
tiny config (the `gputrain` logger's warnings: `gputrain_warnings`, tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.reliability.chaos import TINY, run_train


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    assert run_train(run_dir, TINY) == 0, run_dir.with_suffix(".log").read_text()
    return run_dir
