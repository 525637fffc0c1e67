"""The batch of environments: same-step auto-reset on the device, the time limit, start states within
gymnasium's bounds, and randomness keyed by (seed, step, environment) rather than by layout."""

from __future__ import annotations

import math

import pytest
import torch

from gputrain.config.names import ENV_ACTIONS
from gputrain.rl.envs import ENVS, make_env
from gputrain.rl.envs.keyed_random import ACTION, RESET, keyed_uniform

# gymnasium's reset bounds, per state component
START_BOUNDS = {
    "CartPole-v1": [(-0.05, 0.05)] * 4,
    "Acrobot-v1": [(-0.1, 0.1)] * 4,
    "MountainCar-v0": [(-0.6, -0.4), (0.0, 0.0)],
    "Pendulum-v1": [(-math.pi, math.pi), (-1.0, 1.0)],
}


def test_the_config_lists_the_registered_environments():
    assert {name: cls.action_space.kind for name, cls in ENVS.items()} == ENV_ACTIONS


@pytest.mark.parametrize("name", sorted(ENVS))
def test_start_states_fill_gymnasiums_bounds(name):
    state = make_env(name, 4096, seed=1).state
    for column, (low, high) in enumerate(START_BOUNDS[name]):
        values = state[:, column]
        assert values.min() >= low and values.max() <= high
        if high > low:  # spread over the range, not stuck at one value
            assert values.min() < low + 0.05 * (high - low) and values.max() > high - 0.05 * (high - low)


def test_auto_reset_returns_the_next_episodes_first_observation_in_the_same_step():
    env = make_env("CartPole-v1", 256, seed=0)
    pushes = torch.ones(256, dtype=torch.int64)  # always right: every pole falls within ~10-30 steps
    ended = torch.zeros(256, dtype=torch.bool)
    for _ in range(60):
        before = env.state.clone()
        out = env.step(pushes)
        done = out.terminated | out.truncated
        ended |= done
        stepped, _, terminated = env.dynamics.step(before, pushes)
        assert torch.equal(out.final_obs, stepped.float()) and torch.equal(out.terminated, terminated)
        # where done: the observation is the new start state's; elsewhere the step's own
        assert torch.equal(out.obs[done], env.state[done].float())
        assert torch.equal(out.obs[~done], out.final_obs[~done])
        assert (env.state[done].abs() <= 0.05).all() and (env.elapsed[done] == 0).all()
    assert ended.all()


def test_the_time_limit_truncates_and_counts_per_environment():
    env = make_env("Pendulum-v1", 3, max_episode_steps=5)
    env.elapsed = torch.tensor([0, 2, 4])
    out = env.step(torch.zeros(3, 1))
    assert out.truncated.tolist() == [False, False, True] and env.elapsed.tolist() == [1, 3, 0]
    assert not out.terminated.any()


def test_an_environment_draws_the_same_randomness_wherever_it_runs():
    """Environment 5 of 8 on one process, and environment 1 of rank 1's 4 (first_env=4): the same
    start states at every reset, and the same action noise, as data parallelism needs."""
    whole = make_env("CartPole-v1", 8, seed=3)
    half = make_env("CartPole-v1", 4, seed=3, first_env=4)
    assert torch.equal(whole.state[4:], half.state)
    push = torch.ones(8, dtype=torch.int64)
    for _ in range(40):
        a, b = whole.step(push), half.step(push[4:])
        assert torch.equal(a.obs[4:], b.obs) and torch.equal(a.terminated[4:], b.terminated)
    ids = torch.arange(8)
    assert torch.equal(keyed_uniform(3, ACTION, 17, ids, 2)[4:], keyed_uniform(3, ACTION, 17, ids[4:], 2))


def test_keyed_uniforms_are_uniform_and_independent_across_keys():
    ids = torch.arange(200_000)
    u = keyed_uniform(0, RESET, 0, ids, 2)
    assert u.min() > 0 and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.003 and abs(u.var().item() - 1 / 12) < 0.001
    assert abs(torch.corrcoef(u.T)[0, 1].item()) < 0.01  # the draws of one key
    histogram = torch.histc(u[:, 0].float(), bins=20, min=0, max=1)
    assert (histogram - 10_000).abs().max() < 500  # ~5 standard deviations of a bin's count
    for other in (keyed_uniform(1, RESET, 0, ids, 2), keyed_uniform(0, ACTION, 0, ids, 2),
                  keyed_uniform(0, RESET, 1, ids, 2), keyed_uniform(0, RESET, 2**32, ids, 2)):
        assert abs(torch.corrcoef(torch.stack((u[:, 0], other[:, 0])))[0, 1].item()) < 0.01
        assert (u != other).float().mean() > 0.999


def test_state_dict_round_trip_continues_identically():
    a = make_env("Acrobot-v1", 16, seed=2)
    for _ in range(30):
        a.step(torch.randint(0, 3, (16,), generator=torch.Generator().manual_seed(1)))
    b = make_env("Acrobot-v1", 16, seed=2)
    b.load_state_dict(a.state_dict())
    for step in range(300):
        action = torch.randint(0, 3, (16,), generator=torch.Generator().manual_seed(step))
        x, y = a.step(action), b.step(action)
        assert torch.equal(x.obs, y.obs) and torch.equal(x.reward, y.reward)
