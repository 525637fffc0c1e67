from __future__ import annotations

from collections.abc import Callable

import pytest

from gputrain.env.facts import EnvReport
from tests.unit.env.recorded_facts import edited_facts


@pytest.fixture
def facts() -> Callable[..., EnvReport]:
    """`facts("h100_healthy", **{"driver.driver_cuda_version": "11.4"})`: recorded facts, edited."""
    return edited_facts
