"""Where a command's outputs go: one check for every output path of every command (`-o`, `--output-dir`,
export folders, `lr_find.json`, reports), run before any work, and one atomic writer.

`train`'s rules for its run directory (run/files.py) hold for every other output too. An output is
refused, in one line naming the option, the path and what would be right (UsageError, exit 2), where
it is:

- one of the command's own inputs (the same file by device and inode, so a hard link too), or inside
  an input folder;
- inside a directory that holds a run (`holds_a_run`: a run, a sweep, an export or a checkpoint),
  unless that is the command's own run and the path one the command designates there
  (`Owner.designated`: evaluate's eval-*.json, report.html, export/FORMAT, ...) or a name no run
  writes; so never a run's config.toml, weights, checkpoints or another run's anything;
- a file gputrain did not write: an existing file is replaced only where the command's recognizer
  (`ours`) knows it as its own earlier output; a folder is written into only when new, empty, or ours;
- a symbolic link (the path's last component), or, for a path inside the command's own run, any link
  leading out of that run directory;
- a directory where a file is wanted, a FIFO (opening it would block), a socket or a device: only
  `-` means standard output, where the command writes a single file and allows it.

Writes go to a temporary file beside the target and are renamed over it (`atomic`): a failure never
leaves half a file, nor removes the one that was there.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import secrets
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gputrain.disk_full import removed_if_failed
from gputrain.errors import UsageError
from gputrain.run.fs_errors import reason
from gputrain.run.layout import (
    BENCH_INFER,
    CHECKPOINT_GLOB,
    CHECKPOINTS,
    CONFIG,
    ENV,
    EXPORT,
    EXPORT_RECORD,
    LR_FIND,
    METRICS,
    REPORT,
    RUN_DIRS,
    RUN_FILE_PATTERNS,
    RUN_FILES,
    SUMMARY,
    TUNE,
    eval_record_name,
    is_checkpoint_dir,
)
from gputrain.run.probe import check_takes_files

STDOUT = "-"
"""The output path that means standard output (`-o -`)."""
MARKER = "written_by"
"""The field a JSON output of gputrain carries: "gputrain <command>" (`marked`)."""
RUN_NAMES = (*RUN_FILES, *RUN_DIRS, *RUN_FILE_PATTERNS, LR_FIND, REPORT, BENCH_INFER, EXPORT, eval_record_name("*"))
"""Every name a run directory's own entries have (run/layout.py): no other command's output takes one
of these inside a run, but where it designates it."""
_RECOGNIZE_BYTES = 16 << 20
"""A file larger than this is not read to be recognized: none of gputrain's small records is."""

Recognizer = Callable[[Path], bool]
"""Whether an existing file (or folder) at a path is the command's own earlier output."""


@dataclass(frozen=True, slots=True)
class Owner:
    """What a command reads and owns: the context an output path is judged in."""

    runs: tuple[Path, ...] = ()
    """The command's own run directories: written into only at `designated` paths (and new names)."""
    designated: tuple[str, ...] = ()
    """Patterns (fnmatch, `/`-separated, relative to an own run) of the outputs the command keeps there."""
    inputs: tuple[Path, ...] = ()
    """Files and folders the command reads: never written over or into."""

    @staticmethod
    def of(
        runs: Iterable[str | Path] = (), designated: Iterable[str] = (), inputs: Iterable[str | Path | None] = ()
    ) -> Owner:
        return Owner(tuple(map(Path, runs)), tuple(designated), tuple(Path(p) for p in inputs if p))


# ----------------------------------------------------------------- what a directory holds


def holds_a_run(folder: Path) -> bool:
    """Whether `folder` holds a run's files: a training or RL run (its config beside its machine
    facts, a summary, metrics or checkpoints), an LR sweep (lr_find.json), a tune (tune.json), an export
    (export.json) or a checkpoint. A folder that merely holds a config.toml (a project's) is not a run."""
    try:
        if is_checkpoint_dir(folder) or any(
            os.path.lexists(folder / name) for name in (SUMMARY, METRICS, LR_FIND, TUNE, EXPORT_RECORD)
        ):
            return True
        if os.path.lexists(folder / CONFIG) and os.path.lexists(folder / ENV):
            return True
        return any((folder / CHECKPOINTS).glob(CHECKPOINT_GLOB))
    except OSError:  # unreadable, or a name too long: it holds nothing we can see
        return False


def is_rl_run(folder: Path) -> bool:
    """A `gputrain rl` run: its summary has an "rl" block, or (still going) its metrics count
    environment steps (as report/rundir.py tells it)."""
    summary = read_json(folder / SUMMARY)
    if isinstance(summary, dict) and isinstance(summary.get("rl"), dict):
        return True
    try:
        with (folder / METRICS).open("rb") as f:
            first = f.readline(1 << 16)
        row = json.loads(first)
    except (OSError, ValueError):
        return False
    return isinstance(row, dict) and "env_steps" in row


def read_json(path: Path) -> Any:
    """The JSON a small regular file holds, or None (missing, not a regular file, too big, not JSON)."""
    try:
        if not stat.S_ISREG(path.lstat().st_mode) or path.stat().st_size > _RECOGNIZE_BYTES:
            return None
        return json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None


def head(path: Path, size: int = 4096) -> bytes:
    """The first `size` bytes of a regular file (b"" for anything else: a FIFO is never opened, it would block)."""
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            return b""
        with path.open("rb") as f:
            return f.read(size)
    except OSError:
        return b""


# ----------------------------------------------------------------- recognizers of gputrain's own files


def marked(command: str) -> dict[str, str]:
    """The marker field a JSON output of `command` carries, so a later run knows the file as its own."""
    return {MARKER: f"gputrain {command}"}


def json_record(command: str, *keys: str) -> Recognizer:
    """A JSON object written by `command`: its marker, or (written before the marker was) all `keys`."""

    def ours(path: Path) -> bool:
        data = read_json(path)
        if not isinstance(data, dict):
            return False
        return data.get(MARKER) == marked(command)[MARKER] or (bool(keys) and all(k in data for k in keys))

    return ours


def never(path: Path) -> bool:
    """For an output no existing file may be replaced by."""
    return False


def shared(path: Path) -> bool:
    """For an output folder the command adds its files to, beside the user's (each file checked itself)."""
    return True


# ----------------------------------------------------------------- the checks


def check_output_file(
    given: str | Path, option: str, owner: Owner, ours: Recognizer, *, stdout: bool = False, example: str = ""
) -> Path | None:
    """The file `given` (named by `option`) judged as an output (module docstring), before any work.
    `example`: a file name to suggest where `given` is a folder.

    Returns:
        The path to write, or None where `stdout` is allowed and `given` is `-`.

    Raises:
        UsageError: one line naming the option, the path and what would be right.
    """
    text = str(given)
    where = f"{option} {text}"
    if text == STDOUT:
        if stdout:
            return None
        raise UsageError(f"{where}: this command writes files, not standard output; give a path")
    if not text.strip():
        raise UsageError(f"{where}: empty; give a file to write")
    path = Path(text)
    instead = " (or - for standard output)" if stdout else ""
    _no_link(path, where, instead)
    kind = _kind(path, where)
    if kind == "a directory":
        raise UsageError(f"{where}: is a directory; give a file name such as {path / (example or 'out.txt')}")
    if kind is not None and kind != "a regular file":
        raise UsageError(f"{where}: is {kind}; give a regular file to write{instead}")
    _check_parent(path.parent, where)
    _not_an_input(path, where, owner)
    _not_in_a_run(path, where, owner, is_dir=False)
    if kind is not None and not ours(path):
        raise UsageError(
            f"{where}: holds a file gputrain did not write; it is never replaced: remove it, or choose another path"
        )
    return path


def check_output_folder(given: str | Path, option: str, owner: Owner, ours: Recognizer) -> Path:
    """The folder `given` judged as an output folder (module docstring): new, empty, or one `ours`
    knows as the command's own (an export's, a run's); checked before any work, created at writing.

    Raises:
        UsageError: one line naming the option, the path and what would be right.
    """
    text = str(given)
    where = f"{option} {text}"
    if not text.strip() or text == STDOUT:
        raise UsageError(f"{where}: give a folder to write into")
    path = Path(text)
    _no_link(path, where, "")
    kind = _kind(path, where)
    if kind is not None and kind != "a directory":
        raise UsageError(f"{where}: is {kind}, not a folder; give a folder to write into")
    _check_parent(path.parent, where)
    _not_an_input(path, where, owner)
    entries = _entries(path, where) if kind is not None else []
    mine = bool(entries) and ours(path)
    if entries and not mine:
        raise UsageError(
            f"{where}: holds files gputrain did not write there ({', '.join(entries[:3])}); choose an empty or "
            "new folder"
        )
    _not_in_a_run(path, where, owner, is_dir=True, itself=not mine)
    return path


def make_folder(path: Path, option: str) -> Path:
    """Create the output folder `path` (checked by `check_output_folder`) where missing.

    Raises:
        UsageError: it cannot be created (naming `option`).
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"{option} {path}: cannot be created ({err.strerror or err})") from None
    return path


def _no_link(path: Path, where: str, instead: str) -> None:
    try:
        link = stat.S_ISLNK(path.lstat().st_mode)
    except OSError:  # missing, or a name too long: `_kind` says so
        return
    if link:
        raise UsageError(
            f"{where}: is a symbolic link (to {os.readlink(path)}); outputs are never written through a link: "
            f"give the file's own path{instead}"
        )


def _kind(path: Path, where: str) -> str | None:
    """What `path` is (None where it does not exist), its name too long or a parent a file said as such."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return None
    except OSError as err:  # a name over the system's limit, a file as a parent, no permission
        raise UsageError(f"{where}: cannot be written there ({err.strerror or err})") from None
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _check_parent(parent: Path, where: str) -> None:
    """The nearest existing folder above is a folder that takes files (the rest is created at writing)."""
    existing = parent
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    try:
        resolved = existing.resolve()
    except (OSError, RuntimeError) as err:  # a loop of links
        raise UsageError(f"{where}: its folder cannot be reached ({reason(err, existing) or err})") from None
    if not resolved.is_dir():
        raise UsageError(f"{where}: {existing} is not a folder; give a path in a folder")
    try:  # as train's check_run_dir: a virtual or read-only file system, no permission, said before any work
        check_takes_files(resolved)
    except OSError as err:
        why = reason(err, existing)
        if why is not None:  # read-only, out of inodes or space, no permission: said as such
            raise UsageError(f"{where}: {existing} cannot be written ({why})") from None
        raise UsageError(
            f"{where}: {existing} cannot be written ({err.strerror or err}); choose another path"
        ) from None


def _entries(folder: Path, where: str) -> list[str]:
    try:
        return sorted(p.name for p in folder.iterdir())
    except OSError as err:
        raise UsageError(f"{where}: cannot be read ({err.strerror or err})") from None


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return Path(os.path.abspath(path))


def _not_an_input(path: Path, where: str, owner: Owner) -> None:
    """Not one of the command's inputs (the same file, a hard link too), nor inside an input folder."""
    target = _resolved(path)
    try:
        mine = path.stat()
    except OSError:
        mine = None
    for given in owner.inputs:
        source = _resolved(given)
        try:
            theirs = given.stat()
        except OSError:
            continue
        same = mine is not None and (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)
        if same or target == source:
            raise UsageError(f"{where}: is {given}, which this command reads; write the output to another path")
        if stat.S_ISDIR(theirs.st_mode) and source in target.parents:
            raise UsageError(
                f"{where}: is inside {given}, which this command reads; write the output outside that folder"
            )


def _not_in_a_run(path: Path, where: str, owner: Owner, *, is_dir: bool, itself: bool = True) -> None:
    """Not inside a directory that holds a run, but at a designated place of the command's own run;
    and, under an own run, not through a link leading out of it."""
    target = _resolved(path)
    absolute = Path(os.path.abspath(path))
    runs = {_resolved(r): Path(os.path.abspath(r)) for r in owner.runs}
    for real, named in runs.items():
        if absolute.is_relative_to(named) and not target.is_relative_to(real):
            raise UsageError(
                f"{where}: leads out of the run directory {named} through a symbolic link (to {target}); "
                "remove the link, or give a path outside the run"
            )
    start = target if is_dir and itself else target.parent
    for folder in (start, *start.parents):
        if not holds_a_run(folder):
            continue
        if folder in runs:
            relative = target.relative_to(folder).as_posix()
            if _designated(relative, owner.designated):
                return
            if relative != "." and not _run_name(relative.split("/")[0]):
                return  # a name of the user's own beside the run's entries (a file, or a folder of theirs)
            raise UsageError(
                f"{where}: is {'the run directory' if relative == '.' else relative + ' of the run'} {folder}, "
                "which this command never writes over; give a path outside the run directory"
            )
        raise UsageError(
            f"{where}: is inside {folder}, which holds another run's files (a run, an LR sweep, an export or a "
            "checkpoint); give a path outside it"
        )


def _designated(relative: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(relative, pattern) for pattern in patterns)


def _run_name(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in RUN_NAMES)


# ----------------------------------------------------------------- the writer


@contextlib.contextmanager
def atomic(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` (its suffix kept: savers that add one see it) to write to; on
    leaving, it is renamed over `path`; on an error, removed, and `path` is as it was. Its name
    carries a random part: a link planted under a name one could guess (the process id alone) in a
    folder others write would be written through."""
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}-{secrets.token_hex(8)}{path.suffix}")
    with removed_if_failed(tmp, path.name):  # a full disk: no temporary left, and said as such
        yield tmp
        tmp.replace(path)
