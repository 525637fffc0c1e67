"""What each task means for the loop: its default loss, its metrics and which way they improve."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from gputrain.data.pixels import is_uint8_image
from gputrain.data.spec import DataSpec, TaskName
from gputrain.errors import RunError, UsageError
from gputrain.evaluate.probe import ModelFailed, as_pair, first_batch, run_model
from gputrain.models.outputs import model_logits
from gputrain.train.token_loss import LM_TOKEN_LOSS, TokenLoss, hf_token_loss

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

DEFAULT_METRICS = {
    "classification": ["accuracy", "precision", "recall", "f1", "auroc", "loss"],
    "regression": ["mse", "mae", "loss"],
    "lm": ["loss", "perplexity"],
}
_LOWER_IS_BETTER = {"loss", "mse", "mae", "perplexity"}


def lm_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token loss: logits [B, T, V] against targets [B, T]."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def _regression_mse(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(outputs.float(), targets.float().view_as(outputs))


def default_loss(task: str) -> LossFn:
    if task == "classification":
        return F.cross_entropy
    if task == "regression":
        return _regression_mse
    return lm_cross_entropy


def infer_task(outputs: torch.Tensor, targets: torch.Tensor) -> TaskName | None:
    """Guess the task from one batch (for the Python API with user models); None when unclear."""
    if not isinstance(outputs, torch.Tensor) or not isinstance(targets, torch.Tensor):
        return None
    if targets.is_floating_point():
        return "regression"
    if outputs.dim() == 2 and targets.dim() == 1:
        return "classification"
    if outputs.dim() == 3 and targets.dim() == 2:
        return "lm"
    return None


def metric_mode(metric: str, mode: str = "auto") -> str:
    """'min' or 'max': which direction is an improvement for this metric."""
    if mode != "auto":
        return mode
    return "min" if metric in _LOWER_IS_BETTER else "max"


TaskKind = Literal["classification", "regression", "lm", "custom"]
ComputeLoss = Callable[[nn.Module, Any], torch.Tensor]


@dataclass(frozen=True, slots=True)
class Task:
    """What the run learns, decided before its first step: the loss, and what evaluation reports."""

    kind: TaskKind | None
    """classification, regression, lm, or custom (the user's loss_fn, whose outputs say nothing we
    know how to score: evaluation reports the loss); None for a step_fn run (nothing to score)."""
    loss_fn: LossFn | None
    """loss_fn(outputs, targets); None when a step_fn computes the loss."""
    num_classes: int | None = None
    tokens_per_sample: int | None = None
    """Language models: tokens in one sample (for tokens/s)."""
    dict_batches: bool = False
    """Batches are dicts of tensors, given to `model(**batch)`; the loss is the output's `.loss`
    (a Hugging Face model given its labels)."""
    token_loss: TokenLoss | None = None
    """A language model's loss as a sum over valid tokens, normalised by the global batch's count
    of them in training and by the split's in evaluation (token_loss.py); None: a mean per batch
    (`loss_fn`, a dict batch's `.loss`)."""


def resolve_task(
    model: nn.Module, train_data: Any, *, spec: DataSpec | None, loss_fn: LossFn | None, step_fn: ComputeLoss | None
) -> Task:
    """The task from the data's spec; for a user's model and data, from the shapes and dtypes of
    the model's outputs on the first samples (evaluate/probe.py): the logits for (inputs, targets), or
    for dict batches the `.logits` of `model(**batch)` against the batch's `labels`.

    Raises:
        UsageError: the task cannot be told and there is no loss_fn to train with; the model raises
            on the first samples; a dict batch gives the model no way to compute a loss.
    """
    if spec is not None:
        own = loss_fn is None and step_fn is None  # the task's own loss, not the user's
        loss = default_loss(spec.task) if own else loss_fn
        per_sample = spec.input_shape[0] if spec.task == "lm" else None
        return Task(spec.task, loss, spec.num_classes, per_sample, token_loss=_own_token_loss(spec.task, own))
    if step_fn is not None:  # evaluation reports step_fn's loss (no grad, eval mode)
        return Task("custom", None)
    batch = first_batch(train_data)  # read once: a DataLoader of samples it cannot index starts its workers
    if isinstance(batch, Mapping):
        return _dict_batch_task(model, batch)
    pair = as_pair(batch)
    probe = None
    if pair is not None:
        try:
            probe = probe_outputs(model, *pair)
        except ModelFailed as failed:
            if loss_fn is not None:  # it may run where it trains (a GPU-only kernel): step 1 will tell
                return Task("custom", loss_fn)
            raise UsageError(
                f"the model raises on train_data's first samples, model(inputs) with inputs {_shape(pair[0])}: "
                f"{failed}. A model that runs only on its training device: pass loss_fn=(outputs, targets) -> loss "
                "to the Trainer"
            ) from failed.error
    kind = infer_task(*probe) if probe is not None else None
    if kind is None:
        if loss_fn is not None:
            return Task("custom", loss_fn)
        seen = (
            f"outputs {tuple(probe[0].shape)} and targets {tuple(probe[1].shape)}"
            if probe is not None
            else "the data (its samples are not (inputs, targets) tensors, nor dicts for model(**batch))"
        )
        raise UsageError(
            f"cannot tell the task from {seen}: pass loss_fn=(outputs, targets) -> loss, or "
            "step_fn=(model, batch) -> loss, to the Trainer"
        )
    assert probe is not None  # a task was inferred from it
    outputs, targets = probe
    return Task(
        kind,
        loss_fn or default_loss(kind),
        outputs.shape[-1] if kind == "classification" else None,
        targets.shape[-1] if kind == "lm" else None,
        token_loss=_own_token_loss(kind, loss_fn is None),
    )


def _own_token_loss(kind: str | None, own: bool) -> TokenLoss | None:
    """The token-level loss of a language model trained with the task's own loss; None for the
    other tasks and for a user's loss_fn or step_fn (whose mean is kept: token_loss.py)."""
    return LM_TOKEN_LOSS if kind == "lm" and own else None


def _shape(tensor: torch.Tensor) -> str:
    return f"{str(tensor.dtype).removeprefix('torch.')} {list(tensor.shape)}"


def _dict_batch_task(model: nn.Module, batch: Mapping[str, Any]) -> Task:
    """Dict batches go to `model(**batch)`, whose `.loss` is the loss. Where its output also has
    `.logits` and the batch `labels`, the task is told from them as for (inputs, targets), and
    evaluation reports the task's metrics; else the loss alone. A model that cannot run here
    (before it is moved to its device) leaves the task to the loss alone.

    Raises:
        UsageError: the model's output has no `.loss` for these batches (no labels in them).
    """
    try:
        output = run_model(model, (), batch)
    except ModelFailed:
        return Task("custom", None, dict_batches=True)
    if getattr(output, "loss", None) is None:
        missing = "" if "labels" in batch else ", and its batches have no 'labels'"
        raise UsageError(
            f"train_data: model(**batch) returns no .loss for its batches, dicts with keys {', '.join(map(str, batch))}"
            f"{missing}: give each sample its labels (a Hugging Face model computes its loss from them), or pass "
            "step_fn=(model, batch) -> loss to the Trainer"
        )
    logits, labels = model_logits(output), batch.get("labels")
    kind = infer_task(logits, labels) if logits is not output and isinstance(labels, torch.Tensor) else None
    if kind is None or labels is None:
        return Task("custom", None, dict_batches=True)
    ids = batch.get("input_ids")
    tokens = (ids if isinstance(ids, torch.Tensor) else labels).shape[-1]
    return Task(
        kind,
        None,
        logits.shape[-1] if kind == "classification" else None,
        tokens if kind == "lm" else None,
        dict_batches=True,
        token_loss=hf_token_loss(model) if kind == "lm" else None,
    )


def probe_outputs(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the model's outputs for the data's first samples, their targets), shapes and dtypes only.

    Raises:
        ModelFailed: the model raised on the first samples' inputs.
    """
    if is_uint8_image(inputs[0]):  # the model sees these as floats (data/pixels.py)
        inputs = inputs.float()
    return model_logits(run_model(model, (inputs,))), targets


def dict_output_loss(output: Any) -> torch.Tensor:
    """The loss of a dict batch from `model(**batch)`'s output: its `.loss` (a Hugging Face model
    given its labels)."""
    loss = getattr(output, "loss", None)
    if loss is None:
        raise RunError(
            "the model's output for a dict batch has no .loss (give the batch its labels), or pass "
            "step_fn=(model, batch) -> loss to the Trainer"
        )
    return loss


def dict_batch_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    """The loss of a dict batch: `model(**batch).loss`."""
    return dict_output_loss(model(**batch))


def loss_of_batch(task: Task, step_fn: ComputeLoss | None) -> ComputeLoss:
    """The step's loss of one micro-batch: the user's step_fn, a dict batch's `.loss`, or the task's
    loss on (inputs, targets) (a model's ModelOutput read through its `.logits`)."""
    if step_fn is not None:
        return step_fn
    if task.dict_batches:
        return dict_batch_loss
    loss_fn = task.loss_fn
    assert loss_fn is not None

    def compute_loss(model: nn.Module, batch: Any) -> torch.Tensor:
        if not isinstance(batch, (list, tuple)) or len(batch) < 2:
            raise RunError("batches are not (inputs, targets): pass step_fn(model, batch) -> loss to the Trainer")
        return loss_fn(model_logits(model(batch[0])), batch[1])

    return compute_loss
