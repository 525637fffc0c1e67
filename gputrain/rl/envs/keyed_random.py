"""Random numbers keyed by what they are for, not drawn from a generator's stream.

Each number is a hash of (seed, stream, step, environment index, draw): environment 37's reset at
step 1000 gets the same numbers whether it runs on one process among 64 environments or on rank 1
of 2 among 32, and after a resume, because nothing but the step counter carries over. That is what
makes N ranks equal to one process with all the environments, and resume bit-exact, without
saving or splitting any generator state. (JAX's PRNG keys serve the same purpose.)

The hash is PCG's output permutation on 32-bit words ("pcg" in Jarzynski & Olano, "Hash Functions
for GPU Rendering", JCGT 2020), the best quality-per-operation 1-D hash they measured. The key's
parts are combined by hashing each and xor-ing into the next hash's input: the environment's part
is computed once, the (seed, stream, step) part on the host, so a draw costs the device one round.
For a fixed step the map from environment to number is a bijection of 32-bit words: no two
environments of a step ever get the same number.
"""

from __future__ import annotations

from typing import TypeVar

import torch

from gputrain.env.device import queued_copy

_MASK = 0xFFFFFFFF
_TWO_32 = float(2**32)

RESET = 1
"""Stream of the start states drawn at resets."""
ACTION = 2
"""Stream of the noise the policy turns into actions."""


_Word = TypeVar("_Word", int, torch.Tensor)


def _pcg(x: _Word) -> _Word:
    """PCG's output permutation of 32-bit words, on a Python int (the host's part of a key) or
    elementwise on int64 tensors (every product stays below 2**62)."""
    state = (x * 747796405 + 2891336453) & _MASK
    word = (((state >> ((state >> 28) + 4)) ^ state) * 277803737) & _MASK
    return (word >> 22) ^ word


def step_key(seed: int, stream: int, step: int) -> int:
    """The host's part of a key: (seed, stream, step < 2**64) as one 32-bit word."""
    h = _pcg(step & _MASK)
    h = _pcg(h ^ ((step >> 32) & _MASK))
    h = _pcg(h ^ stream)
    return _pcg(h ^ (seed & _MASK))


class KeyedUniform:
    """Uniform numbers in (0, 1) for environments `env_ids` (global indices, int64 on the target
    device), `draws` per environment, as a pure function of (seed, stream, step, environment, draw)."""

    def __init__(self, seed: int, stream: int, env_ids: torch.Tensor, draws: int) -> None:
        self.seed = seed
        self.stream = stream
        draw = torch.arange(draws, device=env_ids.device, dtype=torch.int64)
        self._env_part = _pcg(draw.unsqueeze(0) ^ _pcg(env_ids.unsqueeze(1)))  # (N, draws)

    def at(self, step: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """The numbers of one step, shape (N, draws)."""
        return self._to_unit(_pcg(self._env_part ^ step_key(self.seed, self.stream, step)), dtype)

    def steps(self, first: int, count: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """The numbers of `count` consecutive steps from `first`, shape (count, N, draws): a rollout's
        worth in one go, equal to `at` step by step."""
        keys = [step_key(self.seed, self.stream, first + i) for i in range(count)]
        key = queued_copy(torch.tensor(keys, dtype=torch.int64), self._env_part.device)
        return self._to_unit(_pcg(self._env_part.unsqueeze(0) ^ key.view(count, 1, 1)), dtype)

    @staticmethod
    def _to_unit(h: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        # the centre of each of the 2**32 cells: never exactly 0 or 1 (log(u) and Box-Muller stay finite)
        return (h.to(dtype) + 0.5) / _TWO_32


def keyed_uniform(
    seed: int, stream: int, step: int, env_ids: torch.Tensor, draws: int, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """`KeyedUniform(seed, stream, env_ids, draws).at(step)`: shape (len(env_ids), draws)."""
    return KeyedUniform(seed, stream, env_ids, draws).at(step, dtype)
