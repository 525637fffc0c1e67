"""A Ctrl-C of the test suite prints pytest's summary of the failures so far and stops the session,
wherever it lands: inside gputrain's own signal handlers too (tests/conftest.py says why they took
it). A real pytest runs ctrl_c_target.py and is sent SIGINT once a test has written its marker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
TARGET = "tests/unit/suite/ctrl_c_target.py"


@pytest.mark.slow
@pytest.mark.parametrize("case", ["while_a_command_starts", "while_a_run_trains"])
def test_ctrl_c_keeps_the_failures_so_far_and_stops_the_session(tmp_path: Path, case: str) -> None:
    mark = tmp_path / "mark"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MARK": str(mark)}
    selected = f"test_a_fails or test_b_{case} or test_c_after_the_interrupt"
    suite = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", TARGET, "-k", selected],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: mark.exists() or suite.poll() is not None, what=f"{TARGET} to reach test_b_{case}")
        assert suite.poll() is None, suite.communicate()[0]
        suite.send_signal(signal.SIGINT)  # what Ctrl-C sends
        out = suite.communicate(timeout=300)[0]
    finally:
        if suite.poll() is None:
            suite.kill()
            suite.wait()
    assert f"FAILED {TARGET}::test_a_fails - assert 1 == 2" in out, out  # the summary of the failures so far
    assert "short test summary info" in out
    assert not Path(f"{mark}.c").exists(), out  # the session stopped: the next test did not run
    assert suite.returncode == pytest.ExitCode.INTERRUPTED, out
