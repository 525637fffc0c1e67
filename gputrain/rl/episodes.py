"""Episode returns and lengths, counted on the device (gymnasium's RecordEpisodeStatistics, for a
batch of environments, before any reward normalisation).

Two figures come out: the mean over the episodes that finished since the last logging iteration
(CleanRL's `charts/episodic_return`), and the mean of the last 100 episodes (the solve criterion:
CartPole-v1 is solved at 475). Nothing here reads a value to the host; the loop does, on logging
iterations. The last 100 episodes are ordered by when they ended, then by global environment index,
so every layout of ranks, and a resumed run, sees the same 100.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from gputrain.distributed.context import DistContext, all_gather_cat, all_reduce_sum
from gputrain.env.device import queued_copy

WINDOW = 100
"""Episodes in the running mean (gymnasium's RecordEpisodeStatistics keeps 100 too)."""


@dataclass(frozen=True, slots=True)
class EpisodeFigures:
    """Figures over every rank, on the host."""

    episodes: int
    """Episodes finished since the last logging iteration."""
    mean_return: float | None
    mean_length: float | None
    window_return: float | None
    """Mean return of the last (up to) 100 episodes."""
    window_length: float | None
    window_size: int


class EpisodeTracker:
    """Args:
    num_envs: environments of this rank.
    total_envs: environments of all ranks (the key that orders episodes).
    first_env: the global index of this rank's first environment.
    block_steps: steps recorded before their episodes are folded into the figures (a rollout's
        num_steps): a step then costs a few element-wise operations, and the folding is batched.
    """

    def __init__(
        self,
        num_envs: int,
        total_envs: int,
        first_env: int,
        device: torch.device,
        job: DistContext,
        block_steps: int = 128,
    ) -> None:
        self.job = job
        self.total_envs = total_envs
        self.env_ids = torch.arange(first_env, first_env + num_envs, device=device)
        self.episode_return = torch.zeros(num_envs, dtype=torch.float64, device=device)
        self.episode_length = torch.zeros(num_envs, dtype=torch.int64, device=device)
        # finished since the last logging iteration, per environment
        self.finished_return = torch.zeros(num_envs, dtype=torch.float64, device=device)
        self.finished_length = torch.zeros(num_envs, dtype=torch.int64, device=device)
        self.finished = torch.zeros(num_envs, dtype=torch.int64, device=device)
        # this rank's last WINDOW episodes in a ring; one spare slot takes the writes that are dropped
        self.window_return = torch.zeros(WINDOW + 1, dtype=torch.float64, device=device)
        self.window_length = torch.zeros(WINDOW + 1, dtype=torch.int64, device=device)
        self.window_key = torch.full((WINDOW + 1,), -1, dtype=torch.int64, device=device)
        self.head = torch.zeros((), dtype=torch.int64, device=device)
        # the steps recorded since the last fold: (step, environment) of the episodes' ends
        self._done = torch.zeros(block_steps, num_envs, dtype=torch.bool, device=device)
        self._return = torch.zeros(block_steps, num_envs, dtype=torch.float64, device=device)
        self._length = torch.zeros(block_steps, num_envs, dtype=torch.int64, device=device)
        self._steps: list[int] = []

    def record(self, reward: torch.Tensor, done: torch.Tensor, step: int) -> None:
        """Count one step of every environment; `done` ends episodes; `step` is the step's index."""
        row = len(self._steps)
        self.episode_return += reward
        self.episode_length += 1
        self._done[row] = done
        self._return[row] = self.episode_return
        self._length[row] = self.episode_length
        self._steps.append(step)
        self.episode_return = torch.where(done, 0.0, self.episode_return)
        self.episode_length = torch.where(done, 0, self.episode_length)
        if len(self._steps) == self._done.shape[0]:
            self._fold()

    def _fold(self) -> None:
        """Add the recorded steps' finished episodes to the figures since the last log and to the
        ring of the last WINDOW, without a sync. In (step, environment) order, the i-th of the d
        episodes that ended goes to slot head + i; where more than WINDOW ended, only the last WINDOW
        are written (the others go to the spare slot, which is never read)."""
        rows = len(self._steps)
        if not rows:
            return
        done, returns, lengths = self._done[:rows], self._return[:rows], self._length[:rows]
        self.finished_return += torch.where(done, returns, 0.0).sum(0)
        self.finished_length += torch.where(done, lengths, 0).sum(0)
        self.finished += done.sum(0)
        steps = queued_copy(torch.tensor(self._steps, dtype=torch.int64), done.device)
        keys = (steps.unsqueeze(1) * self.total_envs + self.env_ids).flatten()
        done = done.flatten()
        position = torch.cumsum(done, 0)  # 1-based among the episodes that ended
        ended = position[-1]
        dropped = (ended - WINDOW).clamp(min=0)
        keep = done & (position > dropped)
        slot = torch.where(keep, (self.head + position - 1 - dropped) % WINDOW, WINDOW)
        self.window_return.index_put_((slot,), returns.flatten())
        self.window_length.index_put_((slot,), lengths.flatten())
        self.window_key.index_put_((slot,), keys)
        self.head = (self.head + ended.clamp(max=WINDOW)) % WINDOW
        self._steps.clear()

    def _merged_window(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(key, return, length) of the last WINDOW episodes over all ranks, newest first."""
        key = all_gather_cat(self.window_key[:WINDOW], self.job)
        returns = all_gather_cat(self.window_return[:WINDOW], self.job)
        lengths = all_gather_cat(self.window_length[:WINDOW], self.job)
        key, order = torch.topk(key, min(WINDOW, key.numel()))
        valid = key >= 0
        return key[valid], returns[order][valid], lengths[order][valid]

    def take_figures(self) -> EpisodeFigures:
        """The figures since the last call, over all ranks (collective; reads them to the host)."""
        self._fold()
        sums = torch.stack(
            (self.finished_return.sum(), self.finished_length.sum().double(), self.finished.sum().double())
        )
        total_return, total_length, count_float = all_reduce_sum(sums, self.job).tolist()
        _, returns, lengths = self._merged_window()
        size = returns.numel()
        window_return, window_length = torch.stack((returns.sum(), lengths.sum().double())).tolist()
        self.finished_return.zero_()
        self.finished_length.zero_()
        self.finished.zero_()
        count = int(count_float)
        return EpisodeFigures(
            episodes=count,
            mean_return=total_return / count if count else None,
            mean_length=total_length / count if count else None,
            window_return=window_return / size if size else None,
            window_length=window_length / size if size else None,
            window_size=size,
        )

    # ------------------------------------------------------------------ checkpoint
    PER_ENV = ("episode_return", "episode_length", "finished_return", "finished_length", "finished")

    def state_dict(self) -> dict[str, Any]:
        """Collective. Per-environment tensors of this rank (the caller gathers them) and the merged
        window of all ranks, oldest first."""
        self._fold()
        key, returns, lengths = self._merged_window()
        state: dict[str, Any] = {name: getattr(self, name) for name in self.PER_ENV}
        state["window"] = {"key": key.flip(0), "return": returns.flip(0), "length": lengths.flip(0)}
        return state

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """This rank's environments' tensors, and its own episodes of the merged window put back in
        the ring oldest first (the ring then drops the oldest next, as the unbroken run does)."""
        device = self.env_ids.device
        for name in self.PER_ENV:
            setattr(self, name, saved[name].to(device, copy=True))
        window = saved["window"]
        key = window["key"].to(device)
        mine = (key % self.total_envs >= self.env_ids[0]) & (key % self.total_envs <= self.env_ids[-1])
        count = int(mine.sum())
        self.window_key.fill_(-1)
        self.window_key[:count] = key[mine]
        self.window_return[:count] = window["return"].to(device)[mine]
        self.window_length[:count] = window["length"].to(device)[mine]
        self.head.fill_(count % WINDOW)
