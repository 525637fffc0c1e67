"""Episode returns and lengths counted on the device: the mean since the last log, and the last 100
episodes in the order they ended (whatever the layout, and across a checkpoint)."""

from __future__ import annotations

import torch

from gputrain.distributed.context import DistContext
from gputrain.rl.episodes import WINDOW, EpisodeTracker


def _python_reference(rewards: torch.Tensor, dones: torch.Tensor) -> list[tuple[int, int, float, int]]:
    """(step, env, return, length) of every finished episode, in the order they ended."""
    running = [0.0] * rewards.shape[1]
    lengths = [0] * rewards.shape[1]
    finished = []
    for t in range(rewards.shape[0]):
        for e in range(rewards.shape[1]):
            running[e] += rewards[t, e].item()
            lengths[e] += 1
            if dones[t, e]:
                finished.append((t, e, running[e], lengths[e]))
                running[e], lengths[e] = 0.0, 0
    return finished


def _play(steps: int = 400, envs: int = 32, done_rate: float = 0.05, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 5, (steps, envs), generator=g).double()
    dones = torch.rand(steps, envs, generator=g) < done_rate
    return rewards, dones


def test_means_since_the_last_log_and_over_the_last_100_episodes():
    rewards, dones = _play()
    tracker = EpisodeTracker(32, 32, 0, torch.device("cpu"), DistContext())
    for t in range(200):
        tracker.record(rewards[t], dones[t], t)
    first = tracker.take_figures()
    for t in range(200, 400):
        tracker.record(rewards[t], dones[t], t)
    second = tracker.take_figures()
    episodes = _python_reference(rewards, dones)
    later = [ep for ep in episodes if ep[0] >= 200]
    assert first.episodes == len(episodes) - len(later) and second.episodes == len(later)
    assert abs(second.mean_return - sum(ep[2] for ep in later) / len(later)) < 1e-9
    assert abs(second.mean_length - sum(ep[3] for ep in later) / len(later)) < 1e-9
    last = episodes[-WINDOW:]
    assert second.window_size == WINDOW
    assert abs(second.window_return - sum(ep[2] for ep in last) / WINDOW) < 1e-9
    assert abs(second.window_length - sum(ep[3] for ep in last) / WINDOW) < 1e-9
    assert tracker.take_figures().episodes == 0 and tracker.take_figures().mean_return is None


def test_more_than_100_episodes_ending_in_one_step_keep_the_last_100():
    tracker = EpisodeTracker(300, 300, 0, torch.device("cpu"), DistContext())
    tracker.record(torch.arange(300).double(), torch.ones(300, dtype=torch.bool), 0)
    figures = tracker.take_figures()
    assert figures.window_size == WINDOW and figures.window_return == sum(range(200, 300)) / 100


def test_the_window_survives_a_checkpoint_and_a_new_layout():
    """A tracker restored from a state dict, whole or as two halves (two ranks' shares), reports the
    same figures afterwards as the one that ran on."""
    rewards, dones = _play(steps=600, envs=16, done_rate=0.08, seed=3)
    whole = EpisodeTracker(16, 16, 0, torch.device("cpu"), DistContext())
    for t in range(300):
        whole.record(rewards[t], dones[t], t)
    saved = whole.state_dict()
    resumed = EpisodeTracker(16, 16, 0, torch.device("cpu"), DistContext())
    resumed.load_state_dict(saved)
    halves = [EpisodeTracker(8, 16, 8 * r, torch.device("cpu"), DistContext()) for r in range(2)]
    for r, half in enumerate(halves):
        half.load_state_dict({**{k: v[8 * r: 8 * r + 8] for k, v in saved.items() if k != "window"},
                              "window": saved["window"]})
    for t in range(300, 600):
        whole.record(rewards[t], dones[t], t)
        resumed.record(rewards[t], dones[t], t)
        for r, half in enumerate(halves):
            half.record(rewards[t, 8 * r: 8 * r + 8], dones[t, 8 * r: 8 * r + 8], t)
    expected = whole.take_figures()
    assert resumed.take_figures() == expected
    # the two halves' windows merged as the ranks merge them: the newest 100 by (step, environment)
    for half in halves:
        half._fold()  # take_figures folds too, but would merge only its own rank's window here
    keys = torch.cat([h.window_key[:WINDOW] for h in halves])
    returns = torch.cat([h.window_return[:WINDOW] for h in halves])
    top = torch.topk(keys, WINDOW).indices
    assert returns[top].sum().item() / WINDOW == expected.window_return
