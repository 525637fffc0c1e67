"""Seeded synthetic data of any shape, for benchmarks and tests.

The targets are a fixed function of the inputs (a random linear teacher), so the loss can fall;
token streams follow a simple recurrence with random restarts so a language model can learn them.
"""

from __future__ import annotations

import math

import torch

from gputrain.config.schema import DataConfig
from gputrain.data.registry import DataBundle, register_data
from gputrain.data.spec import DataSpec
from gputrain.data.tensors import split_tensors


def synthetic_tokens(num_samples: int, seq_len: int, vocab_size: int, generator: torch.Generator) -> torch.Tensor:
    """[num_samples, seq_len + 1] token windows: next = (7·prev + 3) mod V, restarting at random."""
    tokens = torch.empty(num_samples, seq_len + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(vocab_size, (num_samples,), generator=generator)
    restarts = torch.rand(num_samples, seq_len + 1, generator=generator) < 1 / 32
    fresh = torch.randint(vocab_size, (num_samples, seq_len + 1), generator=generator)
    for t in range(1, seq_len + 1):
        tokens[:, t] = torch.where(restarts[:, t], fresh[:, t], (7 * tokens[:, t - 1] + 3) % vocab_size)
    return tokens


@register_data("synthetic")
def build_synthetic(config: DataConfig, seed: int) -> DataBundle:
    generator = torch.Generator().manual_seed(seed + 1)
    if config.task == "lm":
        vocab_size = config.vocab_size or 256
        tokens = synthetic_tokens(config.num_samples, config.seq_len, vocab_size, generator)
        spec = DataSpec(task="lm", input_shape=(config.seq_len,), vocab_size=vocab_size)
        return split_tensors(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous(), spec, config, seed)
    shape = tuple(config.shape)
    inputs = torch.randn(config.num_samples, *shape, generator=generator)
    flat = inputs.flatten(1)
    if config.task == "regression":
        teacher = torch.randn(flat.shape[1], 1, generator=generator) / math.sqrt(flat.shape[1])
        targets = flat @ teacher + 0.01 * torch.randn(config.num_samples, 1, generator=generator)
        spec = DataSpec(task="regression", input_shape=shape, num_outputs=1, size_field="data.shape")
    else:
        teacher = torch.randn(flat.shape[1], config.num_classes, generator=generator)
        targets = (flat @ teacher).argmax(dim=1)
        spec = DataSpec(
            task="classification", input_shape=shape, num_classes=config.num_classes, size_field="data.shape"
        )
    return split_tensors(inputs, targets, spec, config, seed)
