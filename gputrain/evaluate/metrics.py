"""The evaluation metrics, computed with torch on the evaluation's device (AUROC with numpy on a CPU).

Why not torchmetrics: importing it costs ~0.5-1.4 s of a 6 s default job, and its per-update
checks cost a small model's evaluation several times over. What is computed here is small and
exact: integer counts for the classification figures, every score kept for AUROC (as torchmetrics'
exact mode keeps them), float64 sums for regression. The definitions are scikit-learn's, which the
tests use as the reference:

- accuracy: correct / samples (micro);
- precision, recall, F1: per class from the confusion counts, a class with a zero denominator
  scoring 0, averaged over the classes that occur among the targets or the predictions (sklearn's
  macro average with its default labels; torchmetrics' too);
- AUROC: one class against the rest, averaged over the classes that have both positives and
  negatives in the split (a class with none has no ROC curve; torchmetrics counts it as 0, which
  pulls the mean down for a split that lacks a class). The area is the Mann-Whitney statistic,
  ties counted half, which equals the trapezoid under the exact ROC curve;
- mse, mae: over every target value.

Nothing here reads from the device until `compute`, which makes one read of the figures.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

_HOLD = 32
"""Classification batches held back before they are counted together."""

CLASSIFICATION = ("accuracy", "precision", "recall", "f1", "auroc")
REGRESSION = ("mse", "mae")


def _sum_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64


class EvalMetrics:
    """The requested metrics of one task over one evaluation: `reset`, `update` per batch, `compute`.

    Args:
        names: the metrics wanted (others, such as the loss, are computed by the caller).
        task: "classification" or "regression"; any other task has no metrics here.
        num_classes: the classification's class count.
        device: where the outputs arrive and the states live.
    """

    def __init__(self, names: list[str], task: str, num_classes: int | None, device: torch.device) -> None:
        kinds = CLASSIFICATION if task == "classification" else REGRESSION if task == "regression" else ()
        self.names = [n for n in names if n in kinds]
        self.task = task
        self.num_classes = num_classes
        self.device = device
        self.counted = bool({"accuracy", "precision", "recall", "f1"} & set(self.names))
        self.ranked = "auroc" in self.names
        if task == "classification" and self.names:
            assert num_classes is not None
        self.reset()

    def reset(self) -> None:
        k = self.num_classes or 0
        # the confusion counts, rows the target and columns the prediction, plus one slot that
        # counts targets outside 0..k-1 (refused at `compute`: checking per batch would read the device)
        self.counts = torch.zeros(k * k + 1, dtype=torch.int64, device=self.device)
        self.scores: list[torch.Tensor] = []
        self.targets: list[torch.Tensor] = []
        self._held: list[tuple[torch.Tensor, torch.Tensor]] = []  # batches not yet counted (see `update`)
        self.errors = torch.zeros(3, dtype=_sum_dtype(self.device), device=self.device)  # squared, absolute, values

    def update(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        """One batch: classification logits [N, C, ...] for class indices [N, ...]; regression
        predictions with one value per target value."""
        if not self.names:
            return
        if self.task == "regression":
            self._update_errors(outputs, targets)
            return
        k = self.num_classes
        assert k is not None
        if not (outputs.ndim == targets.ndim + 1 and outputs.shape[1] == k and outputs.shape[2:] == targets.shape[1:]):
            raise ValueError(
                f"classification metrics need outputs [N, {k}, ...] (one score per class, for the {k} "
                f"classes of the task) for targets [N, ...]: got outputs {tuple(outputs.shape)} and targets "
                f"{tuple(targets.shape)}; the model's number of outputs must equal the number of classes"
            )
        # held back and counted _HOLD batches at a time: a handful of small ops per batch cost
        # more than a small model's forward, the same ops over 32 batches hardly more than over one
        self._held.append((outputs.movedim(1, -1).reshape(-1, k), targets.reshape(-1)))
        if len(self._held) >= _HOLD:
            self._count_held()

    def _count_held(self) -> None:
        if not self._held:
            return
        k = self.num_classes
        assert k is not None
        logits = torch.cat([lg for lg, _ in self._held]) if len(self._held) > 1 else self._held[0][0]
        labels = (torch.cat([t for _, t in self._held]) if len(self._held) > 1 else self._held[0][1]).long()
        self._held = []
        if self.counted:
            valid = (labels >= 0) & (labels < k)
            slot = torch.where(valid, labels * k + logits.argmax(dim=1), k * k)
            self.counts.scatter_add_(0, slot, torch.ones_like(slot))
        if self.ranked:
            self.scores.append(logits.float().softmax(dim=1))
            self.targets.append(labels)

    def _update_errors(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        if outputs.numel() != targets.numel():
            raise ValueError(
                f"regression metrics need one prediction per target value: got outputs {tuple(outputs.shape)} "
                f"and targets {tuple(targets.shape)}"
            )
        diff = outputs.reshape(-1).to(self.errors.dtype) - targets.reshape(-1).to(self.errors.dtype)
        step = torch.stack([diff.square().sum(), diff.abs().sum(), diff.new_tensor(float(diff.numel()))])
        self.errors += step

    def compute(self, group: Any = None, across_ranks: bool = False) -> dict[str, float]:
        """The figures; `across_ranks`: each rank of `group` saw its own share, and the states of
        all of them are combined first (every rank returns the same figures).

        Raises:
            ValueError: a target was not a class index of the task.
        """
        if not self.names:
            return {}
        self._count_held()
        counts, errors = self.counts, self.errors
        scores, targets = self._ranked_inputs()
        if across_ranks:
            counts, errors = counts.clone(), errors.clone()
            dist.all_reduce(counts, group=group)
            dist.all_reduce(errors, group=group)
            if self.ranked:
                scores, targets = _gather_rows(scores, group), _gather_rows(targets, group)
        if self.task == "regression":
            squared, absolute, values = errors.tolist()  # the one read
            figures = {"mse": squared / values, "mae": absolute / values} if values else {}
            return {name: figures.get(name, float("nan")) for name in self.names}
        k = self.num_classes
        assert k is not None
        figures_t: dict[str, torch.Tensor] = {}
        if self.counted:
            figures_t.update(_count_figures(counts[: k * k].view(k, k)))
        if self.ranked:
            figures_t["auroc"] = _macro_auroc(scores, targets, k)
        names = [n for n in self.names if n in figures_t]
        stacked = torch.stack([figures_t[n].double() for n in names] + [counts[-1].double()])
        values_read = stacked.tolist()  # the one read
        if values_read[-1]:
            raise ValueError(
                f"{int(values_read[-1])} evaluation targets are not class indices 0..{k - 1} of this {k}-class task"
            )
        return dict(zip(names, values_read[:-1], strict=True))

    def _ranked_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        k = self.num_classes or 0
        if not self.scores:
            empty = torch.empty(0, k, device=self.device)
            return empty, torch.empty(0, dtype=torch.int64, device=self.device)
        if len(self.scores) > 1:  # kept as one tensor: the next evaluation starts from nothing anyway
            self.scores, self.targets = [torch.cat(self.scores)], [torch.cat(self.targets)]
        return self.scores[0], self.targets[0]


def _count_figures(confusion: torch.Tensor) -> dict[str, torch.Tensor]:
    """Accuracy and macro precision, recall and F1 from [C, C] counts (rows: targets)."""
    confusion = confusion.double()
    tp = confusion.diagonal()
    predicted, actual = confusion.sum(dim=0), confusion.sum(dim=1)
    fp, fn = predicted - tp, actual - tp
    present = (tp + fp + fn) > 0  # the class occurs among the targets or the predictions
    weight = present.double() / present.sum().clamp(min=1)

    def ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
        return torch.where(den > 0, num / den.clamp(min=1), torch.zeros_like(num))

    return {
        "accuracy": tp.sum() / confusion.sum().clamp(min=1),
        "precision": (ratio(tp, tp + fp) * weight).sum(),
        "recall": (ratio(tp, tp + fn) * weight).sum(),
        "f1": (ratio(2 * tp, 2 * tp + fp + fn) * weight).sum(),
    }


def _macro_auroc(scores: torch.Tensor, targets: torch.Tensor, k: int) -> torch.Tensor:
    """Mean one-vs-rest AUROC over the classes with both positives and negatives (nan if none).

    For each class, the area is the Mann-Whitney U of its scores: (sum of the positives' ranks -
    P(P+1)/2) / (P * N), ranks averaged over ties. All classes at once: sort each column, number
    the runs of equal scores, and average the ranks within a run with one scatter."""
    dtype = _sum_dtype(scores.device)
    if scores.shape[0] == 0:
        return torch.tensor(float("nan"), dtype=dtype, device=scores.device)
    if scores.device.type == "cpu":
        return torch.tensor(_auroc_on_host(scores, targets, k), dtype=dtype)
    return _auroc_on_device(scores, targets, k)


def _auroc_on_device(scores: torch.Tensor, targets: torch.Tensor, k: int) -> torch.Tensor:
    """`_macro_auroc` in tensor ops where the scores are, read by the caller with the other figures."""
    dtype = _sum_dtype(scores.device)
    n = scores.shape[0]
    classes = torch.arange(k, device=scores.device)
    ordered, order = scores.t().sort(dim=1)  # one row per class (CPU scores take `_auroc_on_host`)
    positive = (targets.unsqueeze(0) == classes.unsqueeze(1)).gather(1, order)
    starts = torch.ones_like(ordered, dtype=torch.int64)
    starts[:, 1:] = (ordered[:, 1:] != ordered[:, :-1]).long()
    run = starts.cumsum(dim=1) - 1  # the run of equal scores each sorted entry belongs to, per class
    slot = (run + classes.unsqueeze(1) * n).reshape(-1)
    rank = torch.arange(1, n + 1, device=scores.device, dtype=dtype).repeat(k)
    rank_sums = torch.zeros(n * k, dtype=dtype, device=scores.device).scatter_add_(0, slot, rank)
    run_sizes = torch.zeros(n * k, dtype=dtype, device=scores.device).scatter_add_(0, slot, torch.ones_like(rank))
    mid_rank = (rank_sums / run_sizes.clamp(min=1)).gather(0, slot).view(k, n)
    pos = positive.sum(dim=1).to(dtype)
    neg = n - pos
    u = (mid_rank * positive).sum(dim=1) - pos * (pos + 1) / 2
    defined = (pos > 0) & (neg > 0)
    area = torch.where(defined, u / (pos * neg).clamp(min=1), torch.zeros_like(u))
    count = defined.sum()
    return torch.where(count > 0, area.sum() / count.clamp(min=1), torch.full_like(area.sum(), float("nan")))


def _auroc_on_host(scores: torch.Tensor, targets: torch.Tensor, k: int) -> float:
    """`_macro_auroc` for CPU scores, in numpy: half the time of the tensor ops, each of which costs
    more than its arithmetic on a CPU (they are most of a small model's evaluation there). Where a
    column has no ties each score's rank is its place in the sorted column; ties get the mean of
    their places (each entry's run of equal scores runs from `first` to `last`)."""
    rows = scores.t().contiguous().numpy()  # one row per class
    n = rows.shape[1]
    order = np.argsort(rows, axis=1)
    ordered = np.take_along_axis(rows, order, axis=1)
    positive = targets.numpy()[order] == np.arange(k)[:, None]
    tied = ordered[:, 1:] == ordered[:, :-1]
    if tied.any():
        place = np.broadcast_to(np.arange(n), (k, n))
        starts = np.ones((k, n), dtype=bool)
        starts[:, 1:] = ~tied
        ends = np.ones((k, n), dtype=bool)
        ends[:, :-1] = ~tied
        first = np.maximum.accumulate(np.where(starts, place, 0), axis=1)
        last = np.minimum.accumulate(np.where(ends, place, n)[:, ::-1], axis=1)[:, ::-1]
        rank_sums = (((first + last) * 0.5 + 1.0) * positive).sum(axis=1)
    else:
        rank_sums = positive.astype(np.float64) @ np.arange(1, n + 1, dtype=np.float64)
    pos = positive.sum(axis=1).astype(np.float64)
    neg = n - pos
    u = rank_sums - pos * (pos + 1) / 2
    defined = (pos > 0) & (neg > 0)
    return float((u[defined] / (pos[defined] * neg[defined])).mean()) if defined.any() else float("nan")


def _gather_rows(rows: torch.Tensor, group: Any) -> torch.Tensor:
    """Every rank's `rows` (row counts may differ), concatenated in rank order."""
    world = dist.get_world_size(group)
    size = torch.tensor([rows.shape[0]], device=rows.device)
    sizes = [torch.empty_like(size) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    counts = [int(s) for s in torch.cat(sizes).tolist()]
    longest = max(counts)
    padded = rows.new_zeros((longest, *rows.shape[1:]))
    padded[: rows.shape[0]] = rows
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([part[:c] for part, c in zip(parts, counts, strict=True)])


def bits_per_byte(mean_loss_nats: float, tokens: int, text_bytes: int) -> float:
    """A language model's bits per UTF-8 byte of text, from its mean token loss in nats over text of
    `tokens` tokens and `text_bytes` bytes: loss × tokens / (bytes × ln 2). Unlike the loss, it
    compares models whose tokenizers differ."""
    return mean_loss_nats * tokens / (text_bytes * math.log(2))
