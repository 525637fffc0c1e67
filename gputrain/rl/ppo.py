"""The PPO update (Schulman et al. 2017) as CleanRL's ppo.py writes it: update_epochs passes over the
rollout in shuffled minibatches; per minibatch the clipped surrogate, the (clipped) value loss and
the entropy bonus; early stop on target_kl. Each minibatch's update is the Trainer's
(`apply_update`, train/step.py): gradients clipped as train.clip_grad_norm / clip_grad_value say
(CleanRL's max_grad_norm 0.5 by default), the step guarded as train.on_nonfinite says; the LR
schedule is the loop's, stepped once per iteration.

Data parallelism: a minibatch's transitions are spread over the ranks (minibatches.py). Each rank
sums its terms and divides by the whole minibatch's size; DDP averages the ranks' gradients, so each
rank's loss is scaled by the world size and the average is the gradient of CleanRL's mean. The
minibatch statistics that must be global (the advantages' mean and std, the approximate KL for
target_kl) are summed over the ranks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from gputrain.config.schema import RLConfig
from gputrain.distributed.context import DistContext, all_reduce_sum
from gputrain.train.nonfinite import BadStep
from gputrain.train.step import StepParts, apply_update

LOSS_TERMS = ("policy_loss", "value_loss", "entropy", "old_approx_kl", "approx_kl")


@dataclass(slots=True)
class Batch:
    """This rank's rollout, flattened to (num_steps × num_envs, ...), with advantages and returns."""

    obs: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    values: torch.Tensor


@dataclass(slots=True)
class UpdateResult:
    """Device tensors, read on logging iterations."""

    last_sums: torch.Tensor
    """This rank's sums of LOSS_TERMS over the last minibatch (CleanRL logs the last minibatch's)."""
    clipped: torch.Tensor
    """This rank's transitions whose ratio left [1 - clip_coef, 1 + clip_coef], over all minibatches."""
    minibatches: int
    """Minibatches run (fewer than epochs × num_minibatches after a target_kl stop)."""
    grad_norm: torch.Tensor
    """The last minibatch's gradient norm before clipping."""
    bad: list[BadStep]
    """Updates the host-side guard did not apply, numbered 1, 2, ... within the iteration (in stop
    mode the update ends at the first); a device-side guard's are read by `guard.settle`."""


def _global_mean_std(x: torch.Tensor, count: int, job: DistContext) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased std (torch's .std()) of a minibatch spread over the ranks, `count` in all."""
    mean = all_reduce_sum(x.sum(), job) / count
    var = all_reduce_sum((x - mean).square().sum(), job) / (count - 1)
    return mean, var.sqrt()


def minibatch_loss(
    model: nn.Module, batch: Batch, rows: torch.Tensor, s: RLConfig, job: DistContext
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss to backpropagate, this rank's sums of LOSS_TERMS, transitions clipped) for one minibatch."""
    size = s.minibatch_size  # over all ranks
    newlogprob, entropy, newvalue = model(batch.obs[rows], batch.actions[rows])
    logratio = newlogprob - batch.logprobs[rows]
    ratio = logratio.exp()
    with torch.no_grad():
        # approximate KL(old || new) (http://joschu.net/blog/kl-approx.html): k1 and CleanRL's k3
        old_approx_kl = (-logratio).sum()
        approx_kl = ((ratio - 1) - logratio).sum()
        clipped = ((ratio - 1.0).abs() > s.clip_coef).sum()
    mb_advantages = batch.advantages[rows]
    if s.norm_adv:
        mean, std = _global_mean_std(mb_advantages, size, job)
        mb_advantages = (mb_advantages - mean) / (std + 1e-8)
    # clipped surrogate objective: L^CLIP = E[min(r A, clip(r, 1 - eps, 1 + eps) A)], as a loss
    pg_loss1 = -mb_advantages * ratio
    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - s.clip_coef, 1 + s.clip_coef)
    pg_sum = torch.max(pg_loss1, pg_loss2).sum()
    # value loss: 0.5 (V - R)², or its clipped form around the rollout's values
    returns, old_values = batch.returns[rows], batch.values[rows]
    if s.clip_vloss:
        v_loss_unclipped = (newvalue - returns) ** 2
        v_clipped = old_values + torch.clamp(newvalue - old_values, -s.clip_coef, s.clip_coef)
        v_loss_clipped = (v_clipped - returns) ** 2
        v_sum = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).sum()
    else:
        v_sum = 0.5 * ((newvalue - returns) ** 2).sum()
    entropy_sum = entropy.sum()
    # loss = pg_loss - ent_coef · entropy + vf_coef · v_loss, each a mean over the whole minibatch
    loss = (pg_sum - float(s.ent_coef) * entropy_sum + s.vf_coef * v_sum) / size
    sums = torch.stack((pg_sum, v_sum, entropy_sum, old_approx_kl, approx_kl)).detach()
    return loss * job.world_size, sums, clipped  # × world size: DDP averages the ranks' gradients


def ppo_update(
    parts: StepParts, batch: Batch, epochs: Iterator[list[torch.Tensor]], s: RLConfig, job: DistContext
) -> UpdateResult:
    """Optimise the policy and value function on one rollout.

    Args:
        parts: the update's parts; `parts.model` computes (new log-prob, entropy, value): the
            policy, compiled and/or in DDP.
        epochs: each epoch's minibatches, as this rank's rows (minibatches.py).
        s: the [rl] section, resolved.
    """
    device = batch.obs.device
    clipped = torch.zeros((), dtype=torch.int64, device=device)
    last_sums = torch.zeros(len(LOSS_TERMS), device=device)
    grad_norm = torch.zeros((), device=device)
    bad: list[BadStep] = []
    minibatches = 0
    for minibatch_rows in epochs:
        for rows in minibatch_rows:
            with parts.precision.autocast():
                loss, last_sums, mb_clipped = minibatch_loss(parts.model, batch, rows, s, job)
            parts.precision.backward(loss)
            result = apply_update(parts, loss.detach(), measure_grad_norm=True, schedule=False)
            clipped += mb_clipped
            minibatches += 1
            if result.grad_norm is not None:
                grad_norm = result.grad_norm
            if result.verdict.kind == "nonfinite":
                bad.append(BadStep(minibatches, result.verdict))
                if parts.guard.mode == "stop":  # no later update: the policy stays as it was before this one
                    return UpdateResult(last_sums, clipped, minibatches, grad_norm.detach(), bad)
        if s.target_kl is not None:  # one host sync per epoch, only when asked for
            approx_kl = all_reduce_sum(last_sums[LOSS_TERMS.index("approx_kl")], job) / s.minibatch_size
            if approx_kl.item() > s.target_kl:
                break
    return UpdateResult(last_sums, clipped, minibatches, grad_norm.detach(), bad)
