"""The actor-critic networks of CleanRL's ppo.py (categorical) and ppo_continuous_action.py
(Gaussian): separate actor and critic MLPs with tanh, orthogonal initialisation (std sqrt(2) for
hidden layers, 0.01 for the actor's head, 1 for the critic's), zero biases.

Two ways in: `forward(obs, action)` gives the new log-probability, entropy and value of stored
actions (the PPO update; this is what compile and DDP wrap); `act(obs, uniform)` samples actions
in the rollout. Sampling turns uniform numbers keyed by (seed, step, environment) into actions
(inverse CDF for the categorical, Box-Muller for the Gaussian), so an environment's action does not
depend on how many environments share its process.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import torch
from torch import nn

from gputrain.rl.envs.base import ActionSpace, Box


def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    """CleanRL's `layer_init`: orthogonal weights of gain `std`, constant bias."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(in_size: int, hidden: tuple[int, ...], out_size: int, head_std: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [layer_init(nn.Linear(in_size, width)), nn.Tanh()]
        in_size = width
    layers.append(layer_init(nn.Linear(in_size, out_size), std=head_std))
    return nn.Sequential(*layers)


class ActorCritic(nn.Module, ABC):
    """The interface the rollout and the update use; `draws` uniform numbers make one action."""

    draws: int
    critic: nn.Sequential

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """V(obs), shape (B,)."""
        return self.critic(obs).squeeze(-1)

    @abstractmethod
    def act(self, obs: torch.Tensor, uniform: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(action, its log-probability, V(obs)) from uniform numbers (B, draws) in (0, 1)."""

    @abstractmethod
    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log-probability of `action`, entropy, V(obs)) for the update."""


class CategoricalActorCritic(ActorCritic):
    draws = 1

    def __init__(self, obs_size: int, num_actions: int, hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.critic = mlp(obs_size, hidden, 1, head_std=1.0)
        self.actor = mlp(obs_size, hidden, num_actions, head_std=0.01)

    def act(self, obs: torch.Tensor, uniform: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        log_probs = torch.log_softmax(self.actor(obs), dim=-1)
        # inverse CDF: the first action whose cumulative probability exceeds u
        cdf = torch.cumsum(log_probs.exp(), dim=-1)
        action = (cdf < uniform.to(cdf.dtype)).sum(-1).clamp(max=log_probs.shape[-1] - 1)
        logprob = log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        return action, logprob, self.value(obs)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        log_probs = torch.log_softmax(self.actor(obs), dim=-1)
        logprob = log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        return logprob, entropy, self.value(obs)


class GaussianActorCritic(ActorCritic):
    def __init__(self, obs_size: int, action_size: int, hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.draws = 2 * action_size
        self.critic = mlp(obs_size, hidden, 1, head_std=1.0)
        self.actor_mean = mlp(obs_size, hidden, action_size, head_std=0.01)
        self.actor_logstd = nn.Parameter(torch.zeros(1, action_size))

    def _log_prob(self, mean: torch.Tensor, logstd: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """log N(action; mean, exp(logstd)²), summed over the action's components."""
        std = logstd.exp()
        return (-((action - mean) ** 2) / (2 * std**2) - logstd - math.log(math.sqrt(2 * math.pi))).sum(-1)

    def act(self, obs: torch.Tensor, uniform: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mean = self.actor_mean(obs)
        logstd = self.actor_logstd.expand_as(mean)
        u1, u2 = uniform.to(mean.dtype).chunk(2, dim=-1)
        normal = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2 * math.pi * u2)  # Box-Muller
        action = mean + logstd.exp() * normal
        return action, self._log_prob(mean, logstd, action), self.value(obs)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mean = self.actor_mean(obs)
        logstd = self.actor_logstd.expand_as(mean)
        entropy = (0.5 + 0.5 * math.log(2 * math.pi) + logstd).sum(-1)
        return self._log_prob(mean, logstd, action), entropy, self.value(obs)


def build_policy(action_space: ActionSpace, obs_size: int, hidden: tuple[int, ...]) -> ActorCritic:
    """The categorical policy for discrete actions, the Gaussian one for a Box."""
    if isinstance(action_space, Box):
        return GaussianActorCritic(obs_size, action_space.size, hidden)
    return CategoricalActorCritic(obs_size, action_space.n, hidden)
