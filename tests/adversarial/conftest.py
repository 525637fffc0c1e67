"""The adversarial suite: inputs a new user or an attacker would try, one case per test item,
grouped by what is attacked (one file each). Each case asserts the promised answer: a short
message naming the field or file and exit 2 for bad input, a record for every ending, nothing
lost or mixed. The count is printed at the end of a run, by group."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

_GROUPS = {
    "test_config_values.py": "config values",
    "test_data_files.py": "data files",
    "test_checkpoint_files.py": "checkpoint files",
    "test_run_dirs.py": "run directories",
    "test_run_continuation.py": "run directories",
    "test_signals.py": "signals and launches",
    "test_start_and_launch.py": "signals and launches",
    "test_data_meaning.py": "data files",
    "test_memory_limits.py": "config values",
}
_cases: Counter[str] = Counter()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        path = Path(str(item.fspath))
        if path.parent == here:
            _cases[_GROUPS.get(path.name, path.stem)] += 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _cases:
        groups = ", ".join(f"{name} {count}" for name, count in sorted(_cases.items()))
        terminalreporter.write_line(f"adversarial suite: {sum(_cases.values())} cases ({groups})")
