"""The tensor environments against gymnasium, the reference implementation: from the same state,
the same actions give the same observations, rewards, terminations and truncations, over long
random action sequences (many episodes per environment, resets included).

gymnasium computes in float64 (numpy); so do the tensor environments here (rl.env_dtype=float64).
After each episode the gymnasium environment is reset by its own seeded generator and its start
state copied into the tensor environment (auto-reset draws keyed random numbers instead: its start
states are checked against gymnasium's bounds in test_vector.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gputrain.rl.envs import make_env

gym = pytest.importorskip("gymnasium")
TOL = 1e-5


def _gym_state(env) -> torch.Tensor:
    return torch.tensor(np.asarray(env.unwrapped.state, dtype=np.float64))


def side_by_side(name: str, actions_for, num_envs: int, steps: int, max_episode_steps: int | None = None,
                 seed: int = 0) -> dict[str, float]:
    """Step `num_envs` gymnasium environments and the tensor ones together; assert every step agrees.
    `actions_for(rng, obs)` picks the actions from gymnasium's observations. Returns counts."""
    rng = np.random.default_rng(seed)
    kwargs = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
    refs = [gym.make(name, **kwargs) for _ in range(num_envs)]
    obs = np.stack([ref.reset(seed=seed * 1000 + i)[0] for i, ref in enumerate(refs)])
    env = make_env(name, num_envs, max_episode_steps=max_episode_steps, seed=seed)
    env.state = torch.stack([_gym_state(ref) for ref in refs])
    np.testing.assert_array_equal(env.observe().numpy(), obs)
    counts = {"steps": 0, "terminated": 0, "truncated": 0, "bit_equal_obs": 0, "max_diff": 0.0}
    for t in range(steps):
        actions = actions_for(rng, obs)
        out = env.step(torch.from_numpy(actions))
        for i, ref in enumerate(refs):
            ref_obs, reward, terminated, truncated, _ = ref.step(actions[i])
            ours = out.final_obs[i].numpy()
            diff = float(np.abs(ours - ref_obs).max())
            assert diff <= TOL, f"{name} step {t} env {i}: observation {ours} vs gymnasium {ref_obs}"
            assert abs(out.reward[i].item() - reward) <= TOL, f"{name} step {t} env {i}: reward"
            assert bool(out.terminated[i]) == terminated, f"{name} step {t} env {i}: terminated"
            assert bool(out.truncated[i]) == truncated, f"{name} step {t} env {i}: truncated"
            counts["bit_equal_obs"] += diff == 0.0
            counts["max_diff"] = max(counts["max_diff"], diff)
            counts["steps"] += 1
            counts["terminated"] += terminated
            counts["truncated"] += truncated
            if terminated or truncated:
                ref_obs, _ = ref.reset(seed=int(rng.integers(1 << 31)))
                env.state[i] = _gym_state(ref)
            obs[i] = ref_obs
        assert torch.equal(out.obs[~(out.terminated | out.truncated)], out.final_obs[~(out.terminated | out.truncated)])
    return counts


def uniform_actions(n: int):
    return lambda rng, obs: rng.integers(0, n, len(obs))


def test_cartpole_equals_gymnasium_over_long_random_sequences():
    counts = side_by_side("CartPole-v1", uniform_actions(2), num_envs=16, steps=2500)
    assert counts["terminated"] > 1000  # ~20-step episodes: a thousand resets
    assert counts["bit_equal_obs"] == counts["steps"]  # the same float64 operations in the same order


def test_cartpole_truncation_by_the_time_limit():
    def balance(rng, obs):  # push towards the pole's lean (with some noise): long episodes
        lean = obs[:, 2] + 0.5 * obs[:, 3]
        return np.where(rng.random(len(obs)) < 0.4, rng.integers(0, 2, len(obs)), (lean > 0).astype(np.int64))

    counts = side_by_side("CartPole-v1", balance, num_envs=8, steps=1500, max_episode_steps=100)
    assert counts["truncated"] >= 50 and counts["terminated"] > 0


def test_mountain_car_equals_gymnasium_reaching_the_goal_and_timing_out():
    def pump(rng, obs):  # push along the velocity (reaches the flag), sometimes at random
        return np.where(rng.random(len(obs)) < 0.3, rng.integers(0, 3, len(obs)), np.where(obs[:, 1] > 0, 2, 0))

    counts = side_by_side("MountainCar-v0", pump, num_envs=16, steps=1200)
    assert counts["terminated"] > 20 and counts["truncated"] > 0  # the left wall is hit on the way
    assert counts["bit_equal_obs"] == counts["steps"]


def test_pendulum_equals_gymnasium_with_float32_torques_beyond_the_bounds():
    def torques(rng, obs):  # float32, as a policy's actions; some beyond ±2 (clipped by the env)
        return rng.uniform(-3.0, 3.0, (len(obs), 1)).astype(np.float32)

    counts = side_by_side("Pendulum-v1", torques, num_envs=16, steps=1000)
    assert counts["truncated"] == 16 * 5 and counts["terminated"] == 0
    assert counts["bit_equal_obs"] == counts["steps"]


def test_acrobot_equals_gymnasium_within_episodes_of_200_steps():
    def swing(rng, obs):  # odd environments: random torques (time out); even: mostly against the
        # first joint's velocity (swing up and terminate)
        noisy = np.where(rng.random(len(obs)) < 0.5, rng.integers(0, 3, len(obs)), np.where(obs[:, 4] < 0, 2, 0))
        return np.where(np.arange(len(obs)) % 2 == 0, noisy, rng.integers(0, 3, len(obs)))

    counts = side_by_side("Acrobot-v1", swing, num_envs=16, steps=1600, max_episode_steps=200)
    assert counts["terminated"] > 20 and counts["truncated"] > 20


def test_acrobot_one_step_equals_gymnasium_from_every_state_of_full_episodes():
    """Acrobot is chaotic: a last-bit difference between torch's and glibc's sin/cos or numpy's
    scalar pow grows past 1e-5 after a few hundred steps (gymnasium against itself from a state one
    ulp away does the same, see the next test). So full 500-step episodes are compared one step at
    a time, each step from gymnasium's own state."""
    rng = np.random.default_rng(1)
    refs = [gym.make("Acrobot-v1") for _ in range(8)]
    for i, ref in enumerate(refs):
        ref.reset(seed=i)
    env = make_env("Acrobot-v1", 8)
    worst = 0.0
    for _ in range(1500):
        env.state = torch.stack([_gym_state(ref) for ref in refs])
        env.elapsed = torch.tensor([ref._elapsed_steps for ref in refs])
        actions = rng.integers(0, 3, 8)
        out = env.step(torch.from_numpy(actions))
        for i, ref in enumerate(refs):
            ref_obs, reward, terminated, truncated, _ = ref.step(actions[i])
            worst = max(worst, float(np.abs(out.final_obs[i].numpy() - ref_obs).max()))
            assert out.reward[i].item() == reward and bool(out.terminated[i]) == terminated
            assert bool(out.truncated[i]) == truncated
            if terminated or truncated:
                ref.reset(seed=int(rng.integers(1 << 31)))
    assert worst <= 1e-6


def test_acrobot_diverges_from_itself_one_ulp_away():
    """Why the comparison above goes step by step: gymnasium's own Acrobot, started one ulp apart,
    drifts past 1e-5 within a few hundred more steps."""
    rng = np.random.default_rng(2)
    a, b = (gym.make("Acrobot-v1", max_episode_steps=10**6).unwrapped for _ in range(2))
    a.reset(seed=3)
    b.reset(seed=3)
    b.state = np.nextafter(np.asarray(a.state, dtype=np.float64), np.inf)
    diverged_at = None
    for step in range(3000):
        action = int(rng.integers(3))
        a.step(action)
        b.step(action)
        if np.abs(a.state - b.state).max() > 1e-5:
            diverged_at = step
            break
    assert diverged_at is not None  # (the loop's own index would pass even with no divergence)


def test_float32_state_stays_close_to_float64_over_an_episode_start():
    """rl.env_dtype=float32: the same dynamics in float32 (faster on most GPUs), close to float64."""
    wide, narrow = make_env("CartPole-v1", 64, seed=5), make_env("CartPole-v1", 64, seed=5, dtype=torch.float32)
    assert torch.allclose(wide.observe(), narrow.observe())
    actions = torch.randint(0, 2, (10, 64), generator=torch.Generator().manual_seed(0))
    for a in actions:
        x, y = wide.step(a), narrow.step(a)
        assert torch.allclose(x.final_obs, y.final_obs, atol=1e-5)
