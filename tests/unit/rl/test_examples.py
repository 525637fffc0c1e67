"""The example configs that README.md and the benchmarks run: they load, and choose the environment
and the policy their comments promise."""

from __future__ import annotations

from pathlib import Path

import pytest

from gputrain.config import load_config

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.mark.parametrize("name, env, policy, target", [
    ("rl_cartpole", "CartPole-v1", "categorical", 475),
    ("rl_pendulum", "Pendulum-v1", "gaussian", -200),
])
def test_rl_example_loads(name: str, env: str, policy: str, target: float) -> None:
    settings = load_config(EXAMPLES / f"{name}.toml").rl.resolved()
    assert (settings.env, settings.policy, settings.stop_at_return) == (env, policy, target)
    assert settings.batch_size % settings.num_minibatches == 0 and settings.num_iterations > 0
