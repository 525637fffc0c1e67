"""Where logged records go: `metrics.jsonl` (always) and TensorBoard event files (optional)."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from gputrain.disk_full import removed_if_failed
from gputrain.errors import ConfigError, first_line
from gputrain.run.reader import FINITE

log = logging.getLogger("gputrain")


def _clean(value: Any) -> Any:
    # JSON has no NaN/Infinity; a non-finite float is written as null so every line parses.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _record_step(raw: bytes) -> int | float | None:
    """The step of one line of metrics.jsonl, or None for a damaged line: not UTF-8, not JSON, not a
    JSON object, or without a numeric `step` (a line torn by a kill is one of these)."""
    try:
        record = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    step = record.get("step")
    return step if FINITE(step) else None  # an integer of 400 digits is no step (math.isfinite overflows)


def cut_back(path: Path, resume_step: int, rows: int | None = None) -> int:
    """Keep the lines of `path` up to `resume_step`, as they were, and drop the rest: lines after it
    (the resumed run writes them again) and damaged ones, with one warning for those. `rows`: the
    rows the file held when the checkpoint was taken; only the first `rows` of those kept stay (rows
    of the checkpoint's own step written after it, the resumed run writes again too). The file is
    replaced atomically, so a kill while cutting loses nothing. Returns the rows kept."""
    kept: list[bytes] = []
    damaged: list[int] = []
    for number, raw in enumerate(path.read_bytes().removeprefix(b"\xef\xbb\xbf").split(b"\n"), start=1):
        if not raw.strip():
            continue
        step = _record_step(raw)
        if step is None:
            damaged.append(number)
        elif step <= resume_step and (rows is None or len(kept) < rows):
            kept.append(raw.rstrip(b"\r") + b"\n")
    if damaged:
        lines = ", ".join(map(str, damaged[:5])) + (f" (+{len(damaged) - 5} more)" if len(damaged) > 5 else "")
        log.warning(
            "%s: dropped %d damaged line%s (line %s: not a JSON object with a step); the rest is kept",
            path,
            len(damaged),
            "" if len(damaged) == 1 else "s",
            lines,
        )
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with removed_if_failed(tmp, path.name):  # a file made immutable, a full disk: said, no temporary left
        tmp.write_bytes(b"".join(kept))
        tmp.replace(path)
    return len(kept)


class JsonlSink:
    """One JSON object per line. On resume, lines after the resumed step are dropped first, so the
    file reads exactly as if the run had never stopped; damaged lines are dropped too (one warning).
    Lines are buffered until `flush` (the metrics logger's policy: train/metrics.py), not written one
    system call each."""

    def __init__(self, path: Path, resume_step: int | None = None, rows: int | None = None) -> None:
        self.path = path
        self.rows = 0
        """The rows the file holds: what a checkpoint records (LoopState.metrics_rows)."""
        if resume_step is not None and path.is_file():
            self.rows = cut_back(path, resume_step, rows)
        elif resume_step is None and path.exists():
            path.unlink()
        self._file = path.open("a", buffering=1 << 16, encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        try:  # a full buffer is written out here
            self._file.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        except OSError as err:
            self._name(err)
            raise
        self.rows += 1

    def flush(self) -> None:
        try:
            self._file.flush()
        except OSError as err:
            self._name(err)
            raise

    def close(self) -> None:
        try:
            self._file.close()
        except OSError as err:
            self._name(err)
            raise

    def _name(self, err: OSError) -> None:
        """A buffered write's OSError names no file: it is given this one (run/fs_errors.py says it)."""
        if err.filename is None:
            err.filename = str(self.path)


def check_tensorboard() -> None:
    """Import what `TensorBoardSink` needs now, before training, so that a missing or broken
    tensorboard (one built for another protobuf, say) is one line naming the package and the ways
    out, not a failure at the first step.

    Raises:
        ConfigError: naming log.tensorboard.
    """
    try:
        import tensorboard.compat.proto.summary_pb2  # noqa: F401
        import torch.utils.tensorboard  # noqa: F401
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "tensorboard":
            raise _broken(exc) from exc
        raise ConfigError(
            "log.tensorboard",
            "the tensorboard package is not installed: pip install tensorboard, or set log.tensorboard=false",
        ) from exc
    except Exception as exc:  # any failure to import it is the install's
        raise _broken(exc) from exc


def _broken(exc: BaseException) -> ConfigError:
    return ConfigError(
        "log.tensorboard",
        f"the tensorboard package cannot be imported ({type(exc).__name__}: {first_line(exc)}): reinstall it "
        "(pip install --force-reinstall tensorboard), or set log.tensorboard=false",
    )


class TensorBoardSink:
    """Scalars under `train/…`, `val/…`, `test/…`. Imported lazily: tensorboard is slow to import."""

    def __init__(self, log_dir: Path, resume_step: int | None = None) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(str(log_dir), purge_step=None if resume_step is None else resume_step + 1)
        self._summary = Summary
        self._held: list[tuple[dict[str, Any], float]] = []

    def write(self, record: dict[str, Any]) -> None:
        """Hold the row (with its time) until `flush`: handing each row to the writer's thread as it
        comes wakes that thread once a row, which costs a small model's step more than the row."""
        self._held.append((record, time.time()))

    def flush(self) -> None:
        # One event holds all of a row's scalars: `add_scalar` per figure costs ~60 µs each and
        # wakes the writer thread each time (~0.6 ms a row, more than a small model's step).
        # TensorBoard reads the values of one event as it reads separate scalar events.
        held, self._held = self._held, []
        writer = self._writer._get_file_writer()
        for record, walltime in held:
            split = record.get("split", "train")
            values = [
                self._summary.Value(tag=f"{split}/{key}", simple_value=float(value))
                for key, value in record.items()
                if key not in ("step", "split", "epoch")
                and isinstance(value, (int, float))
                and not isinstance(value, bool)
            ]
            if values:
                writer.add_summary(self._summary(value=values), record["step"], walltime)

    def close(self) -> None:
        self.flush()
        self._writer.close()


class Sinks:
    def __init__(self, sinks: list[Any]) -> None:
        self.sinks = sinks

    def write(self, record: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.write(record)

    def flush(self) -> None:
        for sink in self.sinks:
            sink.flush()

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
