"""The actor-critic networks: CleanRL's layout and initialisation, log-probabilities and entropies
equal to torch.distributions', and sampling from keyed uniforms with the right distribution."""

from __future__ import annotations

import math

import torch
from torch.distributions import Categorical, Normal

from gputrain.rl.envs import Box, Discrete
from gputrain.rl.policy import CategoricalActorCritic, GaussianActorCritic, build_policy


def test_cleanrl_layout_and_initialisation():
    torch.manual_seed(0)
    policy = build_policy(Discrete(3), 6, (64, 64))
    assert isinstance(policy, CategoricalActorCritic)
    shapes = {name: tuple(p.shape) for name, p in policy.named_parameters()}
    assert shapes["critic.0.weight"] == (64, 6) and shapes["critic.4.weight"] == (1, 64)
    assert shapes["actor.4.weight"] == (3, 64)
    for name, param in policy.named_parameters():
        if name.endswith("bias"):
            assert not param.any(), name
    # orthogonal with gain std: W W^T = std² I (rows are fewer than columns in the heads)
    head = policy.actor[4].weight
    assert torch.allclose(head @ head.T, 0.01**2 * torch.eye(3), atol=1e-7)
    critic_head = policy.critic[4].weight
    assert torch.allclose(critic_head @ critic_head.T, torch.eye(1), atol=1e-5)
    hidden = policy.critic[2].weight
    assert torch.allclose(hidden @ hidden.T, 2 * torch.eye(64), atol=1e-4)
    gaussian = build_policy(Box(2, -1, 1), 3, (64, 64))
    assert isinstance(gaussian, GaussianActorCritic) and not gaussian.actor_logstd.any()


def test_categorical_matches_torch_distributions_and_samples_by_its_probabilities():
    torch.manual_seed(1)
    policy = build_policy(Discrete(3), 4, (8,))
    with torch.no_grad():
        policy.actor[2].weight.mul_(300)  # far from uniform
        obs = torch.randn(1, 4).expand(200_000, 4)
        uniform = torch.rand(200_000, 1)
        action, logprob, value = policy.act(obs, uniform)
        reference = Categorical(logits=policy.actor(obs[:1]))
        frequencies = torch.bincount(action, minlength=3).float() / 200_000
        assert torch.allclose(frequencies, reference.probs[0], atol=0.005)
        assert torch.allclose(logprob, reference.log_prob(action), atol=1e-6)
        new_logprob, entropy, new_value = policy(obs[:50], action[:50])
        assert torch.allclose(new_logprob, logprob[:50]) and torch.allclose(new_value, value[:50])
        assert torch.allclose(entropy, reference.entropy().expand(50), atol=1e-6)


def test_gaussian_matches_torch_distributions_and_samples_by_its_mean_and_std():
    torch.manual_seed(2)
    policy = build_policy(Box(2, -1, 1), 3, (8,))
    with torch.no_grad():
        policy.actor_logstd.copy_(torch.tensor([[-1.0, 0.5]]))
        obs = torch.randn(1, 3).expand(200_000, 3)
        action, logprob, _ = policy.act(obs, torch.rand(200_000, 4))
        mean = policy.actor_mean(obs[:1])[0]
        std = torch.tensor([math.exp(-1.0), math.exp(0.5)])
        assert torch.allclose(action.mean(0), mean, atol=0.01) and torch.allclose(action.std(0), std, rtol=0.01)
        reference = Normal(mean, std)
        assert torch.allclose(logprob, reference.log_prob(action).sum(-1), atol=1e-5)
        new_logprob, entropy, _ = policy(obs[:10], action[:10])
        assert torch.allclose(new_logprob, logprob[:10])
        assert torch.allclose(entropy, reference.entropy().sum().expand(10))
