"""One unbroken reference run of the tiny config, shared by the kill/resume and signal tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.reliability.chaos import TINY, run_train


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    assert run_train(run_dir, TINY) == 0, run_dir.with_suffix(".log").read_text()
    return run_dir
