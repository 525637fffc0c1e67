"""A run directory as the `use` commands read it: its config, and which of its weights to load.

`--checkpoint` chooses among:
- `final` (the default): `model.safetensors`, the weights the run ended with and the ones its
  summary's test metrics describe. A run that never finished (interrupted, failed) has none; it then
  falls back to `last`, and says so.
- `last`: the newest checkpoint that verifies (damaged ones are passed over, said in one warning).
- `best`: the checkpoint of the step with the best validation metric, as the run tracked it
  (`eval.early_stop_metric`, else the loss); kept by checkpoint rotation for this purpose.
- a path: a checkpoint directory (`checkpoints/step-N`) or a `.safetensors` file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gputrain.checkpoint.io import (
    CorruptCheckpoint,
    checkpoint_step,
    list_checkpoints,
    read_state,
    scan_verified,
    verify_checkpoint,
)
from gputrain.checkpoint.matching import CheckpointMismatch, kind_of_value
from gputrain.config import Config, load_config
from gputrain.errors import UsageError
from gputrain.run import shapes
from gputrain.run.layout import (
    CHECKPOINT_MARKER,
    CHECKPOINT_STATE,
    CHECKPOINTS,
    CONFIG,
    FINAL_WEIGHTS,
    SUMMARY,
    step_of_name,
)
from gputrain.run.reader import RunFileError, read_bytes, read_json, run_entry
from gputrain.use.export_files import EXPORT_RECORD, check_files, read_record

log = logging.getLogger("gputrain")

CHOICES = ("final", "best", "last")
_STEP_LIMIT = 2**63 - 1
"""No run reaches a larger step (a step count is an int64 in torch); nor can Python print an int of
thousands of digits that a hand-made state.pt may hold."""
WeightsKind = Literal["final", "best", "last", "path"]


@dataclass(frozen=True, slots=True)
class WeightsSource:
    """Where the weights to use are, and which of the run's they are."""

    kind: WeightsKind
    path: Path
    """A `.safetensors` file, or a checkpoint directory (one-process or sharded)."""
    step: int | None
    """The optimizer step they are from, where known."""
    note: str | None = None
    """Why these and not the ones asked for (a fallback), said to the user."""

    @property
    def is_checkpoint(self) -> bool:
        return self.path.is_dir()

    def describe(self) -> str:
        at = f" (step {self.step})" if self.step is not None else ""
        return f"{self.kind} weights {self.path}{at}"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": str(self.path), "step": self.step}


def open_run(path: str | Path) -> Path:
    """`path` checked to be a run directory (what `gputrain train --run-dir` writes).

    Raises:
        UsageError: naming the directory and what it lacks.
    """
    run_dir = Path(path)
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: no such directory; give the run directory that gputrain train wrote")
    # what the use commands read of it, by run/reader.py's rules: no link out, the right kind, a bounded size
    for name, directory in ((CHECKPOINTS, True), (SUMMARY, False), (FINAL_WEIGHTS, False)):
        run_entry(run_dir, name, directory=directory)
    if read_bytes(run_dir, CONFIG) is None:
        raise UsageError(
            f"{run_dir}: not a run directory (no config.toml); give the directory gputrain train wrote with --run-dir"
        )
    if os.path.lexists(run_dir / EXPORT_RECORD):  # a safetensors export, given as the run
        check_files(run_dir, read_record(run_dir), [CONFIG])
    return run_dir


def run_config(run_dir: Path, overrides: Iterable[str] | Mapping[str, Any] = ()) -> Config:
    """The run's config.toml (`open_run` checked the file) with `overrides` on top.

    Raises:
        UsageError: the file is not a config, naming it (a bad override names the override).
    """
    path = run_dir / CONFIG
    try:
        load_config(path)
    except UsageError as err:
        reason = " ".join(str(err).split())
        if str(path) in reason:
            raise
        raise UsageError(f"{path}: the run's config cannot be used ({reason})") from None
    return load_config(path, overrides)


def choose_weights(run_dir: Path, choice: str = "final") -> WeightsSource:
    """The weights `--checkpoint choice` names (module docstring), verified where they are a checkpoint.

    Raises:
        UsageError: the run has no such weights (naming the checkpoints it does have, and why a
            damaged one cannot be used), or the path is not weights.
    """
    if choice not in CHOICES:
        return _weights_at(Path(choice))
    final = run_dir / FINAL_WEIGHTS
    if choice == "final" and final.is_file():
        return WeightsSource("final", _as_exported(final), _final_step(run_dir))
    scan = _scan(run_dir)
    if choice == "final":
        if scan.last is None:
            raise UsageError(f"{run_dir}: no usable weights: no {FINAL_WEIGHTS}; {_listing(run_dir, scan)}")
        note = (
            f"{run_dir} has no final weights (the run did not finish): using its last checkpoint, step {scan.last[1]}"
        )
        return scan.warned(WeightsSource("last", *scan.last, note))
    if choice == "last":
        if scan.last is None:
            other = f"; --checkpoint final uses {final}" if final.is_file() else ""
            raise UsageError(f"{run_dir}: --checkpoint last: no usable checkpoint; {_listing(run_dir, scan)}{other}")
        return scan.warned(WeightsSource("last", *scan.last))
    return scan.warned(_best(run_dir, scan))


def _best(run_dir: Path, scan: _Scan) -> WeightsSource:
    if scan.last is None:
        raise UsageError(
            f"{run_dir}: --checkpoint best: no usable checkpoint to read the best step from; {_listing(run_dir, scan)}"
        )
    newest = scan.last[0]
    try:  # verified against its manifest by the scan; read weights-only: tensors and plain values alone
        loop = read_state(newest).get("loop")
    except CheckpointMismatch as err:
        raise UsageError(f"{run_dir}: --checkpoint best: {newest}: {err.problem}") from None
    except CorruptCheckpoint as err:
        raise UsageError(f"{run_dir}: --checkpoint best: {err}") from None
    if loop is not None and not isinstance(loop, dict):
        raise UsageError(
            f"{run_dir}: --checkpoint best: {newest / CHECKPOINT_STATE}: loop is {kind_of_value(loop)}, "
            "not the loop's state; use --checkpoint final or last"
        )
    best_step = loop.get("best_step") if loop is not None else None
    if best_step is None:
        raise UsageError(
            f"{run_dir}: --checkpoint best: the run tracked no best step (it had no validation split or "
            f"metric); use --checkpoint final or last ({_listing(run_dir, scan)})"
        )
    if type(best_step) is not int or not 0 <= best_step <= _STEP_LIMIT:  # a bool is an int too
        what = "out of range" if type(best_step) is int else kind_of_value(best_step)
        raise UsageError(
            f"{run_dir}: --checkpoint best: {newest / CHECKPOINT_STATE}: loop.best_step is {what}, "
            "not a step number; use --checkpoint final or last"
        )
    # looked up among the run's checkpoints: the file's number never becomes a path of its own
    path = next((p for p in list_checkpoints(run_dir / CHECKPOINTS) if step_of_name(p.name) == best_step), None)
    if path is None:
        raise UsageError(
            f"{run_dir}: --checkpoint best: step {best_step}'s checkpoint is not in {run_dir / CHECKPOINTS} "
            f"({_listing(run_dir, scan)}); use --checkpoint final or last"
        )
    try:
        verify_checkpoint(path)
    except CorruptCheckpoint as err:
        raise UsageError(f"{run_dir}: --checkpoint best: step {best_step}'s checkpoint is unusable ({err})") from None
    return WeightsSource("best", path, best_step)


def _weights_at(path: Path) -> WeightsSource:
    if path.is_file():
        if path.suffix != ".safetensors":
            raise UsageError(f"--checkpoint {path}: not a .safetensors file or a checkpoint directory")
        return WeightsSource("path", _as_exported(path), None)
    if not path.is_dir():
        raise UsageError(f"--checkpoint {path}: no such file or directory; or use one of {', '.join(CHOICES)}")
    if not (path / CHECKPOINT_MARKER).exists() and (path / FINAL_WEIGHTS).is_file():
        return WeightsSource("path", _as_exported(path / FINAL_WEIGHTS), None)  # e.g. an export's safetensors folder
    try:
        verify_checkpoint(path)
    except CorruptCheckpoint as err:
        raise UsageError(f"--checkpoint {path}: not a usable checkpoint ({err})") from None
    return WeightsSource("path", path, checkpoint_step(path))


def _as_exported(weights: Path) -> Path:
    """`weights`, checked against its export's checksums where it is an export's (its folder holds
    export.json): only what that export wrote is loaded from an export folder (use/export_files.py).

    Raises:
        UntrustedFile: it is not the file the export wrote.
    """
    folder = weights.parent
    if weights.name == FINAL_WEIGHTS and os.path.lexists(folder / EXPORT_RECORD):
        check_files(folder, read_record(folder), [FINAL_WEIGHTS])
    return weights


@dataclass(frozen=True, slots=True)
class _Scan:
    """The run's checkpoints verified newest first, up to the first that passes."""

    last: tuple[Path, int] | None
    """The newest checkpoint that verifies, and its step."""
    damaged: list[tuple[Path, str]]
    """The newer ones that do not, each with why (newest first)."""

    def warned(self, chosen: WeightsSource) -> WeightsSource:
        """`chosen`, once the damaged checkpoints passed over for it are said in one warning (a
        refusal says them in its own one line instead)."""
        if self.damaged:
            log.warning("using an older checkpoint: %s", _damaged_text(self.damaged))
        return chosen


def _scan(run_dir: Path) -> _Scan:
    found, damaged = scan_verified(list_checkpoints(run_dir / CHECKPOINTS), verify_checkpoint)
    passed_over = [(path, str(err).removeprefix(f"{path}: ")) for path, err in damaged]  # the path is named beside it
    if found is None:
        return _Scan(None, passed_over)
    step = checkpoint_step(found)
    assert step is not None  # verification read it
    return _Scan((found, step), passed_over)


def _damaged_text(damaged: list[tuple[Path, str]]) -> str:
    """'step-16, step-8 damaged (model.safetensors does not match its checksum)': one reason once."""
    by_reason: dict[str, list[str]] = {}
    for path, reason in damaged:
        by_reason.setdefault(reason, []).append(path.name)
    return "; ".join(f"{', '.join(names)} damaged ({reason})" for reason, names in by_reason.items())


def _listing(run_dir: Path, scan: _Scan) -> str:
    """The run's checkpoints for a message: 'checkpoints: step-16 damaged (why); step-8'."""
    found = list_checkpoints(run_dir / CHECKPOINTS)
    if not found:
        return "no checkpoints"
    passed_over = {path for path, _ in scan.damaged}
    rest = ", ".join(path.name for path in found if path not in passed_over)
    return "checkpoints: " + "; ".join(filter(None, [_damaged_text(scan.damaged), rest]))


def _final_step(run_dir: Path) -> int | None:
    """The step the final weights are from, as summary.json says; None where it cannot say."""
    try:
        summary = read_json(run_dir, SUMMARY, shapes.SUMMARY, notes=[])  # a field of a wrong kind: left out
    except RunFileError:
        return None
    step = (summary or {}).get("global_step")
    return step if isinstance(step, int) else None
