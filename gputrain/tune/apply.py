"""`parallel.strategy=tuned`: the winner of `gputrain tune` as config overrides, where its tune.json
is for this machine and this config; else auto's choice. Either way one line says which and why.

Nothing of the file is trusted: the winner's layout is read field by field into a `Candidate`
(each of a known kind and range, and micro-batch × grad_accum × ranks = this config's batch), and
its overrides are written from that, never taken from the file's text. A file that is missing,
unreadable, of another machine or another config, or with no measured winner, leaves the run to
auto's choice, and says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gputrain.config.limits import RANKS_MAX
from gputrain.tune.candidates import AC_ORDER, AUTO, Candidate
from gputrain.tune.fingerprint import changed_fields, config_fields, digest
from gputrain.tune.record import TUNE, default_tune_dir

if TYPE_CHECKING:
    from gputrain.config.schema import Config

_STRATEGIES = (AUTO, "none", "ddp", "fsdp")
_SHOWN_CHANGES = 3


@dataclass(frozen=True, slots=True)
class Tuned:
    overrides: list[str]
    ranks: int | None
    """Ranks the winner ran on (None: as the command was given: auto's fallback)."""
    line: str
    applied: bool
    candidate: Candidate | None = None
    """The layout applied (None: auto's fallback)."""


class _NotApplied(Exception):
    """Why the tune is not applied, in a few words."""


def tune_path(config: Config) -> Path:
    given = config.parallel.tune_file
    path = Path(given) if given else default_tune_dir(config.model.name, config.data.name) / TUNE
    return path / TUNE if path.is_dir() else path


def resolve_tuned(config: Config, machine: dict[str, Any], ranks: int | None) -> Tuned:
    """The overrides that apply `parallel.strategy=tuned` to `config` on this `machine`; `ranks`: the
    --nproc-per-node the command was given (the winner among those of that many ranks), or None."""
    path = tune_path(config)
    try:
        record = _read(path)
        candidate, figure = _winner(record, config, machine, ranks)
    except _NotApplied as why:
        return Tuned(["parallel.strategy=auto"], None, f"parallel.strategy=tuned: {why}; running auto's choice", False)
    line = f"parallel.strategy=tuned: {candidate.label()} ({figure}, measured by gputrain tune: {path})"
    return Tuned(candidate.overrides(), candidate.ranks, line, True, candidate)


def _read(path: Path) -> dict[str, Any]:
    from gputrain.run.reader import RunFileError, parse_json, read_bytes

    try:
        data = read_bytes(path.parent, path.name)
        if data is None:
            raise _NotApplied(f"no tune at {path} (gputrain tune writes it; parallel.tune_file names another)")
        record = parse_json(data, str(path))
    except RunFileError as err:
        raise _NotApplied(str(err)) from None
    except OSError as err:
        raise _NotApplied(f"{path}: cannot be read ({err.strerror or err})") from None
    if not isinstance(record, dict):
        raise _NotApplied(f"{path}: not a tune record (an object is right)")
    return record


def _winner(
    record: dict[str, Any], config: Config, machine: dict[str, Any], ranks: int | None
) -> tuple[Candidate, str]:
    if record.get("machine_fingerprint") != digest(machine):
        raise _NotApplied(f"tuned on another machine or torch ({_machine_said(record.get('machine'))})")
    fields = config_fields(config)
    if record.get("config_fingerprint") != digest(fields):
        tuned = record.get("config_fields")
        changed = changed_fields(tuned, fields) if isinstance(tuned, dict) else []
        said = ", ".join(changed[:_SHOWN_CHANGES]) + (", ..." if len(changed) > _SHOWN_CHANGES else "")
        raise _NotApplied(f"the config changed since the tune{f' ({said})' if said else ''}")
    rows = record.get("candidates")
    if not isinstance(rows, list):
        raise _NotApplied("the tune record has no candidates")
    unit = record.get("unit") if record.get("unit") in ("samples/s", "tokens/s") else "samples/s"
    key = "tokens_per_s" if unit == "tokens/s" else "samples_per_s"
    measured = []
    for row in rows:
        if not isinstance(row, dict) or row.get("status") != "ok":
            continue
        figure = row.get(key)
        if isinstance(figure, bool) or not isinstance(figure, (int, float)) or not 0 < figure < math.inf:
            continue
        candidate = _candidate(row.get("candidate"), config, ranks)
        if candidate is not None:
            measured.append((float(figure), candidate))
    if not measured:
        of = f" on {ranks} ranks" if ranks is not None else ""
        raise _NotApplied(f"the tune measured no layout{of} that ran")
    figure, candidate = max(measured, key=lambda m: m[0])  # max keeps the first of equals
    return candidate, f"{figure:,.0f} {unit}"


def _candidate(value: Any, config: Config, ranks: int | None) -> Candidate | None:
    """The row's layout, where every field is of its kind and it trains this config's batch."""
    if not isinstance(value, dict):
        return None

    def whole(name: str, least: int, optional: bool = False) -> int | None:
        v = value.get(name)
        if v is None and optional:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or not least <= v <= RANKS_MAX:
            raise ValueError(name)
        return v

    try:
        c = Candidate(
            ranks=whole("ranks", 1) or 1,
            strategy=_one_of(value.get("strategy"), _STRATEGIES),
            micro_batch=whole("micro_batch", 1, optional=True),
            grad_accum=whole("grad_accum", 1, optional=True),
            activation_checkpointing=_one_of(value.get("activation_checkpointing"), AC_ORDER),
            threads=whole("threads", 1, optional=True),
            compile=_flag(value.get("compile")),
            cuda_graphs=_flag(value.get("cuda_graphs")),
            num_workers=whole("num_workers", 0, optional=True),
        )
    except ValueError:
        return None
    if ranks is not None and c.ranks != ranks:
        return None
    if c.strategy != AUTO:
        if c.micro_batch is None or c.grad_accum is None:
            return None
        if c.micro_batch * c.grad_accum * c.ranks != config.train.batch_size:
            return None
        if (c.strategy == "none") != (c.ranks == 1):
            return None
    return c


def _one_of(value: Any, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(value)
    return value


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(value)
    return value


def _machine_said(value: Any) -> str:
    if not isinstance(value, dict):
        return "no machine recorded"
    from gputrain.terminal import printable

    parts = [str(value.get(k))[:40] for k in ("device", "name", "count", "torch") if k in value]
    return printable(", ".join(parts))[:160] or "no machine recorded"
