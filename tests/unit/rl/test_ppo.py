"""PPO against CleanRL's own code: the update loop of ppo.py (clipped surrogate, clipped value loss,
entropy bonus, advantage normalisation, minibatch epochs, gradient clipping, target_kl) and its GAE
loop, written out here as CleanRL writes them, on the same data and the same minibatch order."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from gputrain.config.schema import RLConfig
from gputrain.distributed.context import DistContext
from gputrain.precision import Precision
from gputrain.rl.envs import Box, Discrete
from gputrain.rl.gae import bootstrap_truncations, compute_gae
from gputrain.rl.minibatches import epoch_minibatches
from gputrain.rl.policy import build_policy
from gputrain.rl.ppo import LOSS_TERMS, Batch, ppo_update
from gputrain.train.guard import build_guard
from gputrain.train.step import StepParts

NUM_STEPS, NUM_ENVS = 16, 8


def cleanrl_gae(rewards, values, cleanrl_dones, next_value, next_done, gamma, gae_lambda):
    """ppo.py's GAE loop. `cleanrl_dones[t]` says obs[t] began an episode (the done of step t-1)."""
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    num_steps = rewards.shape[0]
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - cleanrl_dones[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    return advantages, advantages + values


def test_gae_equals_cleanrls_loop():
    g = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(NUM_STEPS, NUM_ENVS, generator=g), torch.randn(NUM_STEPS, NUM_ENVS, generator=g)
    dones = torch.rand(NUM_STEPS, NUM_ENVS, generator=g) < 0.2  # ours: the episode ended at step t
    next_value = torch.randn(NUM_ENVS, generator=g)
    cleanrl_dones = torch.cat((torch.rand(1, NUM_ENVS, generator=g) < 0.5, dones[:-1])).float()
    ours = compute_gae(rewards, values, dones, next_value, 0.99, 0.95)
    theirs = cleanrl_gae(rewards, values, cleanrl_dones, next_value, dones[-1].float(), 0.99, 0.95)
    assert torch.allclose(ours[0], theirs[0], atol=1e-6) and torch.allclose(ours[1], theirs[1], atol=1e-6)


def test_a_truncated_episode_is_bootstrapped_from_its_last_state():
    rewards = torch.tensor([[1.0, 1.0]])
    out = bootstrap_truncations(rewards, torch.tensor([[10.0, 10.0]]), torch.tensor([[True, False]]), 0.9)
    assert out.tolist() == [[10.0, 1.0]]


LR, EPS, MAX_GRAD_NORM = 2.5e-4, 1e-5, 0.5  # CleanRL's, what `gputrain rl` defaults optim.lr, optim.eps, train.clip_grad_norm to


def _settings(**changes) -> RLConfig:
    rl = RLConfig(num_envs=NUM_ENVS, num_steps=NUM_STEPS, num_minibatches=4, update_epochs=3)
    return dataclasses.replace(rl.resolved(), **changes)


def _parts(policy: nn.Module, optimizer: torch.optim.Optimizer, mode: str = "stop", clip: float | None = MAX_GRAD_NORM,
           clip_value: float | None = None) -> StepParts:
    precision = Precision("fp32", torch.device("cpu"))
    return StepParts(model=policy, optimizer=optimizer, precision=precision,
                     scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0),
                     clip_grad_norm=clip, clip_grad_value=clip_value, params=list(policy.parameters()),
                     guard=build_guard(mode, optimizer, precision, device=torch.device("cpu"), distributed=False))


def _batch(policy, continuous: bool) -> Batch:
    g = torch.Generator().manual_seed(1)
    n = NUM_STEPS * NUM_ENVS
    obs = torch.randn(n, 3 if continuous else 4, generator=g)
    with torch.no_grad():
        noise = torch.rand(n, policy.draws, generator=g)
        actions, logprobs, values = policy.act(obs, noise)
    return Batch(obs=obs, actions=actions, logprobs=logprobs + 0.05 * torch.randn(n, generator=g),
                 advantages=torch.randn(n, generator=g) * 3 + 1, returns=torch.randn(n, generator=g) * 5,
                 values=values + 0.3 * torch.randn(n, generator=g))


def cleanrl_update(agent, optimizer, b, epochs_inds, args) -> tuple[list[float], dict[str, float]]:
    """ppo.py's update loop, with `b_inds` of each epoch given (np.random.shuffle in ppo.py)."""
    clipfracs = []
    for b_inds in epochs_inds:
        for start in range(0, args.batch_size, args.minibatch_size):
            mb_inds = b_inds[start:start + args.minibatch_size]
            newlogprob, entropy, newvalue = agent(b.obs[mb_inds], b.actions[mb_inds])
            logratio = newlogprob - b.logprobs[mb_inds]
            ratio = logratio.exp()
            with torch.no_grad():
                old_approx_kl = (-logratio).mean()
                approx_kl = ((ratio - 1) - logratio).mean()
                clipfracs += [((ratio - 1.0).abs() > args.clip_coef).float().mean().item()]
            mb_advantages = b.advantages[mb_inds]
            if args.norm_adv:
                mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
            pg_loss1 = -mb_advantages * ratio
            pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
            pg_loss = torch.max(pg_loss1, pg_loss2).mean()
            newvalue = newvalue.view(-1)
            if args.clip_vloss:
                v_loss_unclipped = (newvalue - b.returns[mb_inds]) ** 2
                v_clipped = b.values[mb_inds] + torch.clamp(
                    newvalue - b.values[mb_inds], -args.clip_coef, args.clip_coef)
                v_loss_clipped = (v_clipped - b.returns[mb_inds]) ** 2
                v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
            else:
                v_loss = 0.5 * ((newvalue - b.returns[mb_inds]) ** 2).mean()
            entropy_loss = entropy.mean()
            loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), MAX_GRAD_NORM)
            optimizer.step()
        if args.target_kl is not None and approx_kl > args.target_kl:
            break
    last = {"policy_loss": pg_loss.item(), "value_loss": v_loss.item(), "entropy": entropy_loss.item(),
            "old_approx_kl": old_approx_kl.item(), "approx_kl": approx_kl.item()}
    return clipfracs, last


CASES = {
    "categorical": ("discrete", {}),
    "gaussian": ("continuous", {}),
    "no_value_clip_no_adv_norm": ("discrete", {"clip_vloss": False, "norm_adv": False}),
    "target_kl": ("discrete", {"target_kl": 1e-4}),
    "entropy_bonus": ("continuous", {"ent_coef": 0.1, "clip_coef": 0.05}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_update_equals_cleanrls_loop(case):
    kind, changes = CASES[case]
    continuous = kind == "continuous"
    torch.manual_seed(0)
    policy = build_policy(Box(1, -2, 2) if continuous else Discrete(2), 3 if continuous else 4, (16, 16))
    reference = copy.deepcopy(policy)
    s = _settings(**changes)
    batch = _batch(policy, continuous)
    epochs = [epoch_minibatches(0, 1, e, NUM_STEPS, NUM_ENVS, s.num_minibatches, 0, NUM_ENVS, torch.device("cpu"))
              for e in range(s.update_epochs)]
    lr = 3e-3 if case == "target_kl" else LR
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr, eps=EPS)
    result = ppo_update(_parts(policy, optimizer), batch, iter(epochs), s, DistContext())

    ref_optimizer = torch.optim.Adam(reference.parameters(), lr=lr, eps=EPS)
    epochs_inds = [torch.cat(minibatches).numpy() for minibatches in epochs]
    clipfracs, last = cleanrl_update(reference, ref_optimizer, batch, epochs_inds, s)

    assert result.minibatches == len(clipfracs)
    if case == "target_kl":
        assert result.minibatches < s.update_epochs * s.num_minibatches  # it did stop early
    for (name, ours), theirs in zip(policy.named_parameters(), reference.parameters()):
        assert torch.allclose(ours, theirs, atol=1e-6), name
    sums = result.last_sums / s.minibatch_size
    for i, term in enumerate(LOSS_TERMS):
        assert sums[i].item() == pytest.approx(last[term], rel=1e-5, abs=1e-7), term
    assert result.clipped.item() / (result.minibatches * s.minibatch_size) == pytest.approx(np.mean(clipfracs))


def test_minibatches_cover_the_rollout_once_per_epoch_in_a_fresh_order():
    device = torch.device("cpu")
    first = epoch_minibatches(0, 1, 0, NUM_STEPS, NUM_ENVS, 4, 0, NUM_ENVS, device)
    assert [len(rows) for rows in first] == [NUM_STEPS * NUM_ENVS // 4] * 4
    assert sorted(torch.cat(first).tolist()) == list(range(NUM_STEPS * NUM_ENVS))
    again = epoch_minibatches(0, 1, 0, NUM_STEPS, NUM_ENVS, 4, 0, NUM_ENVS, device)
    assert all(torch.equal(a, b) for a, b in zip(first, again))  # a pure function of the key
    other = torch.cat(epoch_minibatches(0, 1, 1, NUM_STEPS, NUM_ENVS, 4, 0, NUM_ENVS, device))
    assert not torch.equal(torch.cat(first), other)


def test_ranks_take_their_own_share_of_each_minibatch():
    """Rank r of 2 holds environments 4r..4r+3; each minibatch's global transitions split between the
    ranks, mapped to their local rows (step × 4 + local environment)."""
    device = torch.device("cpu")
    whole = epoch_minibatches(5, 2, 1, NUM_STEPS, NUM_ENVS, 4, 0, NUM_ENVS, device)
    halves = [epoch_minibatches(5, 2, 1, NUM_STEPS, NUM_ENVS, 4, 4 * r, 4, device) for r in range(2)]
    for k, rows in enumerate(whole):
        step, env = rows // NUM_ENVS, rows % NUM_ENVS
        for r in range(2):
            mine = (env // 4) == r
            assert torch.equal(halves[r][k], step[mine] * 4 + env[mine] - 4 * r)
