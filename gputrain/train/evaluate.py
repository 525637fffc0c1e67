"""Evaluation over a split: loss plus the task's torchmetrics, computed on the device."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset, Subset

from gputrain.data.tensors import TensorData
from gputrain.errors import ConfigError
from gputrain.train.tasks import DEFAULT_METRICS, LossFn

_KNOWN = {"classification": {"accuracy", "precision", "recall", "f1", "auroc", "loss"},
          "regression": {"mse", "mae", "loss"}, "lm": {"loss", "perplexity"}, "custom": {"loss"}}


def resolve_metrics(requested: list[str] | str, task: str) -> list[str]:
    if requested == "auto":
        return list(DEFAULT_METRICS.get(task, ["loss"]))
    unknown = [m for m in requested if m not in _KNOWN[task]]
    if unknown:
        raise ConfigError("eval.metrics", f"{', '.join(unknown)} not available for {task}; choose from "
                          + ", ".join(sorted(_KNOWN[task])), requested)
    return list(requested)


def shard_for_eval(data: Dataset, rank: int, world_size: int) -> Dataset:
    """This rank's share of an evaluation split: every world_size-th sample from `rank` on.
    Shares differ by at most one sample; none is seen twice and none is padded in."""
    if isinstance(data, TensorData):
        return TensorData(data.inputs[rank::world_size], data.targets[rank::world_size])
    return Subset(data, range(rank, len(data), world_size))  # type: ignore[arg-type]


def _build_metrics(names: list[str], task: str, num_classes: int | None, device: torch.device,
                   across_ranks: bool) -> dict[str, Any]:
    if not set(names) - {"loss", "perplexity"}:
        return {}  # computed here without torchmetrics, whose import alone takes seconds
    import torchmetrics.classification as C
    import torchmetrics.regression as R

    builders: dict[str, Callable[..., Any]] = {}
    if task == "classification":
        assert num_classes is not None
        k = num_classes
        builders = {
            "accuracy": lambda **kw: C.MulticlassAccuracy(num_classes=k, average="micro", **kw),
            "precision": lambda **kw: C.MulticlassPrecision(num_classes=k, average="macro", **kw),
            "recall": lambda **kw: C.MulticlassRecall(num_classes=k, average="macro", **kw),
            "f1": lambda **kw: C.MulticlassF1Score(num_classes=k, average="macro", **kw),
            "auroc": lambda **kw: C.MulticlassAUROC(num_classes=k, average="macro", **kw),
        }
    elif task == "regression":
        builders = {"mse": R.MeanSquaredError, "mae": R.MeanAbsoluteError}
    # across_ranks: each rank saw its own share, and compute() gathers the states of all ranks.
    # Otherwise every rank evaluated the whole split (FSDP/TP/PP need all ranks in each forward),
    # and syncing would only gather duplicates.
    return {name: builders[name](sync_on_compute=across_ranks).to(device) for name in names if name in builders}


@torch.no_grad()
def evaluate(model: nn.Module, batches: Iterable[Any], *, task: str, metric_names: list[str],
             loss_fn: LossFn | None, num_classes: int | None, device: torch.device,
             autocast: Callable[[], Any], step_fn: Callable[[nn.Module, Any], torch.Tensor] | None = None,
             across_ranks: bool = False) -> dict[str, float]:
    """Mean loss over samples and the requested metrics. One host sync, at the end.

    across_ranks: each rank passed its own share of the split (`shard_for_eval`); the loss sums,
    sample counts and metric states of all ranks are combined, so every rank returns the
    figures of the whole split."""
    was_training = model.training
    model.eval()
    metrics = _build_metrics(metric_names, task, num_classes, device, across_ranks)
    loss_sum = torch.zeros((), device=device, dtype=torch.float64)
    count = 0
    for batch in batches:
        with autocast():
            if step_fn is not None:
                loss = step_fn(model, batch)
                outputs = targets = None
            else:
                inputs, targets = batch[0], batch[1]
                outputs = model(inputs)
                loss = loss_fn(outputs, targets) if loss_fn is not None else None
        size = len(batch[0]) if isinstance(batch, (list, tuple)) else 1
        if loss is not None:
            loss_sum += loss.detach().double() * size
        count += size
        if outputs is None or targets is None:
            continue
        outputs = outputs.float()
        for name, metric in metrics.items():
            if name == "auroc":
                metric.update(outputs.softmax(dim=-1), targets)
            elif task == "regression":
                metric.update(outputs.view_as(targets) if outputs.numel() == targets.numel() else outputs, targets)
            else:
                metric.update(outputs, targets)
    model.train(was_training)
    if across_ranks:
        totals = torch.stack([loss_sum, torch.tensor(float(count), device=device, dtype=torch.float64)])
        dist.all_reduce(totals)
        loss_total, count_total = totals.tolist()  # the one host sync
        count = int(count_total)
    else:
        loss_total = float(loss_sum)  # the one host sync
    results: dict[str, float] = {name: float(metric.compute()) for name, metric in metrics.items()}
    if count and ("loss" in metric_names or "perplexity" in metric_names):
        mean_loss = loss_total / count
        if "loss" in metric_names:
            results["loss"] = mean_loss
        if "perplexity" in metric_names:
            results["perplexity"] = math.exp(min(mean_loss, 700.0))
    return {name: results[name] for name in metric_names if name in results}
