"""Where logged records go: `metrics.jsonl` (always) and TensorBoard event files (optional)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    # JSON has no NaN/Infinity; a non-finite float is written as null so every line parses.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _step_of(line: str) -> float:
    """The step of a logged line; a torn line (the process was killed mid-write) sorts last, so it is dropped."""
    try:
        return json.loads(line).get("step", 0)
    except ValueError:
        return math.inf


class JsonlSink:
    """One JSON object per line. On resume, lines after the resumed step are dropped first, so the
    file reads exactly as if the run had never stopped."""

    def __init__(self, path: Path, resume_step: int | None = None) -> None:
        self.path = path
        if resume_step is not None and path.exists():
            kept = [line for line in path.read_text().splitlines() if _step_of(line) <= resume_step]
            path.write_text("".join(line + "\n" for line in kept))
        elif resume_step is None and path.exists():
            path.unlink()
        self._file = path.open("a", buffering=1)

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")

    def close(self) -> None:
        self._file.close()


class TensorBoardSink:
    """Scalars under `train/…`, `val/…`, `test/…`. Imported lazily: tensorboard is slow to import."""

    def __init__(self, log_dir: Path, resume_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(str(log_dir), purge_step=None if resume_step is None else resume_step + 1)

    def write(self, record: dict[str, Any]) -> None:
        split = record.get("split", "train")
        step = record["step"]
        for key, value in record.items():
            if key in ("step", "split", "epoch") or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            self._writer.add_scalar(f"{split}/{key}", value, step)

    def close(self) -> None:
        self._writer.close()


class Sinks:
    def __init__(self, sinks: list[Any]) -> None:
        self.sinks = sinks

    def write(self, record: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.write(record)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
