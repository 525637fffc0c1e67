"""Evaluation over a split: loss plus the task's metrics (metrics.py), computed on the device; the
`Evaluator` a loop holds for its splits, built with what to compute (`EvalSpec`) and how the ranks
share a split (`EvalLayout`, layout.py), whose `evaluate` returns an `Evaluation` (metrics, kept
scores, samples skipped); and early stopping on what it reports."""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sized
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from gputrain.config.schema import EvalConfig
from gputrain.data.feed import EvalBatches
from gputrain.data.guard import BadSample
from gputrain.data.tensors import TensorData
from gputrain.errors import ConfigError, RunError, UsageError, first_line
from gputrain.evaluate.layout import REPLICATED, EvalLayout
from gputrain.evaluate.metrics import CLASSIFICATION, REGRESSION, EvalMetrics
from gputrain.evaluate.probe import describe_batch, first_batch, raised_at
from gputrain.evaluate.scores import KEEPS_SCORES, ScoreKeeper, Scores
from gputrain.evaluate.shares import Lockstep, gather_scores, lockstep_steps, shard_for_eval
from gputrain.train.state import LoopState
from gputrain.train.tasks import (
    DEFAULT_METRICS,
    ComputeLoss,
    Task,
    dict_output_loss,
    metric_mode,
    model_logits,
)

log = logging.getLogger("gputrain")

EVAL_BATCH_BYTES = 8 << 20
"""In-memory data evaluated on a CPU: inputs per evaluation batch, at most (see `Evaluator._batch_for`)."""
EVAL_BATCH_GROWTH = 16
"""... and at most this many training micro-batches per evaluation batch."""

_KNOWN = {
    "classification": {*CLASSIFICATION, "loss"},
    "regression": {*REGRESSION, "loss"},
    "lm": {"loss", "perplexity"},
    "custom": {"loss"},
}


def resolve_metrics(requested: list[str] | str, task: str | None, loss_only_by: str | None = None) -> list[str]:
    """`eval.metrics` for this task: auto gives the task's defaults; a step_fn run (None) has none.
    `loss_only_by`: the argument ("eval_fn", "step_fn") whose function computes the evaluation's
    loss; it gives no outputs to score, so the loss is the only figure."""
    if task is None:
        return []
    known = {"loss"} if loss_only_by is not None else _KNOWN[task]
    if requested == "auto":
        return ["loss"] if loss_only_by is not None else list(DEFAULT_METRICS.get(task, ["loss"]))
    unknown = [m for m in requested if m not in known]
    if unknown:
        where = f"where {loss_only_by}= computes the evaluation's loss (no outputs to score)" if loss_only_by else task
        raise ConfigError(
            "eval.metrics",
            f"{', '.join(unknown)} not available {'for ' if not loss_only_by else ''}{where}; choose from "
            + ", ".join(sorted(known)),
            requested,
        )
    return list(requested)


def evaluation_plan(
    config: EvalConfig, task: str | None, eval_fn: object | None, step_fn: object | None
) -> tuple[list[str], EarlyStopping]:
    """(the metrics evaluations report, early stopping on them), both refused before training where
    they ask for what the evaluation cannot give: an eval_fn or step_fn gives the loss alone."""
    loss_only_by = "eval_fn" if eval_fn is not None else "step_fn" if step_fn is not None else None
    names = resolve_metrics(config.metrics, task, loss_only_by)
    return names, EarlyStopping(config, names, loss_only_by)


@dataclass(frozen=True, slots=True)
class EvalSpec:
    """What an evaluation computes, and in what precision."""

    task: Task
    """The run's task: its kind (a step_fn run's None evaluates to no metrics), loss, classes, batches."""
    metric_names: list[str]
    """The resolved `eval.metrics` (see `resolve_metrics`)."""
    autocast: Callable[[], Any]
    step_fn: ComputeLoss | None = None
    """The user's eval_fn or step_fn, whose loss is then the one evaluated (no grad, eval mode)."""


@dataclass(frozen=True, slots=True)
class SplitPass:
    """How one evaluation's batches run (what `EvalLayout` decides for a split of a given size).

    shared: each rank passed its own share of the split (`shard_for_eval`); the loss sums, sample
        counts and metric states of all ranks are combined, so every rank returns the figures of
        the whole split.
    group: the process group the shares are combined over (None: all ranks).
    lockstep: the model's forward is collective (FSDP, TP): every rank makes exactly this many
        forward passes, padding past the end of its share (see shares.Lockstep).
    graphed: the model replays CUDA graphs (train.cuda_graphs): each forward starts a graph step of
        its own and its outputs are copied out of the graph pool, where the next replay would
        overwrite the batches the metrics still hold.
    """

    device: torch.device
    shared: bool = False
    group: Any = None
    lockstep: int | None = None
    graphed: bool = False


@dataclass(frozen=True, slots=True)
class Evaluation:
    """What an evaluation of a split gives (the same on every rank)."""

    metrics: dict[str, float]
    scores: Scores | None = None
    """Kept where asked (`keep_scores`, classification and regression): what the model said about
    each sample (scores.py), the shares gathered when the ranks shared the split."""
    skipped: int = 0
    """Unreadable samples left out (data.on_error=skip), over all ranks."""


@torch.no_grad()
def evaluate_split(
    model: nn.Module,
    batches: Iterable[Any],
    spec: EvalSpec,
    run: SplitPass,
    *,
    split: str | None = None,
    count_skipped: Callable[[], int] | None = None,
    keeper: ScoreKeeper | None = None,
    metrics: EvalMetrics | None = None,
) -> tuple[dict[str, float], int]:
    """(mean loss over samples, or for a language model's own loss over the split's valid tokens
    (train/token_loss.py), and the requested metrics; the samples the reader left out as
    unreadable): one host sync, at the end. `count_skipped` is asked once the batches are read (an
    `EvalBatches`'s count in data.on_error=skip mode); the count is summed over the ranks when they
    shared the split.

    metrics: the caller's `EvalMetrics`, reset here (one per evaluator, so a split's evaluation
        allocates nothing it allocated before).

    Raises:
        BadSample: a sample could not be read (fail mode), or none could (skip mode). When the
            ranks share the split, a rank that meets one stops reading and tells the others in the
            one gathering of the figures, so every rank raises and none waits for the others.
    """
    task, metric_names, device, group = spec.task, spec.metric_names, run.device, run.group
    assert task.kind is not None
    was_training = model.training
    model.eval()
    if metrics is None:
        metrics = EvalMetrics(metric_names, task.kind, task.num_classes, device)
    metrics.reset()
    loss_sum = torch.zeros((), device=device, dtype=torch.float64)
    token_loss = task.token_loss if spec.step_fn is None else None
    # a language model's own loss: summed per batch and divided by the split's valid tokens at the
    # end, not a mean per batch weighted by its samples (which weighs a token by its batch's count)
    tokens = torch.zeros((), device=device, dtype=torch.float64) if token_loss is not None else None
    count = 0
    unreadable: BadSample | None = None
    steps = Lockstep(batches, run.lockstep, group, device) if run.lockstep is not None else None
    paired: Iterable[tuple[Any, bool]] = steps if steps is not None else ((b, True) for b in batches)
    try:
        for batch, real in paired:
            if run.graphed:
                torch.compiler.cudagraph_mark_step_begin()
            with spec.autocast():
                loss, outputs, targets = _forward(model, batch, spec.step_fn, task, real)
            if not real:
                continue  # a pad batch: its forward kept the collectives in step; it is not counted
            size = _batch_size(batch)
            if loss is not None and tokens is not None and token_loss is not None:
                loss_sum += loss.detach().double()
                tokens += token_loss.count(batch)
            elif loss is not None:
                loss_sum += loss.detach().double() * size
            count += size
            if outputs is None or targets is None or (keeper is None and not metrics.names):
                continue  # nothing scores the outputs (a language model's loss and perplexity)
            outputs = outputs.float().clone() if run.graphed else outputs.float()
            if keeper is not None:
                keeper.add(outputs, targets)
            metrics.update(outputs, targets)
    except BadSample as err:
        if not run.shared:
            raise
        unreadable = err  # raised after the gathering below, which the other ranks are waiting in
    finally:
        model.train(was_training)
    if steps is not None and steps.unreadable is not None:
        unreadable = steps.unreadable
    skipped = count_skipped() if count_skipped is not None else 0
    sums = loss_sum.view(1) if tokens is None else torch.stack([loss_sum, tokens])
    if run.shared:
        local = [float(count), float(skipped), float(unreadable is not None)]
        totals = torch.cat([sums, torch.tensor(local, device=device, dtype=torch.float64)])
        dist.all_reduce(totals, group=group)
        *sum_totals, count_total, skipped_total, failed_ranks = totals.tolist()  # the one host sync
        count, skipped = int(count_total), int(skipped_total)
        if unreadable is not None:
            raise unreadable
        if failed_ranks:
            where = f"{split} split: " if split else ""
            raise BadSample(f"{where}another rank could not read a sample of its share (its error log names it)")
    else:
        sum_totals = sums.tolist()  # the one host sync
    if count == 0 and skipped:
        where = f"{split} split: " if split else ""
        raise BadSample(f"{where}all {skipped} samples are unreadable (data.on_error=skip): nothing to evaluate")
    results = metrics.compute(group, run.shared)
    if count and ("loss" in metric_names or "perplexity" in metric_names):
        loss_total, divisor = sum_totals[0], sum_totals[1] if tokens is not None else count
        mean_loss = loss_total / divisor if divisor else float("nan")  # no valid token: no mean
        if "loss" in metric_names:
            results["loss"] = mean_loss
        if "perplexity" in metric_names:
            results["perplexity"] = math.exp(min(mean_loss, 700.0))
    return {name: results[name] for name in metric_names if name in results}, skipped


def _forward(
    model: nn.Module, batch: Any, step_fn: ComputeLoss | None, task: Task, real: bool
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(loss, outputs, targets) of one batch: the user's function's loss alone; a language model's
    summed token loss (task.token_loss) alone; a dict batch's `model(**batch).loss`, with its
    `.logits` and `labels` where it has them; or the task's loss on (inputs, targets), not computed
    for a pad batch (not `real`)."""
    loss_fn = task.loss_fn if real else None
    if step_fn is not None:
        loss = step_fn(model, batch)
        if not isinstance(loss, torch.Tensor):
            raise _NotALoss(f"returned a {type(loss).__name__}, not the loss tensor")
        return loss, None, None
    if task.token_loss is not None and real:  # the summed token loss; a language model's outputs score nothing
        return task.token_loss.summed(model, batch), None, None
    if task.dict_batches:
        output = model(**batch)
        logits = model_logits(output)
        return dict_output_loss(output), (logits if logits is not output else None), batch.get("labels")
    inputs, targets = batch[0], batch[1]
    outputs = model_logits(model(inputs))
    return (loss_fn(outputs, targets) if loss_fn is not None else None), outputs, targets


def _batch_size(batch: Any) -> int:
    """Samples in a batch: the length of its first tensor, wherever it sits (tuple, list, dict)."""
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else [batch]
    return next((len(t) for t in items if isinstance(t, torch.Tensor) and t.dim() > 0), 1)


class Evaluator:
    """Evaluates a split with the run's model, task and metrics, on one rank or shared out.

    Args:
        step_model: what the training step calls (compiled, wrapped, or the pipeline's forward).
        model: the plain module holding this rank's parameters (what REPLICATED ranks evaluate with).
        spec: what the evaluation computes (task, metrics, the user's function) and in what precision.
        layout: how the ranks share a split, on what device, in what batches (layout.py).
        batch_transform: applied to each batch on the device first (uint8 images to floats).
        on_error: data.on_error for samples that cannot be read: fail (a `BadSample` naming the
            split and the sample) or skip (left out of the figures and counted in `skipped`).
        max_batches: evaluate only a split's first this many batches (eval.max_batches): its first
            max_batches × the evaluation batch size samples, before the ranks share them out (so
            every layout evaluates the same samples), or a DataLoader's first max_batches batches.
    """

    def __init__(
        self,
        step_model: nn.Module,
        model: nn.Module,
        spec: EvalSpec,
        layout: EvalLayout,
        *,
        batch_transform: Callable[[Any], Any] | None = None,
        on_error: str = "fail",
        max_batches: int | None = None,
    ) -> None:
        self.max_batches = max_batches
        self.step_model = step_model
        self.model = model
        self.spec = spec
        self.layout = layout
        self.batch_transform = batch_transform
        self.on_error = on_error
        self.skipped: dict[str, int] = {}
        """Per split: the unreadable samples left out of its latest evaluation (data.on_error=skip),
        over all ranks; every split evaluated so far has an entry (0 when none was skipped)."""
        self._metrics: EvalMetrics | None = None  # built at the first evaluation, reset per evaluation

    def evaluate(self, data: Dataset | DataLoader, split: str, keep_scores: bool = False) -> Evaluation:
        """The split's metrics (the same figures on every rank); with `keep_scores`, also each
        sample's scores (classification and regression).

        Raises:
            BadSample: naming the split and the sample that could not be read (data.on_error=fail),
                or when no sample of the split could be read (skip).
        """
        if self.spec.task.kind is None:
            return Evaluation({})
        result, example = self._run(self._limited(data), split, keep_scores)
        if result.skipped and not self.skipped.get(split):
            example = f", e.g. {example}" if example else ""
            log.warning(
                "%s split: left out %d unreadable samples (data.on_error=skip)%s", split, result.skipped, example
            )
        self.skipped[split] = result.skipped
        return result

    def check(self, data: Dataset | DataLoader, split: str) -> None:
        """Evaluate the first samples of `split` as its evaluations will (keeping nothing), so that a
        split the evaluation cannot take (another batch structure than training's, dicts without
        labels, targets the task cannot score) is refused before the first step, not after an epoch.
        A DataLoader's first batch is taken as it comes.

        Raises:
            UsageError: naming `<split>_data`, the error, the split's batches and what would work.
        """
        if self.spec.task.kind is None:
            return
        try:
            first = _first_part(data, 2)
        except Exception as err:  # an iterable data set without a length, say: evaluation reads it by index
            raise UsageError(
                f"{split}_data cannot be evaluated: {type(err).__name__}: {first_line(err)}; give it a Dataset with "
                "a length and samples by index, or a DataLoader"
            ) from err
        # eager: a compiled model's forward on two samples would be a compile thrown away, and the
        # changed batch size would make dynamo compile training's graph for any batch size
        device = self.layout.device
        rng = torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])
        try:
            with rng, torch.compiler.set_stance("force_eager"):
                self._run(first, split, keep_scores=False)
        except BadSample:  # an unreadable sample is data.on_error's to handle, when the split is evaluated
            return
        except Exception as err:
            raise UsageError(_cannot_evaluate(split, err, first, self.spec)) from err

    def _run(
        self, data: Dataset | DataLoader | list[Any], split: str, keep_scores: bool
    ) -> tuple[Evaluation, str | None]:
        """(the evaluation, the first sample skipped as unreadable) of one evaluation. `data`: a
        Dataset, or batches as they come (a DataLoader, or a list of its batches), not shared out."""
        layout, kind = self.layout, self.spec.task.kind
        assert kind is not None
        model, batch, steps = self.step_model, self._batch_for(data), None
        dataset = None if isinstance(data, (DataLoader, list)) else data
        total = 0 if dataset is None else len(cast(Sized, dataset))
        shared = dataset is not None and layout.shared(total)
        if shared:
            assert dataset is not None
            data, batch = shard_for_eval(dataset, layout.rank, layout.shares), max(1, batch // layout.shares)
            if layout.sharing == REPLICATED:
                # each rank evaluates its share with the plain module (no collective in its forward)
                model = self.model
            else:
                # LOCKSTEP: every rank of a replica runs each forward (FSDP gathers, TP exchanges):
                # each data-parallel rank its own share, all in lockstep, TP peers on the same share
                steps = lockstep_steps(total, batch, layout.shares)
        reader = EvalBatches(data, batch, layout.device, self.on_error, split)
        batches: Iterable[Any] = reader if self.batch_transform is None else map(self.batch_transform, reader)
        keeper = ScoreKeeper(kind) if keep_scores and kind in KEEPS_SCORES else None
        group = layout.group if shared else None
        run = SplitPass(layout.device, shared, group, steps, layout.graphed and model is self.step_model)
        metrics, skipped = evaluate_split(
            model,
            batches,
            self.spec,
            run,
            split=split,
            count_skipped=lambda: reader.skipped,
            keeper=keeper,
            metrics=self._metrics_for(),
        )
        scores = None
        if keeper is not None:
            scores = keeper.result()
            if shared:  # each rank scored its share: every rank gets the whole split's
                scores = gather_scores(scores, layout.group, total)
        return Evaluation(metrics, scores, skipped), reader.example

    def _limited(self, data: Dataset | DataLoader) -> Dataset | DataLoader | list[Any]:
        """The part of a split that eval.max_batches leaves (all of it where unset)."""
        if self.max_batches is None:
            return data
        if isinstance(data, DataLoader):
            return list(itertools.islice(data, self.max_batches))
        size = self._batch_for(data) * self.max_batches
        if size >= len(cast(Sized, data)):
            return data
        return data.rows(slice(0, size)) if isinstance(data, TensorData) else Subset(data, range(size))

    def _batch_for(self, data: Any) -> int:
        """Samples per evaluation batch: the training micro-batch's, or for in-memory data on a CPU
        as many as EVAL_BATCH_BYTES of inputs hold (at most EVAL_BATCH_GROWTH micro-batches). A
        small model's evaluation is mostly the cost of each batch (a forward's dispatch, the loss,
        the metrics' update), and without gradients the larger batch needs no more memory than a
        training step did. Not for language models, whose outputs per sample are a vocabulary per token."""
        batch, device = self.layout.batch_size, self.layout.device
        if device.type != "cpu" or not isinstance(data, TensorData) or self.spec.task.kind == "lm" or not len(data):
            return batch
        per_sample = max(1, data.nbytes // len(data))
        return max(batch, min(EVAL_BATCH_GROWTH * batch, EVAL_BATCH_BYTES // per_sample))

    def _metrics_for(self) -> EvalMetrics:
        if self._metrics is None:
            task = self.spec.task
            assert task.kind is not None
            self._metrics = EvalMetrics(self.spec.metric_names, task.kind, task.num_classes, self.layout.device)
        return self._metrics


def _first_part(data: Dataset | DataLoader, size: int) -> Dataset | list[Any]:
    """The first `size` samples of a data set, or a DataLoader's first batch (as a list of one)."""
    if isinstance(data, TensorData):
        return data.rows(slice(0, size))
    if isinstance(data, DataLoader):
        return list(itertools.islice(data, 1))
    return Subset(data, range(min(size, len(cast(Sized, data)))))


class _NotALoss(TypeError):
    """The user's evaluation function returned something else than a loss tensor."""


def _cannot_evaluate(split: str, err: Exception, first: Any, spec: EvalSpec) -> str:
    """Why `split` cannot be evaluated, in the Python API's terms, and what would work."""
    batch = first[0] if isinstance(first, list) else first_batch(first)
    batches, error = describe_batch(batch), f"{type(err).__name__}: {first_line(err)}{raised_at(err)}"
    if spec.step_fn is not None:
        where = "the evaluation's function (eval_fn=, or step_fn= without one)"
        if isinstance(err, _NotALoss):
            return f"{split}_data cannot be evaluated: {where} {err}; make it return the loss, (model, batch) -> loss"
        fix = "give it batches that function takes, or pass the Trainer an eval_fn=(model, batch) -> loss for these"
    elif spec.task.dict_batches:
        where = "model(**batch), as in training"
        fix = "give its samples training's keys (with labels), or pass eval_fn=(model, batch) -> loss to the Trainer"
        if isinstance(batch, Mapping) and "labels" not in batch and isinstance(err, RunError):
            return f"{split}_data has no labels ({batches}): model(**batch) gives no loss without them; {fix}"
    else:
        where = "(inputs, targets), as in training"
        fix = "give it (inputs, targets) samples as training has, or pass eval_fn=(model, batch) -> loss to the Trainer"
    return f"{split}_data cannot be evaluated: its first batch ({batches}) fails in {where}: {error}; {fix}"


class EarlyStopping:
    """Tracks the best value of the monitored metric in the loop's state (so it survives a resume),
    and says when `eval.patience` evaluations have passed without improvement."""

    def __init__(self, config: EvalConfig, metric_names: list[str], loss_only_by: str | None = None) -> None:
        monitored = config.early_stop_metric
        if monitored is not None and monitored not in metric_names:
            why = f" ({loss_only_by}= computes the evaluation's loss and no other figure)" if loss_only_by else ""
            raise ConfigError(
                "eval.early_stop_metric",
                "is not among the validation metrics: " + (", ".join(metric_names) or "none") + why,
                monitored,
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
