"""parallel.strategy=auto on meta-device models (no memory used) against several device sizes."""

from __future__ import annotations

import pytest
import torch

from gputrain.distributed.auto import GIB, activation_bytes, decide, estimate_memory, explain
from gputrain.models.mlp import MLP


def meta_mlp(width: int, depth: int, inputs: int = 1024) -> MLP:
    with torch.device("meta"):
        return MLP(inputs, [width] * depth, 10, "relu", 0.0)


def test_activations_are_what_backward_saves() -> None:
    # Linear saves its input [8,16]; ReLU saves its output [8,32], which the next Linear saves too (once)
    assert activation_bytes(meta_mlp(32, 1, inputs=16), torch.empty(16), micro_batch=8) == 8 * 16 * 4 + 8 * 32 * 4


def test_state_bytes_follow_the_optimizer() -> None:
    model = meta_mlp(256, 2)
    n = sum(p.numel() for p in model.parameters())
    adam = estimate_memory(model, None, 8, "adamw")
    assert (adam.num_params, adam.weights_bytes, adam.grads_bytes, adam.optimizer_bytes) == (n, 4 * n, 4 * n, 8 * n)
    assert estimate_memory(model, None, 8, "sgd", momentum=0.9).optimizer_bytes == 4 * n
    assert estimate_memory(model, None, 8, "sgd", momentum=0.0).optimizer_bytes == 0


# (width, depth, micro-batch, world, device GiB) -> (strategy, checkpointing)
CASES = [
    ((256, 2, 64, 1, 16), ("none", "none")),          # 0.3M params: one device
    ((256, 2, 64, 8, 16), ("ddp", "none")),           # ... and a replica per rank when launched on 8
    ((8192, 16, 8, 8, 80), ("ddp", "none")),          # 1.0B params, 15 GiB of state: fits an 80 GiB GPU
    ((8192, 16, 8, 8, 16), ("fsdp", "none")),         # ... not a 16 GiB one: shard it (1.9 GiB per rank)
    # 55M params (0.8 GiB of state) but 4.25 GiB of activations at micro-batch 65536
    ((4096, 4, 65536, 2, 8), ("ddp", "none")),        # 5.1 GiB replica fits 8 GiB
    ((4096, 4, 65536, 2, 4), ("fsdp", "selective")),  # 4.7 GiB sharded does not fit 3.4 usable; 2.5 does
    ((4096, 4, 65536, 2, 2), ("fsdp", "full")),       # only full checkpointing fits 1.7 GiB usable
    ((4096, 4, 16384, 1, 2), ("none", "selective")),  # one device: 1.9 GiB → 1.3 GiB with selective
]


@pytest.mark.parametrize(("shape", "expected"), CASES)
def test_auto_choice(shape: tuple[int, int, int, int, int], expected: tuple[str, str]) -> None:
    width, depth, micro, world, gib = shape
    model = meta_mlp(width, depth)
    est = estimate_memory(model, torch.empty(1024), micro, "adamw")
    strategy, ac, fits = decide(est, world, gib * GIB)
    assert (strategy, ac) == expected
    assert fits and est.per_rank(strategy, world, ac) <= 0.85 * gib * GIB


def test_too_big_says_so_with_the_numbers() -> None:
    est = estimate_memory(meta_mlp(8192, 16, inputs=8192), torch.empty(8192), 8, "adamw")
    strategy, ac, fits = decide(est, 2, 1 * GIB)
    assert (strategy, ac, fits) == ("fsdp", "full", False)
    line = explain(est, 2, 1 * GIB, strategy, ac, fits, "adamw")
    assert line.startswith("auto: 1.1B parameters; per rank: weights 4.00 GiB, gradients 4.00 GiB, adamw state "
                           "8.00 GiB (÷2 sharded)")
    assert "DOES NOT FIT" in line and "parallel.cpu_offload=true" in line


def test_a_model_that_cannot_run_on_meta_gets_an_estimate_without_activations():
    import torch
    from torch import nn

    from gputrain.distributed.auto import estimate_memory, explain

    class ReadsValues(nn.Linear):  # what some Hugging Face input checks do
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if bool((x > 0).any()):  # a tensor value read on the host: impossible on meta tensors
                x = x + 1
            return super().forward(x)

    est = estimate_memory(ReadsValues(8, 4), torch.zeros(8), micro_batch=16, optimizer="adamw")
    assert not est.activations_measured and est.activation_bytes == 0 and est.weights_bytes == 4 * 36
    assert "activations not measured (the model does not run on the meta device)" in explain(
        est, 1, 2**30, "none", "none", True, "adamw")
