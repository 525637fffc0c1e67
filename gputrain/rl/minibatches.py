"""Which transitions each minibatch takes: CleanRL's `np.random.shuffle(b_inds)` over the whole
rollout, cut into num_minibatches slices, with every rank keeping the transitions of its own
environments.

The permutation is drawn on the host from a generator seeded by (seed, iteration, epoch): the same
on every rank and after a resume, with no generator state to save. A transition's global index is
step × num_envs + environment (CleanRL's flattening of its (num_steps, num_envs) storage), so one
process with all the environments and N ranks with a share each cut the same minibatches.
"""

from __future__ import annotations

import hashlib

import torch

from gputrain.env.device import queued_copy


def shuffle_key(seed: int, iteration: int, epoch: int) -> int:
    """A 64-bit seed for one epoch's permutation (stable across processes, unlike hash())."""
    digest = hashlib.blake2b(f"gputrain-ppo:{seed}:{iteration}:{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # manual_seed takes up to 2**63 - 1 without wrapping


def epoch_minibatches(
    seed: int,
    iteration: int,
    epoch: int,
    num_steps: int,
    total_envs: int,
    num_minibatches: int,
    first_env: int,
    local_envs: int,
    device: torch.device,
) -> list[torch.Tensor]:
    """This rank's rows (indices into its flattened rollout, step × local_envs + local environment)
    of each minibatch of one epoch. Under data parallelism a rank's share of a minibatch varies in
    size; the loss divides by the whole minibatch's size, so the shares add up to CleanRL's mean."""
    batch = num_steps * total_envs
    generator = torch.Generator().manual_seed(shuffle_key(seed, iteration, epoch))
    chosen = torch.randperm(batch, generator=generator).view(num_minibatches, batch // num_minibatches)
    step, env = chosen // total_envs, chosen % total_envs
    rows = step * local_envs + (env - first_env)
    if local_envs == total_envs:  # one process: every row is this rank's
        return list(queued_copy(rows, device).unbind(0))
    mine = (env >= first_env) & (env < first_env + local_envs)
    counts = mine.sum(1).tolist()
    return list(queued_copy(rows[mine], device).split(counts))
