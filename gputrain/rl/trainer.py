"""PPO on gputrain's parts: `PPOTrainer.fit` is the loop, one iteration at a time:

    rollout (num_steps steps of every environment)  →  GAE  →  update_epochs × num_minibatches steps

as in CleanRL's ppo.py. Around it, what every gputrain run has: a run directory that belongs to one
run, resume bit for bit from the last checkpoint (weights, optimizer, schedule, every environment,
the normalisers, the counters that key all randomness), metrics.jsonl and TensorBoard rows on logging
iterations (the only host syncs), Ctrl-C/SIGTERM saving a checkpoint, and summary.json whatever ends
the run.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from gputrain.config import Config, load_config
from gputrain.config.schema import ppo_defaults
from gputrain.distributed.context import all_reduce_sum
from gputrain.rl.build import build_rl, resolved_config
from gputrain.rl.episodes import WINDOW, EpisodeFigures
from gputrain.rl.gae import bootstrap_truncations, compute_gae
from gputrain.rl.minibatches import epoch_minibatches
from gputrain.rl.ppo import LOSS_TERMS, Batch, UpdateResult, ppo_update
from gputrain.rl.resume import ENV_KEY, check_env_state
from gputrain.rl.rollout import collect_rollout
from gputrain.run.prior import PriorRun
from gputrain.run.record import LoopFigures
from gputrain.run.shell import LoopShape, RunShell
from gputrain.train.compile_check import unchecked
from gputrain.train.nonfinite import note_bad_steps
from gputrain.train.state import LoopState
from gputrain.train.trainer import ConfigLike


class PPOTrainer:
    """Train a policy with PPO on tensor environments, as `gputrain rl` does.

    Args:
        config: a Config (taken as it is), a dict of dotted keys (`{"rl.env": "Pendulum-v1"}`), or a
            TOML path; optim.lr, optim.eps and train.clip_grad_norm that these leave unset are CleanRL's.
        run_dir: where the run's files go (default `runs/ppo-<env>-<time>/`).
        overrides: `section.key=value` strings or a dict, applied on top of `config`.

    Raises:
        UsageError (ConfigError): bad config, before anything heavy starts.
    """

    def __init__(
        self,
        config: ConfigLike = None,
        run_dir: str | Path | None = None,
        overrides: Mapping[str, Any] | list[str] | None = None,
    ) -> None:
        self.config = (
            config
            if isinstance(config, Config) and not overrides
            else load_config(config, overrides or (), defaults=ppo_defaults)  # CleanRL's optim.lr, ... unless set
        )
        self.parts = parts = build_rl(self.config, run_dir)
        self.config = resolved_config(self.config, parts)  # config.toml records what runs, not "auto"
        self.settings, self.place, self.dist = parts.settings, parts.place, parts.place.dist
        self.policy, self.envs, self.rollout = parts.policy, parts.envs, parts.rollout
        self.checkpointer, self.metrics, self.console = parts.checkpointer, parts.metrics, parts.console
        self.run_dir = parts.run_dir
        self.seed = self.config.train.seed
        self.figures: EpisodeFigures | None = None
        """The episode figures of the last logging iteration."""
        shape = LoopShape(
            total=self.settings.num_iterations,
            unit="iteration",
            longer="rl.total_timesteps",
            meta={"task": None, "num_classes": None},
            complete=self._already_solved,
            kind="rl",
        )
        check_envs = functools.partial(check_env_state, envs=self.envs, total_envs=int(self.settings.num_envs))
        self.shell = RunShell(
            parts, self.config, shape, self._figures, states={ENV_KEY: self.envs}, checks=(check_envs,)
        )
        self.state, self.stop = self.shell.state, self.shell.stop

    # ----------------------------------------------------------------- the loop
    def fit(self, on_iteration: Callable[[int], None] | None = None) -> dict[str, Any]:
        """Train to rl.total_timesteps (or rl.stop_at_return); return the summary (summary.json).

        Args:
            on_iteration: called with the iteration's number after each iteration.
        """
        summary = self.shell.run(lambda: self._train(on_iteration))
        if self.figures is not None and self.figures.window_return is not None:
            last = self.figures.window_size
            self.console.info(f"episodic return {self.figures.window_return:.2f} (mean of the last {last} episodes)")
        return summary

    def _train(self, on_iteration: Callable[[int], None] | None) -> str:
        """Iterations until rl.total_timesteps or rl.stop_at_return; returns how the run ended."""
        s, state, shell = self.settings, self.state, self.shell
        while True:
            iteration = state.global_step + 1
            clock = time.perf_counter()
            result, batch = self._iterate(iteration)
            state.global_step = iteration
            state.samples_seen += s.batch_size
            state.train_time_s += time.perf_counter() - clock
            logs = self.metrics.due(iteration)
            solved = self._log(iteration, result, batch) if logs else False
            self.console.advance(iteration)
            ends = solved or iteration >= s.num_iterations
            saves = ends or iteration % self.parts.checkpoint_every == 0
            if saves:
                shell.save()
            if on_iteration is not None:
                on_iteration(iteration)
            # several ranks agree on a signal where they sync anyway (a row, a checkpoint), as the Trainer's loop
            if shell.stop_requested(logs or saves):
                shell.interrupted()
            if ends:
                return "stopped_early" if solved else "completed"

    def _iterate(self, iteration: int) -> tuple[UpdateResult, Batch]:
        """One PPO iteration: rollout, advantages, update; then the schedule's step. An update the
        guard did not apply (train.on_nonfinite) stops the run here, or is counted and warned of;
        a device-side guard's flag is read once per iteration (the iteration's only host read)."""
        s, parts = self.settings, self.parts
        collect_rollout(self.policy, self.envs, self.rollout, parts.action_noise)
        batch = self._advantages()
        result = ppo_update(parts.step, batch, self._epochs(iteration), s, self.dist)
        bad = result.bad + parts.step.guard.settle(result.minibatches)
        rank = self.dist.rank if self.dist.enabled else None
        name = f"iteration {iteration}, update {{}}".format
        note_bad_steps(bad, self.state, self.config.train.on_nonfinite, rank, unit="update", name=name)
        parts.scheduler.step()
        return result, batch

    @torch.no_grad()
    def _advantages(self) -> Batch:
        """GAE over the rollout (bootstrapping truncated episodes first, where asked), flattened."""
        s, r = self.settings, self.rollout
        rewards = r.rewards
        if s.bootstrap_truncated:
            final_values = self.policy.value(r.final_obs.flatten(0, 1)).view_as(rewards)
            rewards = bootstrap_truncations(rewards, final_values, r.truncated_only, s.gamma)
        next_value = self.policy.value(self.envs.obs)
        advantages, returns = compute_gae(rewards, r.values, r.dones, next_value, s.gamma, s.gae_lambda)
        return Batch(
            obs=r.obs.flatten(0, 1),
            actions=r.actions.flatten(0, 1),
            logprobs=r.logprobs.flatten(0, 1),
            advantages=advantages.flatten(),
            returns=returns.flatten(),
            values=r.values.flatten(),
        )

    def _epochs(self, iteration: int) -> Iterator[list[torch.Tensor]]:
        s, env = self.settings, self.envs.env
        for epoch in range(int(s.update_epochs)):  # int(): resolved, `auto` no more
            yield epoch_minibatches(
                self.seed,
                iteration,
                epoch,
                int(s.num_steps),
                int(s.num_envs),
                int(s.num_minibatches),
                env.first_env,
                env.num_envs,
                env.device,
            )

    # ----------------------------------------------------------------- logging
    def _log(self, iteration: int, result: UpdateResult, batch: Batch) -> bool:
        """Write the iteration's row (collective: figures are summed over the ranks); True when
        rl.stop_at_return is reached by the mean of the last 100 episodes."""
        s = self.settings
        figures = self.figures = self.envs.tracker.take_figures()
        self.state.extra["episodes"] = self.state.extra.get("episodes", 0) + figures.episodes
        terms = (all_reduce_sum(result.last_sums, self.dist) / s.minibatch_size).tolist()
        losses = dict(zip(LOSS_TERMS, terms))
        clipped = all_reduce_sum(result.clipped, self.dist).item()
        record: dict[str, Any] = {
            "step": iteration,
            "env_steps": self.state.samples_seen,
            "episodic_return": figures.mean_return,
            "episodic_length": figures.mean_length,
            "episodes": figures.episodes,
            "return_last_100": figures.window_return,
            "lr": self.parts.optimizer.param_groups[0]["lr"],
            **losses,
            "loss": losses["policy_loss"] - s.ent_coef * losses["entropy"] + s.vf_coef * losses["value_loss"],
            "clipfrac": clipped / (result.minibatches * s.minibatch_size),
            "explained_variance": self._explained_variance(batch),
            "grad_norm": float(result.grad_norm),
            # environment steps per second since the last row, rollout and update: CleanRL's SPS
            "env_steps_per_s": self.metrics.samples_per_s(self.state),
        }
        if s.target_kl is not None:
            record["minibatches"] = result.minibatches
        self.metrics.log_record(record, self.state)
        self.console.info(_console_line(record, s.num_iterations))
        return _reaches(figures, s.stop_at_return)

    def _explained_variance(self, batch: Batch) -> float | None:
        """1 - Var(returns - values) / Var(returns) over the whole rollout (all ranks)."""
        # in float64: the figure is 1 minus a ratio near 1 early on, which float32 sums would swamp
        returns = batch.returns.double()
        residual = returns - batch.values.double()
        sums = torch.stack((returns.sum(), returns.square().sum(), residual.sum(), residual.square().sum()))
        total, total_sq, res, res_sq = all_reduce_sum(sums, self.dist).tolist()
        n = self.settings.batch_size
        var_y = total_sq / n - (total / n) ** 2
        var_res = res_sq / n - (res / n) ** 2
        return None if var_y <= 0 else 1 - var_res / var_y

    # ----------------------------------------------------------------- resume
    def _already_solved(self, prior: PriorRun | None, state: LoopState) -> bool:
        """Whether the run resumed from stopped at rl.stop_at_return, at this checkpoint, and still
        meets it: then it is complete, as a run that reached its last iteration is."""
        if prior is None or prior.summary is None or prior.summary.get("status") != "stopped_early":
            return False
        if prior.summary.get("global_step") != state.global_step:
            return False
        return _reaches(self.envs.tracker.take_figures(), self.settings.stop_at_return)

    # ----------------------------------------------------------------- the record
    def _figures(self, status: str) -> LoopFigures:
        """summary.json: every run's figures (train speed is environment steps per second), and an
        "rl" block with the episodes' figures."""
        s, state, figures = self.settings, self.state, self.figures
        rl = {
            "env": s.env,
            "policy": s.policy,
            "num_envs": s.num_envs,
            "iterations": state.global_step,
            "env_steps": state.samples_seen,
            "env_steps_per_s": state.samples_seen / state.train_time_s if state.train_time_s > 0 else None,
            "episodes": state.extra.get("episodes", 0),
            "episodic_return": figures.window_return if figures else None,
            "episodic_length": figures.window_length if figures else None,
            "window_episodes": figures.window_size if figures else 0,
            "stop_at_return": s.stop_at_return,
            "solved": status == "stopped_early" if s.stop_at_return is not None else None,
        }
        return LoopFigures(
            compile=unchecked("the PPO update") if self.config.train.compile else None, blocks={"rl": rl}
        )


def _reaches(figures: EpisodeFigures, target: float | None) -> bool:
    """The mean return of a full window of the last 100 episodes is at least `target`."""
    window = figures.window_return
    return target is not None and window is not None and figures.window_size >= WINDOW and window >= target


def _console_line(record: dict[str, Any], total: int) -> str:
    def number(key: str, digits: int = 2) -> str:
        value = record.get(key)
        return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"

    return (
        f"iteration {record['step']}/{total}  env steps {record['env_steps']:,}  "
        f"return {number('episodic_return', 1)} (last 100: {number('return_last_100', 1)})  "
        f"length {number('episodic_length', 1)}  {record['env_steps_per_s']:,.0f} steps/s  "
        f"approx_kl {number('approx_kl', 4)}  clipfrac {number('clipfrac', 3)}"
    )
