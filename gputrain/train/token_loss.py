"""Token-level losses normalised over the valid tokens of the whole global batch (issue 29 §5).

A language model's labels may hold `-100` (`IGNORE_INDEX`, the Hugging Face convention for prompt
tokens in supervised fine-tuning, and for padding): those positions carry no loss. The mean over
the valid tokens of one micro-batch, averaged over the micro-batches of a step and over the
data-parallel ranks, weighs a token by how few valid tokens its micro-batch happens to hold, so
N ranks × k accumulation steps would not train as one process on the whole batch. As torchtitan
(its global valid-token count) and Hugging Face's Trainer (`num_items_in_batch`) do, a step here:

1. counts the valid tokens of each of its micro-batches on the device, sums them, and all-reduces
   that one int64 over the data-parallel ranks (`TokenNorm.total`: one collective per step, no host
   sync; tensor-parallel peers read the same samples and are not counted twice);
2. backpropagates each micro-batch's SUM of token losses times `dp_size / total`: the gradient
   reduction of DDP and FSDP averages over the `dp_size` ranks, so the gradient applied is that of
   (sum over the global batch's valid tokens) / total, the gradient of one process on the whole batch;
3. reports as the step's loss the sum of those terms on each rank, which the logger averages over
   the ranks (observe/rank_memory.py): the mean over the global batch's valid tokens.

Evaluation likewise divides a split's summed token loss by its valid tokens (evaluate/evaluator.py),
not a mean per batch weighted by its samples.

A micro-batch without a valid token adds 0. A step whose whole global batch has none has no mean:
its loss is NaN and its gradients 0, so `train.on_nonfinite` decides as for any non-finite loss
(stop names the step, skip drops the update and leaves the schedule where it was, off applies a
zero-gradient update). No NaN reaches the weights.

Which losses are token-level: the task's own cross-entropy of a language model on (inputs, targets)
batches, and dict batches with `labels` for a Hugging Face language model whose forward takes
`num_items_in_batch` (it then returns the SUM of its token losses for `num_items_in_batch=1`; a
causal LM's labels are shifted inside it, so its valid tokens are those of `labels[..., 1:]`, or of
the batch's `shift_labels`, as HF's Trainer counts them). A user's `loss_fn` or `step_fn`, a model
whose forward does not take `num_items_in_batch`, classification and regression keep the mean per
micro-batch, averaged over the micro-batches and ranks.

Under pipeline parallelism the schedule calls the loss on the last stage, once per micro-batch,
and divides the gradients by their number n (scale_grads): its loss is `PipelineTokenLoss`, each
micro-batch's summed token loss times n · dp_size / total, the scale the step sets before it runs
the schedule (the targets of the whole step are on every stage, so each counts them alike).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from gputrain.errors import RunError
from gputrain.models.outputs import model_logits

IGNORE_INDEX = -100
"""The label of a position without a loss (prompt tokens, padding): torch's and Hugging Face's default."""


@dataclass(frozen=True, slots=True)
class TokenLoss:
    """A micro-batch's summed token loss and its count of valid tokens."""

    count: Callable[[Any], torch.Tensor]
    """count(batch): the valid (not IGNORE_INDEX) tokens of a micro-batch, an int64 on its device."""
    summed: Callable[[nn.Module, Any], torch.Tensor]
    """summed(model, batch): the sum of the micro-batch's token losses, a float32 scalar."""
    where: str
    """What is counted, for messages: "targets", "labels", "labels[..., 1:]"."""


def _targets_count(batch: Any) -> torch.Tensor:
    return (_pair(batch)[1] != IGNORE_INDEX).sum()


def _pair(batch: Any) -> Any:
    if not isinstance(batch, (list, tuple)) or len(batch) < 2:
        raise RunError("batches are not (inputs, targets): pass step_fn(model, batch) -> loss to the Trainer")
    return batch


def summed_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The task's next-token cross-entropy (tasks.lm_cross_entropy), summed over the valid tokens
    instead of averaged: logits [B, T, V] against targets [B, T]."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="sum", ignore_index=IGNORE_INDEX)


def _lm_summed(model: nn.Module, batch: Any) -> torch.Tensor:
    inputs, targets = _pair(batch)[:2]
    return summed_cross_entropy(model_logits(model(inputs)), targets)


LM_TOKEN_LOSS = TokenLoss(_targets_count, _lm_summed, "targets")
"""A language model on (inputs, targets) batches with the task's own loss."""


def hf_token_loss(model: nn.Module) -> TokenLoss | None:
    """The token loss of dict batches for `model(**batch)` (a Hugging Face language model given its
    labels), or None where its forward does not take `num_items_in_batch` (its loss stays a mean)."""
    if not _takes_num_items(model):
        return None
    shifted = _shifts_labels(model)

    def count(batch: Any) -> torch.Tensor:
        labels = _labels(batch, "shift_labels") if isinstance(batch, Mapping) and "shift_labels" in batch else None
        if labels is None:
            labels = _labels(batch, "labels")
            labels = labels[..., 1:] if shifted else labels
        return (labels != IGNORE_INDEX).sum()

    def summed(model: nn.Module, batch: Any) -> torch.Tensor:
        _labels(batch, "labels")
        # HF divides its summed token losses by num_items_in_batch: by 1, exactly the sum
        loss = getattr(model(**batch, num_items_in_batch=1), "loss", None)
        if loss is None:
            raise RunError("the model's output for a dict batch has no .loss: give every batch its labels")
        return loss.float()

    return TokenLoss(count, summed, "labels[..., 1:]" if shifted else "labels")


def _labels(batch: Any, key: str) -> torch.Tensor:
    labels = batch.get(key) if isinstance(batch, Mapping) else None
    if not isinstance(labels, torch.Tensor):
        keys = ", ".join(map(str, batch)) if isinstance(batch, Mapping) else type(batch).__name__
        raise RunError(f"a batch has no '{key}' tensor ({keys}): every batch of a language model needs its labels")
    return labels


def _takes_num_items(model: nn.Module) -> bool:
    """Whether `model(**batch)` honours `num_items_in_batch`: the model says so (`accepts_loss_kwargs`,
    HF's attribute), or its forward names it, or it is a Hugging Face model (it has a
    `loss_function`) whose forward passes `**kwargs` on to it, the rule of HF's Trainer. A bare
    `**kwargs` on another model may swallow it: that model's loss stays its mean."""
    declared = getattr(model, "accepts_loss_kwargs", None)
    if declared is not None:
        return bool(declared)
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    if "num_items_in_batch" in params:
        return True
    var_kw = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values())
    return var_kw and _is_hf(model)


def _is_hf(model: nn.Module) -> bool:
    """A Hugging Face model: its class has HF's `loss_function` (PreTrainedModel's)."""
    return any("loss_function" in vars(cls) for cls in type(model).__mro__)


def _shifts_labels(model: nn.Module) -> bool:
    """Whether the model's loss shifts its labels (a causal LM: position i predicts label i+1, so
    position 0 is never a target), read as HF's Trainer does: its loss function is ForCausalLMLoss
    (HF's default where `loss_type` names none) and it is not an encoder-decoder."""
    if not _is_hf(model):  # another model's labels are counted as they are
        return False
    loss_fn = getattr(model, "_loss_function", None)  # set by the user; else HF's choice from loss_type
    if loss_fn is None:
        loss_utils = sys.modules.get("transformers.loss.loss_utils")  # loaded with any HF model
        mapping = getattr(loss_utils, "LOSS_MAPPING", {})
        loss_fn = mapping.get(getattr(model, "loss_type", None)) or mapping.get("ForCausalLM")
    config = getattr(model, "config", None)
    return getattr(loss_fn, "__name__", "") == "ForCausalLMLoss" and not getattr(config, "is_encoder_decoder", False)


class PipelineTokenLoss:
    """The pipeline schedule's loss_fn(outputs, targets) for a language model's own loss: the
    micro-batch's summed token cross-entropy times `scale`, which the step sets before each run of
    the schedule (`TokenNorm.pipeline`)."""

    def __init__(self) -> None:
        self.scale: torch.Tensor | None = None

    def __call__(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        assert self.scale is not None, "the step sets the scale before the schedule runs"
        return summed_cross_entropy(outputs, targets) * self.scale


@dataclass(frozen=True, slots=True)
class TokenNorm:
    """A run's token-level normalisation: its loss, and the data-parallel ranks its count spans."""

    loss: TokenLoss
    dp_size: int = 1
    """Data-parallel ranks whose gradients the reduction averages (DDP, FSDP, HSDP's replicas × shards)."""
    group: Any = None
    """Their process group (None: the default group, where they are all the ranks)."""
    pipeline: PipelineTokenLoss | None = None
    """Under pipeline parallelism: the loss the schedule calls (given to it in place of the task's)."""

    def total(self, micro_batches: list[Any]) -> torch.Tensor:
        """The valid tokens of the global batch: this rank's micro-batches', summed over the
        data-parallel ranks (one all-reduce of one int64, on the device: no host sync)."""
        total = self.loss.count(micro_batches[0])
        for batch in micro_batches[1:]:
            total = total + self.loss.count(batch)
        if self.dp_size > 1:  # in place, on a tensor made here
            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self.group)
        return total

    def scale(self, total: torch.Tensor) -> torch.Tensor:
        """What each micro-batch's summed loss is multiplied by: dp_size / total (a step without a
        valid token counts as 1: its sums are 0, and so are its gradients)."""
        inverse = total.clamp(min=1).reciprocal()
        return inverse * self.dp_size if self.dp_size > 1 else inverse

    def step_loss(self, loss_sum: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
        """The step's reported loss on this rank: the sum of its scaled terms, NaN where the global
        batch had no valid token (a mean over nothing: train.on_nonfinite decides)."""
        # where there is none every term is exactly 0, and 0 / False is NaN; x / True is x, exactly
        return loss_sum / (total > 0)
