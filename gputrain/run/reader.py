"""Reading a run directory's files, for every command that reads one (report, the use commands,
lr-find, rl): train's rules for its entries (files.py `check_run_entries`) on the reading side, and
no trust in what a file holds.

A run directory is a folder people copy, send and edit by hand, so each of its files is opened only
where it is the right kind (a regular file, not a FIFO that would block or a device that never
ends), not a symbolic link leading out of the directory (a report would carry `/etc/passwd` or a
key file to whoever reads it), and not over a size bound named per kind of file. What it holds is
then parsed without trusting it (JSON nested too deeply, integers too long for Python) and checked
against a small schema of the fields the readers use (`Shape`), so every reader sees values of
the types it expects, or none.

Two outcomes for a file that fails: `RunFileError`, a `DataError` of one line naming the file and
what would be right, where a command cannot go on without it (the use commands' summary, a
run's config); or, where a reader can go on (the report), that line as a note and the file or the
field left out (`Notes`).
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gputrain.config.paths import kind_of_mode
from gputrain.errors import DataError
from gputrain.run.layout import (
    CHECKPOINT_MANIFEST,
    CONFIG,
    ENV,
    LR_FIND,
    SUMMARY,
    eval_record_name,
    profile_name,
    scores_name,
)

KB, MB = 1 << 10, 1 << 20

LIMITS = {
    CONFIG: 1 * MB,
    ENV: 1 * MB,
    SUMMARY: 4 * MB,
    LR_FIND: 64 * MB,
    CHECKPOINT_MANIFEST: 4 * MB,
    "profile": 64 * MB,
    "eval": 4 * MB,
    "scores": 512 * MB,
}
"""The most each kind of run file may hold (gputrain writes a few KB to a few MB of each: a sweep
of a million steps is ~60 MB, scores are at most 20,000 rows). `limit_for` maps a name to its kind."""
METRICS_LINE = 1 * MB
"""The longest line of metrics.jsonl read (a row is ~1 KB): the file itself grows with the run and
is streamed, never held whole."""
TAIL_BYTES = 64 * KB
"""What is read of a log's end (error.log): the last lines are what a report shows."""
DEFAULT_LIMIT = 4 * MB


def limit_for(name: str) -> int:
    """The size bound of the run file `name` (LIMITS by its kind)."""
    if name in LIMITS:
        return LIMITS[name]
    kinds = ((profile_name(None), "profile"), (eval_record_name("*"), "eval"), (scores_name("*"), "scores"))
    for pattern, kind in kinds:
        if fnmatch.fnmatchcase(name, pattern.replace(".", "*.", 1) if kind == "profile" else pattern):
            return LIMITS[kind]
    return DEFAULT_LIMIT


class RunFileError(DataError):
    """A run file that cannot be read as what it should be: one line naming the file (and the field)."""


def _size(n: int) -> str:
    return f"{n / MB:.0f} MB" if n >= MB else f"{n / KB:.0f} KB" if n >= KB else f"{n} bytes"


# ----------------------------------------------------------------- the entry: its kind, and where it leads


def run_entry(run_dir: Path, name: str, *, directory: bool = False) -> Path | None:
    """`run_dir / name` resolved, where it is there and may be read: the right kind (`directory` or a
    regular file), inside the run directory once every link is followed (a parent folder that is a
    link included); None where nothing is there (a link to nothing included: nothing to read).

    Raises:
        RunFileError: naming the entry, what it is and what is right.
    """
    path = run_dir / name
    shown = str(path)
    try:
        if not os.path.lexists(path):
            return None
        root = run_dir.resolve(strict=True)
        target = path.resolve(strict=False)
    except RuntimeError:  # a loop of links (Python < 3.13)
        raise RunFileError(f"{shown}: a loop of symbolic links; remove it") from None
    except OSError as err:
        if err.errno == 40:  # ELOOP
            raise RunFileError(f"{shown}: a loop of symbolic links; remove it") from None
        raise RunFileError(f"{shown}: cannot be read ({err.strerror or err})") from None
    if not target.is_relative_to(root):
        raise RunFileError(
            f"{shown}: a symbolic link leading out of the run directory (to {target}); a run's files are read "
            "only inside its directory: copy the file in place of the link"
        )
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        return None  # a link to nothing
    except OSError as err:
        raise RunFileError(f"{shown}: cannot be read ({err.strerror or err})") from None
    want = "a directory" if directory else "a regular file"
    if kind_of_mode(mode) != want:
        raise RunFileError(f"{shown}: is {kind_of_mode(mode)}, where a run keeps {want}; remove or replace it")
    return target


def _open(run_dir: Path, name: str) -> tuple[int, os.stat_result, Path] | None:
    """An open descriptor of the regular file `name`, its fstat and its shown path; None where absent.
    Opened without following a last link (the resolved path has none unless it was swapped since)
    and without blocking (a FIFO swapped in is refused by fstat, not waited on)."""
    target = run_entry(run_dir, name)
    if target is None:
        return None
    shown = run_dir / name
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(target, flags)
    except OSError as err:
        raise RunFileError(f"{shown}: cannot be read ({err.strerror or err})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise RunFileError(f"{shown}: is {kind_of_mode(info.st_mode)}, where a run keeps a regular file; remove it")
    return fd, info, shown


def read_bytes(run_dir: Path, name: str, limit: int | None = None) -> bytes | None:
    """The whole of the run file `name` (None where it is absent), at most `limit` bytes (its kind's).

    Raises:
        RunFileError: the entry is refused (`run_entry`), or is larger than the limit (named).
    """
    limit = limit_for(name) if limit is None else limit
    opened = _open(run_dir, name)
    if opened is None:
        return None
    fd, info, shown = opened
    with os.fdopen(fd, "rb") as f:
        if info.st_size > limit:
            raise RunFileError(f"{shown}: {_size(info.st_size)}, over the {_size(limit)} a {name} of a run holds")
        data = f.read(limit + 1)
    if len(data) > limit:  # grown since
        raise RunFileError(f"{shown}: over the {_size(limit)} a {name} of a run holds")
    return data


def read_text(run_dir: Path, name: str, limit: int | None = None) -> str | None:
    """`read_bytes` as UTF-8 text.

    Raises:
        RunFileError: as read_bytes, or the file is not UTF-8 text.
    """
    data = read_bytes(run_dir, name, limit)
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise RunFileError(f"{run_dir / name}: not UTF-8 text") from None


def read_tail(run_dir: Path, name: str, size: int = TAIL_BYTES) -> str | None:
    """The last `size` bytes of a log file as text (undecodable bytes replaced); None where absent."""
    opened = _open(run_dir, name)
    if opened is None:
        return None
    fd, info, _ = opened
    with os.fdopen(fd, "rb") as f:
        f.seek(max(0, info.st_size - size))
        return f.read(size).decode("utf-8", errors="replace")


def iter_lines(run_dir: Path, name: str, max_line: int = METRICS_LINE) -> Iterator[bytes | None]:
    """The lines of an appended file (metrics.jsonl), streamed: each line's bytes, or None for a line
    longer than `max_line` (skipped unread, so memory stays bounded whatever the file holds).

    Raises:
        RunFileError: the entry is refused (`run_entry`).
    """
    opened = _open(run_dir, name)
    if opened is None:
        return
    fd, _, _ = opened
    with os.fdopen(fd, "rb") as f:
        while True:
            line = f.readline(max_line + 1)
            if not line:
                return
            if len(line) > max_line and not line.endswith(b"\n"):
                while line and not line.endswith(b"\n"):  # the rest of the long line
                    line = f.readline(max_line)
                yield None
                continue
            yield line


# ----------------------------------------------------------------- JSON without trust


def parse_json(data: bytes | str, where: str) -> Any:
    """JSON as gputrain writes it (NaN and Infinity are how it writes a diverged loss).

    Raises:
        RunFileError: naming `where` and what is wrong: not JSON, not UTF-8, nested too deeply, a
            number too long for Python.
    """
    try:
        return json.loads(data.decode("utf-8") if isinstance(data, bytes) else data)  # not json's guess of UTF-16
    except RecursionError:
        raise RunFileError(f"{where}: nested too deeply to be a run's file") from None
    except UnicodeDecodeError:
        raise RunFileError(f"{where}: not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise RunFileError(f"{where}: not valid JSON ({err.msg} at line {err.lineno})") from None
    except ValueError:  # an integer of more than 4300 digits (sys.int_info.default_max_str_digits)
        raise RunFileError(f"{where}: holds a number too long to be a run's figure") from None


# ----------------------------------------------------------------- schemas: the types of the fields readers use


@dataclass(frozen=True, slots=True)
class Kind:
    """What a field holds: a test and how the test is said in a message."""

    test: Callable[[Any], bool]
    said: str

    def __call__(self, value: Any) -> bool:
        return self.test(value)


INT_BOUND = 2**63
"""The largest integer a field of a run file holds (a step, a size in bytes): beyond it a value
cannot be a float's or a C integer's, and formatting or converting it would fail or take long."""
NOTES_PER_FILE = 5


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) < INT_BOUND


def is_number(value: Any) -> bool:
    """An int or float as a run writes one (not a bool; an int within INT_BOUND, so float() holds it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return not isinstance(value, int) or abs(value) < INT_BOUND  # a float: NaN or ±inf too (a diverged run's)


INT = Kind(_is_int, "an integer")
NUMBER = Kind(is_number, "a number")
FINITE = Kind(lambda v: is_number(v) and math.isfinite(v), "a finite number")
POSITIVE = Kind(lambda v: FINITE(v) and v > 0, "a number > 0")
TEXT = Kind(lambda v: isinstance(v, str), "text")
BOOL = Kind(lambda v: isinstance(v, bool), "true or false")
OBJECT = Kind(lambda v: isinstance(v, dict), "an object {...}")


def optional(kind: Kind) -> Kind:
    """`kind` or null."""
    return Kind(lambda v: v is None or kind(v), f"{kind.said} or null")


def list_of(kind: Kind) -> Kind:
    return Kind(lambda v: isinstance(v, list) and all(kind(x) for x in v), f"a list of {kind.said}s")


def mapping_of(kind: Kind) -> Kind:
    """An object whose every value is `kind` (summary.json's metrics of a split)."""
    return Kind(lambda v: isinstance(v, dict) and all(kind(x) for x in v.values()), f"an object of {kind.said}s")


@dataclass(frozen=True, slots=True)
class Shape:
    """The fields of a run file that readers use, with their kinds; `required` ones the file is of no
    use without. Fields not named pass as they are (a newer gputrain adds keys)."""

    fields: dict[str, Kind]
    required: tuple[str, ...] = ()
    nested: dict[str, Shape] | None = None
    """Fields holding an object checked by a shape of its own (summary.json's "train")."""
    each: dict[str, Shape] | None = None
    """Fields holding a list of objects, each checked by a shape of its own (profile.json's ops)."""

    def check(self, value: Any, where: str, notes: list[str]) -> dict[str, Any]:
        """`value` with every field of a wrong kind left out, each said in `notes` as one line
        ("summary.json: global_step is 'x'; an integer is right; left out").

        Raises:
            RunFileError: `value` is not an object, or a required field is missing or of a wrong kind.
        """
        if not isinstance(value, dict):
            raise RunFileError(f"{where}: holds {_what(value)}, where an object {{...}} is right")
        kept = dict(value)
        for key in self.required:
            if key not in kept:
                raise RunFileError(f"{where}: has no field {key!r} ({self.fields[key].said})")
        for key, kind in self.fields.items():
            if key not in kept:
                continue
            field_value = kept[key]
            if not kind(field_value):
                line = f"{where}: {key} is {_what(field_value)}; {kind.said} is right"
                if key in self.required:
                    raise RunFileError(line)
                notes.append(f"{line}; left out")
                del kept[key]
            elif self.nested and key in self.nested and isinstance(field_value, dict):
                kept[key] = self.nested[key].check(field_value, f"{where}: {key}", notes)
            elif self.each and key in self.each and isinstance(field_value, list):
                shape = self.each[key]
                kept[key] = [shape.check(item, f"{where}: {key}[{i}]", notes) for i, item in enumerate(field_value)]
        return kept


def _what(value: Any) -> str:
    """A value as a message shows it: short, whatever its size."""
    if isinstance(value, (dict, list)):
        return f"{'an object' if isinstance(value, dict) else 'a list'} of {len(value)}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= INT_BOUND:
        return f"a number of {len(str(abs(value)))} digits"
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def read_json(run_dir: Path, name: str, shape: Shape, notes: list[str] | None = None) -> dict[str, Any] | None:
    """The run file `name` as JSON checked by `shape`; None where it is absent. Fields of a wrong kind
    are left out and said in `notes` (without `notes`: refused, as a required field is).

    Raises:
        RunFileError: one line naming the file (and field) and what is right.
    """
    data = read_bytes(run_dir, name)
    if data is None:
        return None
    where = str(run_dir / name)
    said: list[str] = []
    record = shape.check(parse_json(data, where), where, said)
    if notes is None and said:
        raise RunFileError(said[0].removesuffix("; left out"))
    if notes is not None:
        notes.extend(said[:NOTES_PER_FILE])
        if len(said) > NOTES_PER_FILE:  # a file of a million bad fields is a few lines on the page
            notes.append(f"{where}: {len(said) - NOTES_PER_FILE} more field(s) of a wrong kind left out")
    return record
