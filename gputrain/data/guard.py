"""A sample that cannot be read mid-run (a corrupt image, a bad row): name it, then fail or skip.

`GuardedDataset` wraps any map-style Dataset read through a DataLoader: the training feed's and,
for the validation and test splits, the evaluation's (data/feed.py). A failing `__getitem__`
returns a marker instead of raising, because an exception raised in a DataLoader worker reaches the
main process with the worker's whole traceback pasted into its message; `guarded_collate` drops
the markers and reports them with the batch, and the reader then fails naming the split and the
sample (`data.on_error=fail`) or counts it (`skip`: `data.skipped_samples` in summary.json for
training, the evaluator's per-split count for val and test).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch.utils.data import Dataset, Subset
from torch.utils.data._utils.collate import default_collate
from torch.utils.data._utils.pin_memory import pin_memory


class BadSample(Exception):
    """A sample could not be read. Raised mid-run; the message names the split and the sample
    (and its file when known); the trainer reports it with the step."""


@dataclass(frozen=True, slots=True)
class _Failed:
    where: str
    problem: str


@dataclass(slots=True)
class GuardedBatch:
    """A collated batch plus the samples that could not be read for it."""

    batch: Any
    failed: list[_Failed]

    def pin_memory(self) -> GuardedBatch:
        """The DataLoader's pin hook calls this on objects it does not know; without it the
        tensors inside would stay in pageable memory and every copy to the GPU would block."""
        return GuardedBatch(None if self.batch is None else pin_memory(self.batch), self.failed)


def describe_sample(dataset: Any, index: int, err: BaseException | None = None) -> str:
    """'sample 17 (file a/b.png)': the index, plus the file when the error or the dataset knows it.
    A `Subset` (an evaluation rank's share) is looked through: the index and the file are those of
    the split it was cut from."""
    while isinstance(dataset, Subset) and 0 <= index < len(dataset.indices):
        dataset, index = dataset.dataset, int(dataset.indices[index])
    path = getattr(err, "filename", None)
    if path is None:
        for attr in ("samples", "imgs", "files", "paths"):  # ImageFolder-style lists of (path, label) or paths
            items = getattr(dataset, attr, None)
            if isinstance(items, (list, tuple)) and 0 <= index < len(items):
                item = items[index]
                path = item[0] if isinstance(item, (list, tuple)) else item
                break
    return f"sample {index}" + (f" (file {path})" if path is not None else "")


def problem_of(err: BaseException) -> str:
    """'ExceptionType: first line of its message' (at most 200 characters of it)."""
    text = str(err).strip()
    message = text.splitlines()[0][:200] if text else ""
    return f"{type(err).__name__}: {message}".rstrip(": ")


class GuardedDataset(Dataset):
    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        try:
            return self.dataset[index]
        except Exception as err:  # noqa: BLE001 - any failure of user/reader code is reported, not raised here
            return _Failed(describe_sample(self.dataset, index, err), problem_of(err))

    def __getitems__(self, indices: list[int]) -> list[Any]:
        """A micro-batch's samples, read by the data set's own `__getitems__` where it has one (a
        Hugging Face dataset reads a batch at once), in one guarded pass; a failure reads them
        again one by one, so that each unreadable sample is named."""
        try:
            read = getattr(self.dataset, "__getitems__", None)
            return list(read(indices)) if read is not None else [self.dataset[i] for i in indices]
        except Exception:  # noqa: BLE001 - reported per sample by __getitem__ below
            return [self[i] for i in indices]


def guarded_collate(samples: list[Any]) -> GuardedBatch:
    good = [s for s in samples if not isinstance(s, _Failed)]
    failed = [s for s in samples if isinstance(s, _Failed)]
    return GuardedBatch(default_collate(good) if good else None, failed)


def bad_sample(split: str | None, where: str, problem: str, more: int = 0, hint: str = "") -> BadSample:
    """The error naming one unreadable sample: '<split> split: sample 3 (file …): OSError: …'."""
    prefix = f"{split} split: " if split else ""
    also = f" (and {more} more in this batch)" if more else ""
    return BadSample(f"{prefix}{where}: {problem}{also}{hint}")


SKIP_HINT = "; set data.on_error=skip to skip unreadable samples"


ALONE_HINT = (
    "; every sample of this rank's micro-batch was unreadable, and one rank of several cannot leave out a "
    "step its peers take (they would wait for it): remove or repair the unreadable files"
)


def unwrap(item: GuardedBatch, on_error: str, split: str | None = None, allow_empty: bool = True) -> tuple[Any, int]:
    """(the batch, samples skipped). Raises BadSample naming the split and the first bad sample in
    fail mode. In skip mode the batch is None where every sample was unreadable: an evaluation
    leaves it out, and so does one training process (its step is left out, data/feed.py); not
    `allow_empty` (a rank of several), that is an error too."""
    if item.failed and (on_error == "fail" or (item.batch is None and not allow_empty)):
        first = item.failed[0]
        hint = SKIP_HINT if on_error == "fail" else ALONE_HINT
        raise bad_sample(split, first.where, first.problem, len(item.failed) - 1, hint)
    return item.batch, len(item.failed)


def nothing_readable(split: str, samples: int, example: str | None) -> BadSample:
    """The error for a split none of whose samples could be read (data.on_error=skip skips samples,
    not a whole split)."""
    seen = f" (e.g. {example})" if example else ""
    return BadSample(f"{split} split: none of its {samples} samples could be read{seen}; check data.path")
