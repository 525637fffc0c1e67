"""Evaluation over a split: loss plus the task's metrics (eval_metrics.py), computed on the device; the
`Evaluator` a loop holds for its splits, and early stopping on what it reports."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

from gputrain.config.schema import EvalConfig
from gputrain.data.guard import BadSample
from gputrain.distributed.context import DistContext
from gputrain.errors import ConfigError
from gputrain.train.eval_metrics import CLASSIFICATION, REGRESSION, EvalMetrics
from gputrain.train.eval_shares import (
    Lockstep,
    dp_group,
    gather_scores,
    lockstep_steps,
    shard_for_eval,
)
from gputrain.train.feed import EvalBatches
from gputrain.train.scores import KEEPS_SCORES, ScoreKeeper, Scores
from gputrain.train.state import LoopState
from gputrain.train.tasks import DEFAULT_METRICS, LossFn, Task, dict_batch_loss, metric_mode, model_logits

log = logging.getLogger("gputrain")

_KNOWN = {
    "classification": {*CLASSIFICATION, "loss"},
    "regression": {*REGRESSION, "loss"},
    "lm": {"loss", "perplexity"},
    "custom": {"loss"},
}


def resolve_metrics(requested: list[str] | str, task: str | None) -> list[str]:
    """`eval.metrics` for this task: auto gives the task's defaults; a step_fn run (None) has none."""
    if task is None:
        return []
    if requested == "auto":
        return list(DEFAULT_METRICS.get(task, ["loss"]))
    unknown = [m for m in requested if m not in _KNOWN[task]]
    if unknown:
        raise ConfigError(
            "eval.metrics",
            f"{', '.join(unknown)} not available for {task}; choose from " + ", ".join(sorted(_KNOWN[task])),
            requested,
        )
    return list(requested)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Iterable[Any],
    *,
    task: str,
    metric_names: list[str],
    loss_fn: LossFn | None,
    num_classes: int | None,
    device: torch.device,
    autocast: Callable[[], Any],
    step_fn: Callable[[nn.Module, Any], torch.Tensor] | None = None,
    across_ranks: bool = False,
) -> dict[str, float]:
    """Mean loss over samples and the requested metrics. One host sync, at the end.

    across_ranks: each rank passed its own share of the split (`shard_for_eval`); the loss sums,
    sample counts and metric states of all ranks are combined, so every rank returns the
    figures of the whole split."""
    return evaluate_split(
        model,
        batches,
        task=task,
        metric_names=metric_names,
        loss_fn=loss_fn,
        num_classes=num_classes,
        device=device,
        autocast=autocast,
        step_fn=step_fn,
        across_ranks=across_ranks,
    )[0]


@torch.no_grad()
def evaluate_split(
    model: nn.Module,
    batches: Iterable[Any],
    *,
    task: str,
    metric_names: list[str],
    loss_fn: LossFn | None,
    num_classes: int | None,
    device: torch.device,
    autocast: Callable[[], Any],
    step_fn: Callable[[nn.Module, Any], torch.Tensor] | None = None,
    across_ranks: bool = False,
    split: str | None = None,
    count_skipped: Callable[[], int] | None = None,
    keeper: ScoreKeeper | None = None,
    metrics: EvalMetrics | None = None,
    lockstep: int | None = None,
    group: Any = None,
    graphed: bool = False,
) -> tuple[dict[str, float], int]:
    """`evaluate`, plus the samples the reader left out as unreadable (`count_skipped`, asked once
    the batches are read: an `EvalBatches`'s count in data.on_error=skip mode), summed over the
    ranks when they shared the split. `metrics`: the caller's `EvalMetrics`, reset here (one per
    evaluator, so a split's evaluation allocates nothing it allocated before).

    lockstep: the model's forward is collective (FSDP, TP): every rank makes exactly this many
    forward passes, padding past the end of its share (see eval_shares.Lockstep).
    group: the process group the shares are combined over (None: all ranks).
    graphed: the model replays CUDA graphs (train.cuda_graphs): each forward starts a graph step of
        its own and its outputs are copied out of the graph pool, where the next replay would
        overwrite the batches the metrics still hold.

    Raises:
        BadSample: a sample could not be read (fail mode), or none could (skip mode). When the
            ranks share the split, a rank that meets one stops reading and tells the others in the
            one gathering of the figures, so every rank raises and none waits for the others.
    """
    was_training = model.training
    model.eval()
    if metrics is None:
        metrics = EvalMetrics(metric_names, task, num_classes, device)
    metrics.reset()
    loss_sum = torch.zeros((), device=device, dtype=torch.float64)
    count = 0
    unreadable: BadSample | None = None
    steps = Lockstep(batches, lockstep, group, device) if lockstep is not None else None
    paired: Iterable[tuple[Any, bool]] = steps if steps is not None else ((b, True) for b in batches)
    try:
        for batch, real in paired:
            if graphed:
                torch.compiler.cudagraph_mark_step_begin()
            with autocast():
                outputs: torch.Tensor | None
                loss: torch.Tensor | None
                if step_fn is not None:
                    loss = step_fn(model, batch)
                    outputs = targets = None
                else:
                    inputs, targets = batch[0], batch[1]
                    outputs = model_logits(model(inputs))
                    loss = loss_fn(outputs, targets) if loss_fn is not None and real else None
            if not real:
                continue  # a pad batch: its forward kept the collectives in step; it is not counted
            size = _batch_size(batch)
            if loss is not None:
                loss_sum += loss.detach().double() * size
            count += size
            if outputs is None or targets is None:
                continue
            outputs = outputs.float().clone() if graphed else outputs.float()
            if keeper is not None:
                keeper.add(outputs, targets)
            metrics.update(outputs, targets)
    except BadSample as err:
        if not across_ranks:
            raise
        unreadable = err  # raised after the gathering below, which the other ranks are waiting in
    finally:
        model.train(was_training)
    if steps is not None and steps.unreadable is not None:
        unreadable = steps.unreadable
    skipped = count_skipped() if count_skipped is not None else 0
    if across_ranks:
        local = [float(count), float(skipped), float(unreadable is not None)]
        totals = torch.cat([loss_sum.view(1), torch.tensor(local, device=device, dtype=torch.float64)])
        dist.all_reduce(totals, group=group)
        loss_total, count_total, skipped_total, failed_ranks = totals.tolist()  # the one host sync
        count, skipped = int(count_total), int(skipped_total)
        if unreadable is not None:
            raise unreadable
        if failed_ranks:
            where = f"{split} split: " if split else ""
            raise BadSample(f"{where}another rank could not read a sample of its share (its error log names it)")
    else:
        loss_total = float(loss_sum)  # the one host sync
    if count == 0 and skipped:
        where = f"{split} split: " if split else ""
        raise BadSample(f"{where}all {skipped} samples are unreadable (data.on_error=skip): nothing to evaluate")
    results = metrics.compute(group, across_ranks)
    if count and ("loss" in metric_names or "perplexity" in metric_names):
        mean_loss = loss_total / count
        if "loss" in metric_names:
            results["loss"] = mean_loss
        if "perplexity" in metric_names:
            results["perplexity"] = math.exp(min(mean_loss, 700.0))
    return {name: results[name] for name in metric_names if name in results}, skipped


def _batch_size(batch: Any) -> int:
    """Samples in a batch: the length of its first tensor, wherever it sits (tuple, list, dict)."""
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else [batch]
    return next((len(t) for t in items if isinstance(t, torch.Tensor) and t.dim() > 0), 1)


class Evaluator:
    """Evaluates a split with the run's model, task and metrics, on one rank or shared out.

    Args:
        step_model: what the training step calls (compiled, wrapped, or the pipeline's forward).
        model: the plain module holding this rank's parameters.
        task: the run's task; a step_fn run (kind None) evaluates to no metrics.
        metric_names: the resolved `eval.metrics` (see `resolve_metrics`).
        batch_size: samples per evaluation batch on one rank.
        dist: this rank's place in the job.
        replicated: every rank holds the whole model (plain DDP): each evaluates its share of a
            split with the plain module and the figures are combined.
        sharded: the forward is collective (FSDP, hybrid, TP with data-parallel ranks beside): each
            data-parallel rank evaluates its share in lockstep with the others (eval_shares.py) and
            the figures are combined over the data-parallel ranks. With neither (PP, one process, a
            DataLoader split), every rank evaluates the whole split.
        device, autocast: where and in what precision.
        step_fn: the user's eval_fn or step_fn, whose loss is then the one evaluated (no grad, eval mode).
        batch_transform: applied to each batch on the device first (uint8 images to floats).
        graphed: `step_model` replays CUDA graphs (train.cuda_graphs): its outputs are copied.
        on_error: data.on_error for samples that cannot be read: fail (a `BadSample` naming the
            split and the sample) or skip (left out of the figures and counted in `skipped`).
    """

    def __init__(
        self,
        step_model: nn.Module,
        model: nn.Module,
        task: Task,
        metric_names: list[str],
        batch_size: int,
        dist: DistContext,
        replicated: bool,
        device: torch.device,
        autocast: Callable[[], Any],
        step_fn: Callable[[nn.Module, Any], torch.Tensor] | None = None,
        batch_transform: Callable[[Any], Any] | None = None,
        on_error: str = "fail",
        *,
        sharded: bool = False,
        graphed: bool = False,
    ) -> None:
        self.step_model = step_model
        self.model = model
        self.task = task
        self.metric_names = metric_names
        self.batch_size = batch_size
        self.dist = dist
        self.replicated = replicated
        self.sharded = sharded and not replicated and dist.dp_size > 1
        self._group = dp_group(dist) if self.sharded else None
        self.device = device
        self.autocast = autocast
        # the loss of a batch evaluation cannot read from outputs: the user's function, or a dict
        # batch's `.loss`
        self.step_fn = step_fn if step_fn is not None else dict_batch_loss if task.dict_batches else None
        self.batch_transform = batch_transform
        self.on_error = on_error
        self.graphed = graphed
        self.skipped: dict[str, int] = {}
        """Per split: the unreadable samples left out of its latest evaluation (data.on_error=skip),
        over all ranks; every split evaluated so far has an entry (0 when none was skipped)."""
        self.scores: dict[str, Scores] = {}
        """Per split evaluated with `keep_scores`: what the model said about each sample (scores.py),
        on every rank (shares gathered when the ranks shared the split)."""
        self._metrics: EvalMetrics | None = None  # built at the first evaluation, reset per evaluation

    def evaluate(self, data: Dataset | DataLoader, split: str, keep_scores: bool = False) -> dict[str, float]:
        """The split's metrics (the same figures on every rank); with `keep_scores`, also each
        sample's scores in `self.scores[split]` (classification and regression).

        Raises:
            BadSample: naming the split and the sample that could not be read (data.on_error=fail),
                or when no sample of the split could be read (skip).
        """
        if self.task.kind is None:
            return {}
        model, batch, shared, steps = self.step_model, self.batch_size, False, None
        world, total = self.dist.world_size, 0 if isinstance(data, DataLoader) else len(data)  # type: ignore[arg-type]
        if self.replicated and not isinstance(data, DataLoader) and total >= world:
            # each rank evaluates its share with the plain module (no collective in its forward) and
            # the sums are combined; a rank with no sample would skip the gathering its peers wait in
            data, model, shared = shard_for_eval(data, self.dist.rank, world), self.model, True
            batch = max(1, batch // world)
        elif self.sharded and not isinstance(data, DataLoader) and total >= self.dist.dp_size:
            # every rank of a replica runs each forward (FSDP gathers, TP exchanges): each
            # data-parallel rank its own share, all in lockstep, TP peers on the same share
            shares = self.dist.dp_size
            data, shared = shard_for_eval(data, self.dist.dp_rank, shares), True
            batch = max(1, batch // shares)
            steps = lockstep_steps(total, batch, shares)
        reader = EvalBatches(data, batch, self.device, self.on_error, split)
        batches: Iterable[Any] = reader if self.batch_transform is None else map(self.batch_transform, reader)
        keeper = ScoreKeeper(self.task.kind) if keep_scores and self.task.kind in KEEPS_SCORES else None
        metrics, skipped = evaluate_split(
            model,
            batches,
            task=self.task.kind,
            metric_names=self.metric_names,
            loss_fn=self.task.loss_fn,
            num_classes=self.task.num_classes,
            device=self.device,
            autocast=self.autocast,
            step_fn=self.step_fn,
            across_ranks=shared,
            split=split,
            count_skipped=lambda: reader.skipped,
            keeper=keeper,
            metrics=self._metrics_for(),
            lockstep=steps,
            group=self._group if shared else None,
            graphed=self.graphed and model is self.step_model,
        )
        if keeper is not None:
            kept = keeper.result()
            if shared:  # each rank scored its share: every rank gets the whole split's
                kept = gather_scores(kept, self._group, total)
            if kept is not None:
                self.scores[split] = kept
        if skipped and not self.skipped.get(split):
            example = f", e.g. {reader.example}" if reader.example else ""
            log.warning("%s split: left out %d unreadable samples (data.on_error=skip)%s", split, skipped, example)
        self.skipped[split] = skipped
        return metrics

    def _metrics_for(self) -> EvalMetrics:
        if self._metrics is None:
            assert self.task.kind is not None
            self._metrics = EvalMetrics(self.metric_names, self.task.kind, self.task.num_classes, self.device)
        return self._metrics


class EarlyStopping:
    """Tracks the best value of the monitored metric in the loop's state (so it survives a resume),
    and says when `eval.patience` evaluations have passed without improvement."""

    def __init__(self, config: EvalConfig, metric_names: list[str]) -> None:
        monitored = config.early_stop_metric
        if monitored is not None and monitored not in metric_names:
            raise ConfigError(
                "eval.early_stop_metric", "is not among the validation metrics: " + ", ".join(metric_names), monitored
            )
        self.config = config
        self.monitored = monitored or ("loss" if "loss" in metric_names else None)
        """The metric whose best value is tracked (and whose checkpoint is kept): the configured one, else the loss."""

    def update(self, state: LoopState, metrics: dict[str, float]) -> bool:
        """Record this evaluation; True when patience has run out."""
        if self.monitored is None or self.monitored not in metrics:
            return False
        value = metrics[self.monitored]
        lower_is_better = metric_mode(self.monitored, self.config.mode) == "min"
        best = state.best_metric
        if best is None or (value < best if lower_is_better else value > best):
            state.best_metric, state.best_step = value, state.global_step
            state.evals_without_improvement = 0
            return False
        state.evals_without_improvement += 1
        return self.config.early_stop_metric is not None and state.evals_without_improvement >= self.config.patience
