"""The run directory: where it is, how it is named to the user, and the small files written into
it. Its fixed entries (checkpoints/, summary.json, ...) are checked for their kind, and for links
leading out of it, before anything heavy (`check_run_dir`). Which run it holds, and whether a config
may continue that run: prior.py; what each file is called: layout.py.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import secrets
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Protocol

from gputrain.config import Config, config_to_toml
from gputrain.config.paths import kind_of
from gputrain.disk_full import removed_if_failed
from gputrain.errors import UsageError
from gputrain.run.fs_errors import FEW_INODES, check_inodes, reason
from gputrain.run.layout import CHECKPOINT_MARKER, CONFIG, ENV, RUN_DIRS, RUN_FILE_PATTERNS, RUN_FILES
from gputrain.run.probe import check_takes_files

# ----------------------------------------------------------------- how a run directory is named to the user

_COMMAND_LINE: ContextVar[bool] = ContextVar("gputrain_command_line", default=False)


@contextlib.contextmanager
def command_line_words() -> Iterator[None]:
    """Within it, messages about the run directory speak the command line's language (`--run-dir`,
    `gputrain train ...`); outside it, Python's (`run_dir=`), as a Trainer built in Python is told."""
    token = _COMMAND_LINE.set(True)
    try:
        yield
    finally:
        _COMMAND_LINE.reset(token)


def run_dir_option() -> str:
    """How the user named the run directory: `--run-dir` on the command line, `run_dir` in Python."""
    return "--run-dir" if _COMMAND_LINE.get() else "run_dir"


def continue_advice(run_dir: Path) -> str:
    """How to continue the run in `run_dir` with its own config."""
    if _COMMAND_LINE.get():
        return f"leave out --config and the overrides to continue it with its own {run_dir / CONFIG}"
    return f"pass config={str(run_dir / CONFIG)!r} to continue it with its own config"


# ----------------------------------------------------------------- files


def default_run_dir(model_name: str, data_name: str) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{model_name}-{data_name}-{stamp}"


def run_dir_path(value: str | Path) -> Path:
    """The run directory the user gave. An empty string would be the current directory (Path("") is
    "."): never what was meant, so it is refused; `.` itself is taken as asked.

    Raises:
        UsageError: naming the option.
    """
    if isinstance(value, str) and not value.strip():
        raise UsageError(f"{run_dir_option()} {value!r}: empty; give the directory for the run's files")
    return Path(value)


def write_text(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a reader never sees half a file."""
    write_bytes(path, text.encode())


def write_bytes(path: Path, data: bytes) -> None:
    """`write_text` for bytes."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(8)}")  # not guessable (output.atomic)
    with removed_if_failed(tmp, path.name):  # a full disk: no empty temporary left, and said as such
        tmp.write_bytes(data)
        tmp.replace(path)


def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, default=str) + "\n")


class Started(Protocol):
    """A run's placement as env.json records it (train/build.py's Placement). A protocol, not that
    class: the run directory sits below the training loop, which imports it."""

    def start_facts(self) -> dict[str, Any]:
        """Device, precision, world size and layout as the start resolved them."""
        ...


def write_run_files(
    run_dir: Path,
    config: Config,
    place: Started | None = None,
    kind: str = "train",
    note: str | None = None,
    tokenizer: dict[str, Any] | None = None,
) -> None:
    """The files a run directory holds from its start: the resolved config (loadable with
    --config; `note`, what the run used beyond it, as comment lines at its head) and the doctor's
    facts about this machine, with the run's `kind` (the loop that trains it: prior.py's KINDS) and
    `place`'s `start_facts` as "run", and what run/tokenizer.py records of the run's tokenizer."""
    from gputrain.env import collect_env  # the doctor's modules: only needed once a run starts

    run_dir.mkdir(parents=True, exist_ok=True)
    head = "".join(f"# {line}\n" for line in note.splitlines()) if note else ""
    write_text(run_dir / CONFIG, head + config_to_toml(config))
    facts = collect_env().to_dict()
    facts["run"] = {"kind": kind, **(place.start_facts() if place is not None else {})}
    if tokenizer is not None:
        facts["tokenizer"] = tokenizer
    write_json(run_dir / ENV, facts)


# ----------------------------------------------------------------- the directory and its entries (names: layout.py)


def check_run_dir(run_dir: Path, keep: bool = False) -> None:
    """Make sure the run directory can be created and takes files, and that what it already holds
    under a run's names is of the right kind and stays inside it, before anything heavy is built.
    Unless `keep`, directories made for the check are removed again, so bad input found later
    leaves no trace; not with several ranks, whose checks would remove each other's directory.
    Raises UsageError naming it."""
    option = run_dir_option()
    check_not_inside_a_run(run_dir)
    alone = int(os.environ.get("WORLD_SIZE", "1")) <= 1
    made: list[Path] = []
    try:
        if not keep and alone:
            made = [p for p in (run_dir, *run_dir.parents) if not p.exists()]
        run_dir.mkdir(parents=True, exist_ok=True)
        check_takes_files(run_dir)  # leaves nothing behind, however the process ends
        check_run_entries(run_dir)
        check_inodes(run_dir, f"{option} {run_dir}", FEW_INODES)
    except OSError as err:  # a name too long, a file as a parent, a read-only or virtual file system
        why = reason(err, run_dir) or err.strerror or str(err)
        raise UsageError(f"{option} {run_dir}: cannot be created or written ({why})") from None
    finally:
        for path in made:  # deepest first
            with contextlib.suppress(OSError):
                path.rmdir()


@contextlib.contextmanager
def left_as_found(run_dir: Path) -> Iterator[None]:
    """Within it, a failure leaves the directories it made for `run_dir` (and its missing parents)
    removed again, where they are still empty: bad input found while a run is built (a split the
    evaluation cannot take, a state too large) leaves no trace. Never removes a file or a directory
    that held anything; another rank's removal or entry is no error."""
    made = [p for p in (run_dir, *run_dir.parents) if not _exists(p)]
    try:
        yield
    except BaseException:
        for path in made:  # deepest first
            with contextlib.suppress(OSError):
                path.rmdir()
        raise


def _exists(path: Path) -> bool:
    """Whether `path` exists; a name the system refuses (too long, a file as a parent) is never made."""
    try:
        return path.exists()
    except OSError:
        return True


def check_not_inside_a_run(run_dir: Path) -> None:
    """A run's directory is not one of another run's own folders (its checkpoints, one checkpoint,
    its TensorBoard logs) nor a checkpoint: the second run would write over the first's files, its
    final weights over a checkpoint's model.safetensors.

    Raises:
        UsageError: naming the run (or checkpoint) the directory belongs to.
    """
    option = run_dir_option()
    try:
        resolved = run_dir.resolve()
    except RuntimeError as err:  # a loop of links (Python before 3.13; later ones raise OSError ELOOP)
        raise UsageError(f"{option} {run_dir}: {reason(err, run_dir) or err}") from None
    except OSError as err:
        why = reason(err, run_dir)
        if why is None:
            return  # the directory's own check says what it is
        raise UsageError(f"{option} {run_dir}: {why}") from None
    try:
        is_checkpoint = (resolved / CHECKPOINT_MARKER).is_file()  # written last
    except OSError:  # a name too long: the directory's own check says so
        return
    if is_checkpoint:
        raise UsageError(
            f"{option} {run_dir}: is a checkpoint (it holds COMMITTED); a run writes in a directory of its own"
        )
    for parent in resolved.parents:
        entry = resolved.relative_to(parent).parts[0]
        if entry in RUN_DIRS and (parent / CONFIG).is_file():
            raise UsageError(
                f"{option} {run_dir}: is inside the run directory {parent} (its {entry}/); a run writes in a "
                f"directory of its own: choose one outside {parent / entry}"
            )


def check_not_in_data(run_dir: Path, data_paths: Iterable[str | None]) -> None:
    """A run's directory is not a data folder it reads, nor inside one: its files there would be
    read as data by the next run (an image folder takes `checkpoints/` for a class).

    Raises:
        UsageError: naming the data path.
    """
    resolved = run_dir.resolve()
    for given in filter(None, data_paths):
        data = Path(given).expanduser().resolve()
        try:
            folder = data.is_dir()
        except OSError:  # a name too long: the data's own check says so
            continue
        if folder and (resolved == data or data in resolved.parents):
            raise UsageError(
                f"{run_dir_option()} {run_dir}: is inside the data folder {given} this run reads; its files "
                "there would be read as data by the next run: choose a directory outside it"
            )


def _run_entries(run_dir: Path) -> Iterable[tuple[str, bool]]:
    """(name, is a directory) of each entry a run writes that `run_dir` holds already."""
    for name in RUN_DIRS:
        yield name, True
    for name in RUN_FILES:
        yield name, False
    for pattern in RUN_FILE_PATTERNS:
        for path in sorted(run_dir.glob(pattern)):
            yield path.name, False


def check_run_entries(run_dir: Path) -> None:
    """Each entry of `run_dir` that a run writes is what the run writes there: a directory it can
    write into, or a regular file, not a link leading out of the run directory (the run would write,
    rotate or resume elsewhere), nor a FIFO (opening it would block) or a device.

    Raises:
        UsageError: naming the entry and what it is.
    """
    option, root = run_dir_option(), run_dir.resolve()
    for name, is_dir in _run_entries(run_dir):
        path = run_dir / name
        if not os.path.lexists(path):
            continue
        where = f"{option} {run_dir}: {name}"
        if path.is_symlink():
            try:
                target = path.resolve()
            except RuntimeError:  # a loop of links
                raise UsageError(f"{where} is a loop of symbolic links; remove it") from None
            if not target.is_relative_to(root):
                raise UsageError(
                    f"{where} is a symbolic link leading out of the run directory (to {target}); the run "
                    f"writes only inside its directory: remove the link, or choose another {option}"
                )
        kind = kind_of(path)
        if kind is None:  # a link to nothing (inside the directory)
            if is_dir:
                raise UsageError(f"{where} is a symbolic link to nothing; remove it")
            continue  # a file is replaced, not written through
        want = "a directory" if is_dir else "a regular file"
        if kind != want:
            raise UsageError(
                f"{where} is {kind}, where the run keeps {want}; remove or rename it, or choose another {option}"
            )
        if is_dir and not os.access(path, os.W_OK | os.X_OK):
            raise UsageError(f"{where}/ cannot be written (permission denied); choose another {option}")
