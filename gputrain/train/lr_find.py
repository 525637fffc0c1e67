"""The learning-rate range test (L. Smith, "Cyclical Learning Rates for Training Neural Networks",
2017, §3.3; fastai's `lr_find`): train for a few steps while the learning rate grows
exponentially, record the loss at each one, and read a good learning rate off the curve.

The sweep runs on parts built for it alone (`build_sweep_parts`: the model, optimizer and data a
run of the same config would start from, through build.py's builders) and steps with the loop's
own `train_step`, so accumulation, precision, the non-finite guard and every parallel layout
behave exactly as in training. Nothing is checkpointed, logged to metrics.jsonl or evaluated.
Under torchrun every rank records the loss averaged over all ranks, so every rank sees the same
curve and draws the same suggestion; the ranks' suggestions are gathered, counted, and rank 0's is
the one answer. That curve is the one-process curve exactly when training on N ranks equals one
process: for a model without dropout or batch normalisation (`rank_dependent_layers`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from gputrain.config import Config, config_to_dict
from gputrain.config.limits import LR_MAX
from gputrain.distributed.context import all_reduce_mean
from gputrain.observe.own_sync import own_sync
from gputrain.train.build import TrainingParts, build_model_and_data, build_training
from gputrain.train.step import train_step

Rule = Literal["steepest", "minimum"]
RULES: dict[Rule, str] = {
    "steepest": "steepest descent of the smoothed loss against log(lr)",
    "minimum": "one tenth of the lr at the smoothed loss's minimum",
}
RUNNING_DECADES = 0.8
"""The running average that stops the sweep spans this much of the learning rate's range (in
powers of ten), whatever the sweep's density (the default sweep, 100 steps over 8 decades, weights
the past by 0.9). It can only look back: it decides as the sweep goes."""
KERNEL_DECADES = 0.25
"""The rules read the losses smoothed by a Gaussian in log10(lr) of this standard deviation (in
powers of ten; `rule_curve`), centred on each point. A running average lags the losses by
beta / (1 - beta) steps, 0.7 of a decade on the default sweep, and so moved the steepest point to
higher learning rates: on the default cnn (digits, 100 steps) to 1.0e-2, where the losses fall
fastest at 4.0e-3 (3.4e-3 to 4.0e-3 over seeds) and a hand sweep's best learning rate is 5e-3 (3
epochs; 5e-3 to 7e-3 over seeds)."""
DIVERGE_FACTOR = 4.0
"""The sweep stops once the running average rises past this multiple of its lowest value: beyond
that the learning rate only wrecks the weights (fastai's rule)."""
WARMUP_POINTS = 3
"""The first points are skipped by the rules and the stop rule: the running average has seen too
few losses to mean much, and the rules' centred average sees one side of them only."""
MAX_OVERFLOWS = 30
"""fp16 loss-scale overflows in a row before the sweep gives up: GradScaler halves its scale at
each, so 30 take it from 65536 below 1e-4; more means the gradients are Inf at any scale."""


STEPS_MIN = 5
"""Fewer points make no curve for the rules to read."""
STEPS_MAX = 10_000
"""A sweep of more steps is a training run, not a range test (fastai's default is 100): 10,000 points
over the default 8 decades are 1,250 a decade, far denser than the rules' KERNEL_DECADES can use."""
START_LR_MIN = 1e-12
"""Below it no step moves an fp32 weight (their spacing is 1e-7 of the weight), and the sweep's
ratio end/start stays a finite number."""
END_LR_MAX = LR_MAX
"""The largest optim.lr the config takes (config/limits.py): the suggestion is one."""


@dataclass(frozen=True, slots=True)
class Sweep:
    """An exponential sweep from `start_lr` to `end_lr` over `steps` optimizer steps."""

    start_lr: float = 1e-7
    end_lr: float = 10.0
    steps: int = 100

    def lr_at(self, step: int) -> float:
        """The learning rate of the sweep's `step`-th update (0-based)."""
        return self.start_lr * (self.end_lr / self.start_lr) ** (step / max(1, self.steps - 1))

    @property
    def smoothing(self) -> float:
        """The running average's weight of the past: a span of RUNNING_DECADES of learning rate."""
        steps_per_decade = (self.steps - 1) / math.log10(self.end_lr / self.start_lr)
        return 1 - 1 / max(1.0, RUNNING_DECADES * steps_per_decade)


@dataclass(slots=True)
class LRCurve:
    """What the sweep measured: one point per optimizer step."""

    lrs: list[float]
    losses: list[float]
    """The step's loss, the mean over the batch (and over ranks)."""
    smoothed: list[float]
    """A debiased exponential moving average of `losses` (Sweep.smoothing): the stop rule's. The
    rules read `rule_curve`."""
    stopped: str
    """Why the sweep ended: completed, diverged, nonfinite or overflow (fp16 at every loss scale)."""


@dataclass(frozen=True, slots=True)
class Suggestion:
    lr: float
    rule: Rule
    index: int
    """The point of the curve the rule chose (for `minimum`, the minimum's)."""
    ranks_agreeing: int = 1
    """Ranks that computed this suggestion themselves (agree_on_suggestion)."""

    @property
    def rule_text(self) -> str:
        return RULES[self.rule]


def rule_curve(curve: LRCurve) -> list[float]:
    """The losses as the rules read them (and the report draws them): each the average of its
    neighbours under a Gaussian in log10(lr) of KERNEL_DECADES, cut at three of them. Centred, so
    the smoothed loss falls where the losses fall (KERNEL_DECADES). A non-finite loss weighs nothing
    (and stays NaN); past the running average's lowest point (where the stop rule measures from),
    a loss above every loss before it counts as the highest of those: it says only that the sweep
    diverged, and one huge value would lift its neighbours' averages.

    The sweep's points are evenly spaced in log(lr) (fp16's overflowed steps are taken again at the
    same LR, not recorded), so the average is a convolution over the points.
    """
    y = np.asarray(curve.losses, dtype=float)
    n = len(y)
    spacing = math.log10(curve.lrs[-1] / curve.lrs[0]) / (n - 1) if n > 1 else 0.0
    if spacing <= 0:
        return [float(v) for v in y]
    finite = np.isfinite(y)
    running = np.asarray(curve.smoothed, dtype=float)[WARMUP_POINTS:]
    if np.isfinite(running).any() and finite.any():
        lowest = WARMUP_POINTS + int(np.nanargmin(np.where(np.isfinite(running), running, np.nan)))
        ceiling = np.max(y[: lowest + 1][finite[: lowest + 1]], initial=-np.inf)
        y[lowest + 1 :] = np.minimum(y[lowest + 1 :], ceiling)
    half = min(n - 1, int(3 * KERNEL_DECADES / spacing))
    kernel = np.exp(-0.5 * (np.arange(-half, half + 1) * spacing / KERNEL_DECADES) ** 2)
    total = np.convolve(np.where(finite, y, 0.0), kernel)[half : half + n]
    weight = np.convolve(finite.astype(float), kernel)[half : half + n]
    smoothed = np.divide(total, weight, out=np.full(n, math.nan), where=weight > 0)
    smoothed[~finite] = math.nan
    return [float(v) for v in smoothed]


def suggest_lr(curve: LRCurve, rule: Rule = "steepest") -> Suggestion:
    """A learning rate read off the curve, smoothed by `rule_curve`.

    `steepest`: where the smoothed loss falls fastest per decade of learning rate, before its
    minimum; that LR still trains stably but learns quickly. `minimum`: a tenth of the LR at the
    smoothed minimum (the loss is about to climb there, so a tenth of it keeps a margin).

    Raises:
        ValueError: fewer points than the rules need (the sweep diverged at once).
    """
    lrs, smoothed = curve.lrs, rule_curve(curve)
    finite = [i for i in range(len(smoothed)) if math.isfinite(smoothed[i])]
    usable = [i for i in finite if i >= min(WARMUP_POINTS, len(finite) - 2)]
    if len(usable) < 3:
        raise ValueError(f"the sweep has {len(finite)} usable points; at least 3 are needed")
    lowest = min(usable, key=lambda i: smoothed[i])
    if rule == "minimum":
        return Suggestion(lrs[lowest] / 10, rule, lowest)
    descent = [i for i in usable if i <= lowest] or usable
    if len(descent) < 2:  # the loss only rose: nothing fell, so the lowest LR tried is the safe one
        return Suggestion(lrs[descent[0]], rule, descent[0])
    # central differences of the smoothed loss against log(lr): the sweep's points are evenly
    # spaced in log(lr), so this is the slope per decade up to a constant
    slopes = {}
    for n, i in enumerate(descent):
        before, after = descent[max(n - 1, 0)], descent[min(n + 1, len(descent) - 1)]
        if after != before:
            slopes[i] = (smoothed[after] - smoothed[before]) / (math.log10(lrs[after]) - math.log10(lrs[before]))
    steepest = min(slopes, key=lambda i: slopes[i])
    return Suggestion(lrs[steepest], rule, steepest)


def build_sweep_parts(config: Config, run_dir: Path) -> TrainingParts:
    """The parts a run of `config` would start with (same seed, so the same initial weights and the
    same batches), without the validation and test splits. Nothing is written into `run_dir`.
    Built as `gputrain train` builds them (`build_model_and_data`): under torchrun each rank
    materialises only its own part of the model."""
    model, data = build_model_and_data(config)
    return build_training(
        config, model, data.train, spec=data.spec, run_dir=run_dir, names=(config.model.name, config.data.name)
    )


def _sweep_schedule(optimizer: torch.optim.Optimizer, sweep: Sweep) -> torch.optim.lr_scheduler.LambdaLR:
    """The run's schedule replaced by the sweep's: every group starts at start_lr (a group's
    `initial_lr`, left by the run's schedule, would otherwise be taken as the base)."""
    for group in optimizer.param_groups:
        for key in ("lr", "initial_lr"):
            if isinstance(group.get(key), torch.Tensor):
                group[key].fill_(sweep.start_lr)
            else:
                group[key] = sweep.start_lr
    ratio = sweep.end_lr / sweep.start_lr
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: ratio ** (i / max(1, sweep.steps - 1)))


def run_sweep(parts: TrainingParts, sweep: Sweep) -> LRCurve:
    """Train `parts` through the sweep: one loss per optimizer step, read (and averaged over
    ranks) every step, since every step's loss is the result. The parts are spent afterwards.

    Stops early once the smoothed loss passes DIVERGE_FACTOR times its lowest, or the loss is not
    finite; every rank decides on the same averaged numbers, so all stop at the same step.
    """
    # the host guard: the sweep reads every step's verdict anyway, and the device guard's stop mode
    # would mask every step after a bad one until it is read
    guard = parts.step.guard.on_host()
    step_parts = dataclasses.replace(parts.step, scheduler=_sweep_schedule(parts.optimizer, sweep), guard=guard)
    place, console = parts.place, parts.console
    lrs: list[float] = []
    losses: list[float] = []
    smoothed: list[float] = []
    average, lowest, beta = 0.0, math.inf, sweep.smoothing
    stopped, epoch, overflows = "completed", 0, 0
    parts.model.train()
    step_parts.model.train()
    console.start(sweep.steps, 0)
    try:
        while len(lrs) < sweep.steps and stopped == "completed":
            for micro_batches in parts.feed.epoch(epoch):
                lr = float(parts.optimizer.param_groups[0]["lr"])
                result = train_step(step_parts, micro_batches, measure_grad_norm=False)
                if result.verdict.kind == "overflow":
                    # fp16: the scaler skipped the update and the LR did not move, so this is no
                    # point of the curve (a second loss at one LR); the step is taken again
                    overflows += 1
                    if overflows > MAX_OVERFLOWS:
                        stopped = "overflow"
                        break
                    continue
                overflows = 0
                with own_sync():
                    loss = all_reduce_mean(result.loss.float(), place.dist).item()
                lrs.append(lr)
                losses.append(loss)
                average = beta * average + (1 - beta) * loss  # debiased, as Adam's moments
                smoothed.append(average / (1 - beta ** len(losses)))
                if len(smoothed) > WARMUP_POINTS:
                    lowest = min(lowest, smoothed[-1])
                console.advance(len(lrs))
                if not math.isfinite(loss) or result.verdict.kind == "nonfinite":
                    stopped = "nonfinite"
                elif smoothed[-1] > DIVERGE_FACTOR * lowest:
                    stopped = "diverged"
                if stopped != "completed" or len(lrs) >= sweep.steps:
                    break
            epoch += 1
    finally:
        console.stop()
        parts.feed.close()  # the loader's workers end with the sweep
    return LRCurve(lrs, losses, smoothed, stopped)


def agree_on_suggestion(suggestion: Suggestion, parts: TrainingParts) -> Suggestion:
    """Rank 0's suggestion on every rank, with `ranks` set to how many ranks had computed that very
    one themselves (all of them: they read the same averaged losses; fewer would mean the ranks saw
    different curves, and lr_find.json and the command say so rather than hide it)."""
    if not parts.place.dist.enabled:
        return suggestion
    mine = (suggestion.lr, suggestion.rule, suggestion.index)
    everyone: list[Any] = [None] * parts.place.dist.world_size
    dist.all_gather_object(everyone, mine)
    lr, rule, index = everyone[0]
    return Suggestion(float(lr), rule, int(index), ranks_agreeing=sum(theirs == everyone[0] for theirs in everyone))


def rank_dependent_layers(model: nn.Module) -> list[str]:
    """The layers of `model` that make N ranks train otherwise than one process (docs/distributed.md),
    and so sweep another curve than one process, equal only in distribution: dropout (each rank
    draws its own masks) and batch normalisation (each rank normalises its own micro-batch;
    SyncBatchNorm normalises the whole batch and is not one of them)."""
    found = []
    if any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
        found.append("dropout")
    if any(
        isinstance(m, nn.modules.batchnorm._BatchNorm) and not isinstance(m, nn.SyncBatchNorm) for m in model.modules()
    ):
        found.append("batch normalisation")
    return found


def other_suggestions(curve: LRCurve, chosen: Rule) -> dict[str, float]:
    """What the rules not chosen suggest, for comparison: {rule: lr}."""
    return {rule: suggest_lr(curve, rule).lr for rule in RULES if rule != chosen}


def lr_find_record(
    curve: LRCurve, sweep: Sweep, suggestion: Suggestion | None, parts: TrainingParts, config: Config
) -> dict[str, Any]:
    """The content of lr_find.json: the curve, the suggestion (None: the curve gave none) and its
    rule, what the other rules say, and what ran."""
    place = parts.place
    return {
        "suggested_lr": suggestion.lr if suggestion else None,
        "rule": suggestion.rule if suggestion else None,
        "rule_text": suggestion.rule_text if suggestion else None,
        "suggested_index": suggestion.index if suggestion else None,
        "other_rules": other_suggestions(curve, suggestion.rule) if suggestion else {},
        "ranks_agreeing": suggestion.ranks_agreeing if suggestion else None,
        "stopped": curve.stopped,
        "start_lr": sweep.start_lr,
        "end_lr": sweep.end_lr,
        "steps": sweep.steps,
        "steps_run": len(curve.lrs),
        "lrs": curve.lrs,
        "losses": [x if math.isfinite(x) else None for x in curve.losses],
        "smoothed": [x if math.isfinite(x) else None for x in rule_curve(curve)],  # what the rules read
        "config": config_to_dict(config),
        "batch_size": parts.global_batch,
        "grad_accum": place.grad_accum,
        "precision": place.precision,
        "device": str(place.device),
        "world_size": place.dist.world_size,
    }
