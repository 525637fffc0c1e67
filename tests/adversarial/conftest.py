"""The adversarial suite: inputs a new user or an attacker would try, one case per test item,
grouped by what is attacked (one file each). Each case asserts the promised answer: a short
message naming the field or file and exit 2 for bad input, a record for every ending, nothing
lost or mixed. The count is printed at the end of a run, by group.

Fixtures the groups share: `handlers` (the signal handlers, given back after the test) and
`warned` (the warnings of the `gputrain` logger)."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from gputrain.interrupts import HANDLED

_GROUPS = {
    "test_config_values.py": "config values",
    "test_data_files.py": "data files",
    "test_checkpoint_files.py": "checkpoint files",
    "test_run_dirs.py": "run directories",
    "test_run_continuation.py": "run directories",
    "test_signals.py": "signals and launches",
    "test_start_and_launch.py": "signals and launches",
    "test_launch_and_signals.py": "signals and launches",
    "test_launch_options.py": "signals and launches",
    "test_terminal_text.py": "report injection",
    "test_artifact_trust.py": "artifacts executed",
    "test_data_meaning.py": "data files",
    "test_memory_limits.py": "config values",
    "test_disk_full.py": "run directories",
    "test_file_systems.py": "file systems",
    "test_use_inputs.py": "use inputs",
    "test_outputs.py": "outputs",
    "test_step_anatomy.py": "the step's anatomy",
    "test_report_injection.py": "report injection",
    "test_plan_and_sweep_bounds.py": "work bounds",
    "test_rl_run_dirs.py": "run directories",
    "test_run_files.py": "run files read",
    "test_final_weights.py": "checkpoint files",
    "test_allocator_settings.py": "memory and limits",
    "test_memory_limits_as_they_are.py": "memory and limits",
    "test_rank_memory_summaries.py": "memory and limits",
    "test_fp8_plan.py": "fp8 plans",
    "test_user_optimizer.py": "user optimizers",
    "test_callbacks.py": "callbacks",
    "test_token_loss.py": "token losses",
    "test_cadence.py": "cadences and limits",
    "test_tokenizers.py": "tokenizers",
    "test_token_shards.py": "token shards",
    "test_lm_inputs.py": "language-model inputs",
    "test_prepare.py": "prepared corpora",
    "test_tune.py": "tune",
    "test_endings.py": "endings: signals and pipes",
    "test_sweep.py": "sweeps",
    "test_trackers.py": "trackers",
    "test_first_hour.py": "first hour",
    "test_first_hour_output.py": "first-hour output",
}
_cases: Counter[str] = Counter()


@pytest.fixture
def handlers() -> Iterator[None]:
    """The handlers of the signals a run stops for, as they were before the test."""
    saved = {sig: signal.getsignal(sig) for sig in (*HANDLED, signal.SIGQUIT)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


@pytest.fixture
def warned(gputrain_warnings: list[str]) -> list[str]:
    """Warnings of the `gputrain` logger (tests/conftest.py's collector)."""
    return gputrain_warnings


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
