"""One training step's memory, measured: two steps (the second is steady state: optimizer state
exists, gradients were freed by zero_grad) under the live-bytes tracker, on fake tensors for the plan
(`measure_fake`). Each step runs the loop's micro-batches (train.grad_accum of them), so the
gradients already accumulated are there during the later ones' backward passes, with each new
gradient beside the sum it is added into.

The parts of the peak: weights, buffers, gradients and optimizer state are the tensors of those
kinds (the tracker files each by where it comes from); what else is live is the activations saved
for backward (live at the end of the forward pass) and temporary workspace. The forward/backward
phase and the optimizer phase are measured apart, so a layout that shards some parts and not others
can be composed from them (see `layouts.py`); over forward/backward the tracker also keeps every
(gradients, other) point where no other point has more of both, so a layout that scales the two
differently finds its own peak. The micro-batch itself, made before the step, is counted apart
(`inputs`).

What this cannot see, the check against the CPU allocator (allocator.py, benchmarks/plan_accuracy.py)
does: buffers a kernel allocates inside itself (on fake tensors no kernel runs).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_leaves

from gputrain.distributed.ac import ACMode, apply_ac
from gputrain.plan.tracker import LiveBytes

LossOf = Callable[[nn.Module, Any], torch.Tensor]
MEASURED_MICRO_BATCHES = 2
"""Micro-batches of a step run by the measurement, at most: from the second on each one repeats the
one before (its gradients added into the sums the first made), so the step's peak is reached by
then, and a train.grad_accum in the millions costs two (tests/unit/plan/test_pipeline_stages.py
checks 2 against 8). The step still counts as `accum` micro-batches (the inputs the loop holds)."""
MakeOptimizer = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


@dataclass(frozen=True, slots=True)
class Phase:
    """Live bytes at the peak of one phase of the step, by kind."""

    peak: int
    weights: int
    buffers: int
    gradients: int
    optimizer: int
    other: int
    """Activations and temporaries."""


@dataclass(frozen=True, slots=True)
class StepMemory:
    weights: int
    buffers: int
    gradients: int
    optimizer: int
    activations: int
    """Saved for backward: the bytes a micro-batch's forward pass leaves live (the loss and outputs
    included)."""
    forward_backward: Phase
    optimizer_step: Phase
    micro_batch: int
    frontier: tuple[tuple[int, int], ...] = ()
    """(gradients, other) over forward/backward: the points no other one exceeds in both."""
    inputs: int = 0
    """Bytes of one micro-batch as the step receives it (inputs and targets)."""
    accum: int = 1
    """Micro-batches per step, as measured."""

    @property
    def peak(self) -> int:
        return max(self.forward_backward.peak, self.optimizer_step.peak)


def _phase(tracker: LiveBytes) -> Phase:
    b = tracker.at_peak
    return Phase(tracker.peak, b["weights"], b["buffers"], b["gradients"], b["optimizer"], b["other"])


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)]


class StepHarness:
    """What every measured step shares: a tracker over the module's weights, buffers and gradients
    (filed as gradients from the moment autograd makes them), its optimizer, the optimizer's half of
    the step, and the StepMemory at the end. Used as a context manager: the hooks go on exit."""

    def __init__(self, holder: nn.Module, make_optimizer: MakeOptimizer) -> None:
        self.params = [p for p in holder.parameters() if p.requires_grad]
        self.tracker = tracker = LiveBytes()
        tracker.track(holder.parameters(), "weights")
        tracker.track(holder.buffers(), "buffers")
        self._hooks = [
            p.register_post_accumulate_grad_hook(lambda p: tracker.track([p.grad], "gradients")) for p in self.params
        ]
        self.optimizer = make_optimizer(self.params)

    def __enter__(self) -> StepHarness:
        return self

    def __exit__(self, *exc: object) -> None:
        for hook in self._hooks:
            hook.remove()

    def optimizer_half(self) -> tuple[Phase, Any, Phase]:
        """After the step's backward passes: (their phase, the tracker's frontier, the optimizer
        step's phase), with the optimizer's state tracked and the gradients set to None."""
        tracker = self.tracker
        forward_backward = _phase(tracker)
        frontier = tracker.frontier()
        tracker.reset_peak()
        self.optimizer.step()
        tracker.track(_optimizer_tensors(self.optimizer), "optimizer")
        optimizer_step = _phase(tracker)
        self.optimizer.zero_grad(set_to_none=True)
        return forward_backward, frontier, optimizer_step

    def result(
        self, halves: tuple[Phase, Any, Phase], *, activations: int, micro_batch: int, inputs: int, accum: int
    ) -> StepMemory:
        forward_backward, frontier, optimizer_step = halves
        return StepMemory(
            weights=self.tracker.bytes["weights"],
            buffers=self.tracker.bytes["buffers"],
            gradients=sum(p.numel() * p.element_size() for p in self.params),
            optimizer=self.tracker.bytes["optimizer"],
            activations=activations,
            forward_backward=forward_backward,
            optimizer_step=optimizer_step,
            micro_batch=micro_batch,
            frontier=frontier,
            inputs=inputs,
            accum=accum,
        )


def measure_steps(
    model: nn.Module,
    batch: Any,
    loss_of: LossOf,
    make_optimizer: MakeOptimizer,
    autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    micro_batch: int = 0,
    accum: int = 1,
) -> StepMemory:
    """Two training steps of `model`, each of `accum` micro-batches `batch` (the first
    MEASURED_MICRO_BATCHES of them run), the second measured (fake or real tensors alike)."""
    with StepHarness(model, make_optimizer) as harness:
        tracker = harness.tracker
        batch_tensors = [t for t in tree_leaves(batch) if isinstance(t, torch.Tensor)]
        tracker.track(batch_tensors, "inputs")
        inputs = sum(t.untyped_storage().nbytes() for t in batch_tensors)
        with tracker:
            for step in range(2):
                tracker.reset_peak()
                if step == 1:
                    tracker.start_recording()
                saved = 0
                for _ in range(min(max(1, accum), MEASURED_MICRO_BATCHES)):
                    before = tracker.bytes["other"]
                    with autocast():
                        loss = loss_of(model, batch)
                    saved = tracker.bytes["other"] - before
                    loss.backward()
                    del loss
                halves = harness.optimizer_half()
                if step == 1:
                    return harness.result(
                        halves, activations=saved, micro_batch=micro_batch, inputs=inputs, accum=max(1, accum)
                    )
    raise AssertionError("unreachable")


measure_real = measure_steps
"""The same two steps on real tensors (the same tracker: a check of the fake tensors, not of the
plan; the plan is checked against the allocator, allocator.py)."""


@contextlib.contextmanager
def fake_mode() -> Iterator[FakeTensorMode]:
    """Fake tensors: shapes, dtypes and devices, no memory and no compute; models that read tensor
    values on the host (data-dependent shapes) are allowed to fail, the caller says so. So is an op
    without a fake implementation: torch's fake mode would otherwise run its real kernel on zero-filled
    real copies of its inputs (`allow_fallback_kernels`), gigabytes for a large model's optimizer
    step, which the plan promises not to allocate (optim/optimizers.py steps such an optimizer
    without its fused kernel instead)."""
    mode = FakeTensorMode(allow_non_fake_inputs=True, allow_fallback_kernels=False)
    with mode:
        yield mode


def fake_copy(model: nn.Module, device: torch.device) -> nn.Module:
    """A copy of `model` whose parameters and buffers are new, uninitialised tensors on `device`:
    fake ones inside `fake_mode` (nothing of its size is allocated), real ones outside it (the
    trial steps of plan/batch.py). The model is not touched and none of its values is copied."""
    memo: dict[int, Any] = {}
    for t in [*model.parameters(), *model.buffers()]:
        meta = torch.empty(t.shape, dtype=t.dtype, device=device)
        memo[id(t)] = nn.Parameter(meta, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else meta
    return copy.deepcopy(model, memo)


def repeat_sample(sample: Any, micro_batch: int) -> Any:
    """A batch of `micro_batch` copies of one sample (inputs, targets): the shapes are what matter."""
    return torch.utils._pytree.tree_map_only(
        torch.Tensor, lambda t: t.unsqueeze(0).expand(micro_batch, *t.shape).contiguous(), sample
    )


def fake_batch(mode: FakeTensorMode, sample: Any, micro_batch: int, device: torch.device) -> Any:
    """`micro_batch` copies of one real sample, as fake tensors on `device` (made inside `fake_mode`)."""
    one = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: mode.from_tensor(t).to(device), sample)
    return repeat_sample(one, micro_batch)


def measure_fake(
    model: nn.Module,
    sample: Any,
    micro_batch: int,
    loss_of: LossOf,
    make_optimizer: MakeOptimizer,
    device: torch.device,
    ac: ACMode = "none",
    autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    accum: int = 1,
) -> StepMemory | None:
    """The step's memory at `micro_batch` on fake tensors; None where the model cannot run on them.

    `sample` is one real sample (a tensor or a tuple of them, no batch dimension); the batch is
    made of fake tensors on `device`, so a large micro-batch costs nothing either."""
    try:
        with fake_mode() as mode:
            fake = apply_ac(fake_copy(model, device), ac)
            batch = fake_batch(mode, sample, micro_batch, device)
            return measure_steps(fake, batch, loss_of, make_optimizer, autocast, micro_batch, accum)
    except Exception:  # noqa: BLE001 - the model's own code on fake tensors (values read on the host)
        return None
