"""A training step that does more than a hand loop's (issue 28 §1): each way gputrain's step, or a model
trained through it, could dispatch more, read the device on a quiet step, fall back to eager, break a
graph or recompile, put in on purpose; the step's anatomy (benchmarks/step_anatomy.py) must name it.
Issue 28's own bug (a dispatch mode made dynamo run the compiled forwards eagerly for good) heads the
table. Each case trains the MLP 6 steps both ways; a compiled case costs a few seconds of compiling."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from tests.unit.train.test_step_anatomy import LOG_EVERY, STEPS, anatomy


class _Mlp(nn.Module):
    """The anatomy's MLP with one thing done in its forward."""

    def __init__(self, extra: Callable[[nn.Module, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
        self.extra = extra
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.extra(self, self.net(x))


def _item(module: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return h * 0 if h.sum().item() > 1e30 else h


def _print(module: nn.Module, h: torch.Tensor) -> torch.Tensor:
    print("forward")
    return h


def _graph_break(module: nn.Module, h: torch.Tensor) -> torch.Tensor:
    torch._dynamo.graph_break()
    return h


def _changing_constant(module: nn.Module, h: torch.Tensor) -> torch.Tensor:
    module.calls += 1  # a Python number that changes every call: dynamo guards on it
    return h * (1.0 + 1e-9 * module.calls)


class _Silent(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def _flop_counter_as_before(mp: pytest.MonkeyPatch) -> None:
    from gputrain.observe.flops import StepFlopCounter

    @contextlib.contextmanager
    def counting(self: StepFlopCounter) -> Iterator[None]:
        with self._counting():  # no force_eager: issue 28's bug
            yield

    mp.setattr(StepFlopCounter, "counting", counting)


def _around_train_step(mp: pytest.MonkeyPatch, before: Callable[[Any], None]) -> None:
    from gputrain.train import trainer

    original = trainer.train_step

    def wrapped(parts: Any, micro_batches: Any, measure_grad_norm: bool) -> Any:
        before(parts)
        return original(parts, micro_batches, measure_grad_norm)

    mp.setattr(trainer, "train_step", wrapped)


def _dispatch_mode_every_step(mp: pytest.MonkeyPatch) -> None:
    from gputrain.train import trainer

    original = trainer.train_step

    def wrapped(parts: Any, micro_batches: Any, measure_grad_norm: bool) -> Any:
        with _Silent():
            return original(parts, micro_batches, measure_grad_norm)

    mp.setattr(trainer, "train_step", wrapped)


def _compile_dropped(mp: pytest.MonkeyPatch) -> None:
    from gputrain.distributed.compiling import remove_compile

    _around_train_step(mp, lambda parts: remove_compile(parts.model))


def _compiled_per_child(mp: pytest.MonkeyPatch) -> None:
    from gputrain.distributed import parallelize

    mp.setattr(parallelize, "compile_scope", lambda dims, choice: "children")  # FSDP's scope, with no FSDP


def _around_update(mp: pytest.MonkeyPatch, before: Callable[[torch.Tensor], torch.Tensor]) -> None:
    from gputrain.train import step

    original = step.apply_update

    def wrapped(parts: Any, loss: torch.Tensor, measure: bool, schedule: bool = True) -> Any:
        return original(parts, before(loss), measure, schedule)

    mp.setattr(step, "apply_update", wrapped)


def _read(read: Callable[[torch.Tensor], object]) -> Callable[[pytest.MonkeyPatch], None]:
    def patch(mp: pytest.MonkeyPatch) -> None:
        def before(loss: torch.Tensor) -> torch.Tensor:
            read(loss)
            return loss

        _around_update(mp, before)

    return patch


def _extra_op_in_guard(mp: pytest.MonkeyPatch) -> None:
    from gputrain.train.device_guard import DeviceGuard

    original = DeviceGuard.step

    def step(self: DeviceGuard, optimizer: Any, loss: torch.Tensor, grad_norm: Any, params: list) -> Any:
        self._flag.clamp_(0, 1)
        return original(self, optimizer, loss, grad_norm, params)

    mp.setattr(DeviceGuard, "step", step)


def _host_guard(mp: pytest.MonkeyPatch) -> None:
    from gputrain.train import device_guard

    mp.setattr(device_guard, "fits", lambda *args, **kwargs: False)  # the host guard: one read a step


@dataclasses.dataclass(frozen=True)
class Mutation:
    id: str
    compiled: bool
    expect: tuple[str, ...]
    """Each must start one of the violations found (step_anatomy.violations)."""
    patch: Callable[[pytest.MonkeyPatch], None] | None = None
    extra: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None
    """Done in the forward of gputrain's model (the hand loop trains the plain MLP)."""


MUTATIONS = [
    Mutation("issue-28: FLOP counter without force_eager", True, ("compiled regions",), patch=_flop_counter_as_before),
    Mutation("a dispatch mode around every step", True, ("compiled regions",), patch=_dispatch_mode_every_step),
    Mutation("compile taken off after step 1", True, ("compiled regions",), patch=_compile_dropped),
    Mutation("each layer compiled alone (a narrower scope)", True, ("compiled regions",), patch=_compiled_per_child),
    Mutation(".item() in forward, eager", False, ("syncs on non-logging",), extra=_item),
    Mutation(".item() in forward, compiled", True, ("breaks", "syncs on non-logging"), extra=_item),
    Mutation("print in forward", True, ("breaks",), extra=_print),
    Mutation("graph_break() in forward", True, ("breaks",), extra=_graph_break),
    Mutation("a constant that changes every step", True, ("frames compiled after step 2",), extra=_changing_constant),
    Mutation("float(loss) in the step", False, ("syncs on non-logging",), patch=_read(float)),
    Mutation(
        "bool(loss.isfinite()) in the step", False, ("syncs on non-logging",), patch=_read(lambda t: bool(t.isfinite()))
    ),
    Mutation("nonzero in the step", False, ("syncs on non-logging",), patch=_read(torch.nonzero)),
    Mutation(
        "one multiply more in the step", False, ("ops beyond",), patch=lambda mp: _around_update(mp, lambda t: t * 1.0)
    ),
    Mutation("one op more in the guard", False, ("ops beyond",), patch=_extra_op_in_guard),
    Mutation("the host guard where the device's fits", False, ("syncs on non-logging",), patch=_host_guard),
]


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.id for m in MUTATIONS])
def test_a_step_doing_more_than_the_hand_loop_is_named(mutation: Mutation, monkeypatch: pytest.MonkeyPatch) -> None:
    case = anatomy.mlp_case()
    hand = anatomy.measure(case, "hand", mutation.compiled, STEPS, LOG_EVERY)
    if mutation.patch is not None:
        mutation.patch(monkeypatch)
    ours_case = case
    if mutation.extra is not None:
        extra = mutation.extra
        ours_case = dataclasses.replace(case, make_model=anatomy._seeded(lambda: _Mlp(extra)))
    ours = anatomy.measure(ours_case, "gputrain", mutation.compiled, STEPS, LOG_EVERY)
    found = anatomy.violations(ours, hand)
    for expected in mutation.expect:
        assert any(v.startswith(expected) for v in found), (expected, found)
