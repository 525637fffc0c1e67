import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 300
            ) -> subprocess.CompletedProcess:
    """Run `python -m gputrain ARGS` for real, with the package from this checkout."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "gputrain", *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def cli():
    return run_cli
