"""EMA: an exponential moving average of the weights, as a Trainer callback (train/callbacks.py).

After each optimizer step every parameter's average moves toward it: `ema = lerp(ema, w, 1 - decay)`
(`ema + (1 - decay) * (w - ema)`), one `torch._foreach_lerp_` over the parameters on the device:
no host sync, no copy to the host. Under FSDP and TP a parameter is a DTensor and its average is
kept for this rank's shard alone (the update is elementwise); under DDP every rank keeps the same
average of its replica. The average starts from the weights at the fit's start.

Beside the raw weights, the average is evaluated after each evaluation of val and test (swapped
into the model's own parameters for the evaluation, then swapped back: one extra copy of the weights
while it runs), in rows of split `ema/val` and `ema/test` in metrics.jsonl and as `ema/<metric>` in
summary.json's val and test blocks; and saved at the end as model-ema.safetensors, written as
model.safetensors is (checkpointer.save_final_weights: every rank its own shards).

Its state in checkpoints is the whole average by parameter name (gathered under FSDP and TP, on the
host), so a resume on any layout puts back exactly the bits it saved. A step the non-finite guard
skips leaves the weights as they were, and the average takes them once more (as it would a step of
a zero gradient). Not under pipeline parallelism (each stage holds other weights).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from gputrain.checkpoint.matching import canonical_name
from gputrain.errors import RunError, UsageError
from gputrain.run.layout import EMA_WEIGHTS
from gputrain.train.callbacks import Callback, TrainerView


class EMA(Callback):
    """An exponential moving average of the weights, updated after each optimizer step.

    Args:
        decay: how much of the average each step keeps, in (0, 1): 0.999 averages over about the
            last 1,000 steps.
        evaluate: evaluate the average after each evaluation of val and test (rows `ema/val`, `ema/test`).
        save: write it as model-ema.safetensors in the run directory when the run completes or stops early.
        state_key: its name in checkpoints (default `EMA#k`).

    Attributes:
        updates: the steps averaged so far (restored on resume).
    """

    def __init__(
        self, decay: float = 0.999, *, evaluate: bool = True, save: bool = True, state_key: str | None = None
    ) -> None:
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 < decay < 1.0:
            raise UsageError(f"EMA(decay={decay!r}): must be a number between 0 and 1, exclusive (0.999 is usual)")
        self.decay = float(decay)
        self.evaluate = evaluate
        self.save = save
        self.state_key = state_key
        self.updates = 0
        self._names: list[str] = []
        self._params: list[nn.Parameter] = []
        self._local: list[torch.Tensor] = []
        """Each parameter's tensor on this rank (a DTensor's local shard), updated in place by the optimizer."""
        self._shadow: list[torch.Tensor] = []
        self._saved: dict[str, torch.Tensor] | None = None
        """The average a checkpoint held, put in place at the fit's start (the parameters are there then)."""

    # ----------------------------------------------------------------- the hooks
    def on_fit_start(self, trainer: TrainerView) -> None:
        if trainer.parts.place.dims.pp_enabled:
            raise UsageError("EMA: not under pipeline parallelism (each stage holds other weights)")
        named = [(canonical_name(n), p) for n, p in trainer.model.named_parameters()]
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        with torch.no_grad():
            self._local = [_local(p) for p in self._params]
            if self._saved is None:
                self._shadow = [t.detach().clone() for t in self._local]
            else:
                self._shadow = [_mine(self._saved, n, p) for n, p in named]
                self._saved = None

    def on_step_end(self, trainer: TrainerView, step: int, metrics: dict[str, Any] | None) -> None:
        with torch.no_grad():
            torch._foreach_lerp_(self._shadow, self._local, 1.0 - self.decay)
        self.updates += 1

    def on_eval_end(self, trainer: TrainerView, split: str, metrics: dict[str, float]) -> None:
        data = {"val": trainer.val_data, "test": trainer.test_data}.get(split)
        if not self.evaluate or data is None or not self._shadow:
            return
        with self.applied(), trainer.shell.outside_steps(f"EMA's {split} evaluation after step {step_of(trainer)}"):
            result = trainer.parts.evaluator.evaluate(data, split)
            _reshard(trainer)
        trainer.parts.metrics.log_eval(f"ema/{split}", trainer.state, result.metrics)
        metrics.update({f"ema/{name}": value for name, value in result.metrics.items()})

    def on_train_end(self, trainer: TrainerView, status: str) -> None:
        if self.save and self._shadow:
            with self.applied():
                trainer.parts.checkpointer.save_final_weights(trainer.run_dir / EMA_WEIGHTS)

    # ----------------------------------------------------------------- the average
    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """The average in the model's parameters for the block, the trained weights back after."""
        with torch.no_grad():
            kept = [t.clone() for t in self._local]
            torch._foreach_copy_(self._local, self._shadow)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(self._local, kept)

    def averaged(self) -> dict[str, torch.Tensor]:
        """{parameter name: this rank's part of its average} (device tensors; a DTensor's shard)."""
        return dict(zip(self._names, self._shadow, strict=True))

    # ----------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The whole average on the host by parameter name (collective under FSDP and TP)."""
        weights = {n: _whole(s, p) for n, s, p in zip(self._names, self._shadow, self._params, strict=True)}
        return {"decay": self.decay, "updates": self.updates, "weights": weights}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        weights = state.get("weights") if isinstance(state, dict) else None
        if not isinstance(weights, dict) or not all(isinstance(t, torch.Tensor) for t in weights.values()):
            raise RunError("EMA: the checkpoint's EMA state has no weights by name")
        self.updates = int(state.get("updates", 0))
        self._saved = weights


def step_of(trainer: TrainerView) -> int:
    return trainer.state.global_step


def _local(param: torch.Tensor) -> torch.Tensor:
    """This rank's tensor of a parameter: a DTensor's local shard (a view of its storage)."""
    from torch.distributed.tensor import DTensor

    return param.to_local() if isinstance(param, DTensor) else param


def _whole(shadow: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """The whole average of `param` on the host: its shards gathered where it is a DTensor."""
    from torch.distributed.tensor import DTensor

    if isinstance(param, DTensor):
        shadow = DTensor.from_local(
            shadow, param.device_mesh, param.placements, shape=param.shape, stride=param.stride()
        ).full_tensor()
    return shadow.detach().to("cpu", copy=True)


def _mine(saved: dict[str, torch.Tensor], name: str, param: torch.Tensor) -> torch.Tensor:
    """This rank's part of the saved average of `param`, on its device: the block of its shard."""
    from torch.distributed.tensor import DTensor

    whole = saved.get(name)
    if whole is None:
        raise RunError(f"EMA: the checkpoint's average has no weight {name!r} (saved from another model?)")
    if tuple(whole.shape) != tuple(param.shape) or whole.dtype != param.dtype:
        raise RunError(
            f"EMA: the checkpoint's average of {name} is {whole.dtype} {tuple(whole.shape)}, "
            f"the model's {param.dtype} {tuple(param.shape)}"
        )
    local = _local(param)
    if isinstance(param, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
        index = tuple(slice(o, o + s) for o, s in zip(offset, shape, strict=True))
        if math.prod(shape) != local.numel():
            raise RunError(f"EMA: {name}'s shard on this rank is not a block of it: cannot place its average")
        whole = whole[index]
    return whole.to(local.device, copy=True).reshape(local.shape).contiguous()


def _reshard(trainer: TrainerView) -> None:
    if trainer.parts.place.dims.fsdp_enabled:  # evaluation leaves FSDP's root gathered (trainer._evaluate)
        from gputrain.distributed.fsdp import reshard

        reshard(trainer.model)
