"""A sample that cannot be read mid-run (a corrupt image, a bad row): name it, then fail or skip.

`GuardedDataset` wraps any map-style Dataset read through a DataLoader. A failing `__getitem__`
returns a marker instead of raising, because an exception raised in a DataLoader worker reaches the
main process with the worker's whole traceback pasted into its message; `guarded_collate` drops
the markers and reports them with the batch, and the feed then fails naming the sample
(`data.on_error=fail`) or counts it (`skip`, `data.skipped_samples` in summary.json).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch.utils.data import Dataset
from torch.utils.data._utils.collate import default_collate
from torch.utils.data._utils.pin_memory import pin_memory


class BadSample(Exception):
    """A training sample could not be read. Raised mid-run; the trainer reports it with the step."""


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
    """'sample 17 (file a/b.png)': the index, plus the file when the error or the dataset knows it."""
    path = getattr(err, "filename", None)
    if path is None:
        for attr in ("samples", "imgs", "files", "paths"):  # ImageFolder-style lists of (path, label) or paths
            items = getattr(dataset, attr, None)
            if isinstance(items, (list, tuple)) and 0 <= index < len(items):
                item = items[index]
                path = item[0] if isinstance(item, (list, tuple)) else item
                break
    return f"sample {index}" + (f" (file {path})" if path is not None else "")


class GuardedDataset(Dataset):
    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        try:
            return self.dataset[index]
        except Exception as err:  # noqa: BLE001 - any failure of user/reader code is reported, not raised here
            message = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
            return _Failed(describe_sample(self.dataset, index, err), f"{type(err).__name__}: {message}".rstrip(": "))


def guarded_collate(samples: list[Any]) -> GuardedBatch:
    good = [s for s in samples if not isinstance(s, _Failed)]
    failed = [s for s in samples if isinstance(s, _Failed)]
    return GuardedBatch(default_collate(good) if good else None, failed)


def unwrap(item: GuardedBatch, on_error: str) -> tuple[Any, int]:
    """(the batch, samples skipped). Raises BadSample naming the first bad sample in fail mode, or
    when a whole micro-batch was unreadable."""
    if item.failed and (on_error == "fail" or item.batch is None):
        first = item.failed[0]
        more = f" (and {len(item.failed) - 1} more in this batch)" if len(item.failed) > 1 else ""
        hint = (
            "; set data.on_error=skip to skip unreadable samples"
            if on_error == "fail"
            else "; every sample of the micro-batch was unreadable"
        )
        raise BadSample(f"{first.where}: {first.problem}{more}{hint}")
    return item.batch, len(item.failed)
