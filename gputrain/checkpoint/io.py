"""Checkpoints as directories `checkpoints/step-<N>/`, complete or absent.

A checkpoint is written under a temporary name, every file fsynced, a `manifest.json` of
SHA-256 checksums added, then the `COMMITTED` marker last, and only then renamed into place.
Reading one back (reader.py) verifies the manifest before any state is used, and uses
`weights_only=True`; this module gives it the verification and the two files' readers.
"""

from __future__ import annotations

import json
import logging
import os
import pickle  # only for its exception type: nothing here unpickles
import re
import shutil
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_model
from torch import nn

from gputrain.checkpoint.matching import (
    CheckpointMismatch,
    Spec,
    canonical_name,
    check_weights,
    kind_of_value,
    tied_groups,
)
from gputrain.checksum import sha256_of
from gputrain.disk_full import removed_if_failed
from gputrain.errors import RunError
from gputrain.run.layout import (
    CHECKPOINT_MANIFEST,
    CHECKPOINT_MARKER,
    CHECKPOINT_STATE,
    CHECKPOINT_WEIGHTS,
    CHECKPOINTS,
    checkpoint_name,
    step_of_name,
)

log = logging.getLogger("gputrain")

DCP_METADATA = ".metadata"


class CorruptCheckpoint(Exception):
    """A checkpoint failed verification; the message says which file and why."""


FileDigest = Mapping[str, Any]
"""What the manifest records of a file: {"sha256": hex digest, "bytes": size}."""


def file_digest(path: Path) -> dict[str, Any]:
    """A file's manifest entry: its SHA-256 and size."""
    return {"sha256": sha256_of(path), "bytes": path.stat().st_size}


def _fsync_file(path: Path) -> None:
    with path.open("rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Make a folder's entries (a rename into it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# Test hook: seconds to sleep between the phases of a save, so the crash-while-saving tests
# (scripts/kill_during_save.py) can kill a process inside any phase. Unset in normal use.
_PHASE_DELAY_S = float(os.environ.get("GPUTRAIN_TEST_SAVE_PHASE_DELAY_S") or 0)


def _phase() -> None:
    if _PHASE_DELAY_S:
        time.sleep(_PHASE_DELAY_S)


def save_checkpoint(root: Path, step: int, model: nn.Module, state: dict[str, Any]) -> Path:
    """Write model weights (safetensors) and training state atomically; return the final path."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{checkpoint_name(step)}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    with removed_if_failed(tmp, f"the checkpoint of step {step}"):
        tmp.mkdir()
        _phase()
        _save_safetensors(model, tmp / CHECKPOINT_WEIGHTS)
        _phase()
        torch.save(state, tmp / CHECKPOINT_STATE)
        _phase()
        return commit_checkpoint_dir(tmp, root / checkpoint_name(step), step)


def commit_checkpoint_dir(
    tmp: Path, final: Path, step: int, fmt: str | None = None, known: Mapping[str, FileDigest] | None = None
) -> Path:
    """Seal a fully written temporary checkpoint directory and move it into place: a manifest of
    every file's size and SHA-256, fsync, the marker last, rename. Shared by the one-process and the
    sharded (fmt="dcp") savers so both keep the same discipline.

    `known`: digests the ranks that wrote the files took (a sharded save: each rank hashes its own
    shards, so rank 0 does not read them all). Each is used only for a file of the recorded size;
    every other file in the directory is hashed here, so the manifest covers all of them."""
    names = sorted(p.name for p in tmp.iterdir() if p.is_file())
    files = {name: _digest_of(tmp / name, (known or {}).get(name)) for name in names}
    manifest: dict[str, Any] = {"step": step, "files": files}
    if fmt is not None:
        manifest["format"] = fmt
    (tmp / CHECKPOINT_MANIFEST).write_text(json.dumps(manifest, indent=1))
    _phase()
    for name in [*names, CHECKPOINT_MANIFEST]:
        _fsync_file(tmp / name)
    _phase()
    # the marker carries the manifest's own checksum, so a damaged manifest is caught too
    (tmp / CHECKPOINT_MARKER).write_text(f"{step} {sha256_of(tmp / CHECKPOINT_MANIFEST)}\n")
    _fsync_file(tmp / CHECKPOINT_MARKER)
    fsync_dir(tmp)
    _phase()
    if final.exists():  # re-saving a step (after a resume): swap, never leave a half state
        trash = final.with_name(f".{final.name}.old-{os.getpid()}")
        final.rename(trash)
        _phase()  # a crash here leaves the old copy in `trash`: find_resumable puts it back
        tmp.rename(final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        tmp.rename(final)
    fsync_dir(final.parent)
    return final


def _digest_of(file: Path, reported: FileDigest | None) -> dict[str, Any]:
    """The file's digest as its writer reported it, where that still matches its size; else hashed now."""
    size = file.stat().st_size
    if reported is not None and reported.get("bytes") == size and isinstance(reported.get("sha256"), str):
        return {"sha256": reported["sha256"], "bytes": size}
    return file_digest(file)


def _save_safetensors(model: nn.Module, path: Path) -> None:
    """safetensors' `save_model` (tied weights saved once), with the mode every other file of the run
    gets: safetensors creates its file 0600, so a colleague who can read a run could not read its
    weights, and a one-process run's weights differed from a sharded run's (final_weights.py: 0644)."""
    save_model(model, str(path))
    os.chmod(path, 0o666 & ~_umask())


def _umask() -> int:
    """The process's umask, read without changing it where Linux says it (os.umask sets as it reads:
    a window in which another thread's new file would get the wrong mode)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def save_weights(model: nn.Module, path: Path) -> None:
    """Write a module's final weights as safetensors via a temporary name, so `path` is never half
    a file (a sharded model's: final_weights.py, byte for byte the same layout)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with removed_if_failed(tmp, f"the weights ({path.name})"):
        _save_safetensors(model, tmp)
        _fsync_file(tmp)
        tmp.replace(path)


def verify_checkpoint(path: Path, share: tuple[int, int] = (0, 1)) -> None:
    """Raise CorruptCheckpoint unless every file the loader will read checks out: the marker names this
    step and the manifest's checksum, and the manifest lists each of those files with its size and
    SHA-256 (model.safetensors and state.pt; for a sharded checkpoint state.pt, .metadata, every shard
    file present and every file .metadata refers to). A manifest naming a path outside the checkpoint,
    a file that is a link leading out of it, and a checkpoint directory that is a link leading out of
    its run directory are refused. Nothing is unpickled (.metadata only through DCP's allow-list).

    `share`: (rank, ranks) when the ranks of a job verify one checkpoint together (checkpoint/by_rank.py):
    every check runs on every rank except the hashing of the large files, each of which only one rank
    reads (see `hashed_by`); the others check that it is there with its recorded size."""
    _check_location(path)
    if not _inside(path / CHECKPOINT_MARKER, path) or not (path / CHECKPOINT_MARKER).is_file():
        raise CorruptCheckpoint(f"{path}: incomplete (no {CHECKPOINT_MARKER} marker)")
    marker = (path / CHECKPOINT_MARKER).read_bytes().split()
    step = step_of_name(path.name)  # None for a checkpoint copied under another name: trust the marker's step then
    if (
        len(marker) != 2
        or not marker[0].isdigit()
        or (marker[0].startswith(b"0") and marker[0] != b"0")
        or (step is not None and int(marker[0]) != step)
    ):
        raise CorruptCheckpoint(f"{path}: the {CHECKPOINT_MARKER} marker is damaged")
    step = int(marker[0])
    if not _inside(path / CHECKPOINT_MANIFEST, path) or not (path / CHECKPOINT_MANIFEST).is_file():
        raise CorruptCheckpoint(f"{path}: {CHECKPOINT_MANIFEST} is missing")
    if sha256_of(path / CHECKPOINT_MANIFEST).encode() != marker[1]:
        raise CorruptCheckpoint(f"{path}: {CHECKPOINT_MANIFEST} does not match its checksum")
    try:
        manifest = json.loads((path / CHECKPOINT_MANIFEST).read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError):
        raise CorruptCheckpoint(f"{path}: {CHECKPOINT_MANIFEST} is unreadable") from None
    if not isinstance(files, dict) or manifest.get("step") != step:
        raise CorruptCheckpoint(f"{path}: {CHECKPOINT_MANIFEST} does not describe this checkpoint")
    for name in files:
        if not _plain_name(name):
            raise CorruptCheckpoint(f"{path}: {CHECKPOINT_MANIFEST} lists {name!r}, a path outside the checkpoint")
    # the loader goes by what the directory holds (.metadata: sharded), so verification does too
    sharded = os.path.lexists(path / DCP_METADATA)
    if not sharded and manifest.get("format") == "dcp" and DCP_METADATA in files:
        raise CorruptCheckpoint(f"{path}: {DCP_METADATA} is missing")
    if sharded != (manifest.get("format") == "dcp"):
        said = f"format {manifest.get('format')!r}" if "format" in manifest else "no format (one-process)"
        held = "a sharded (DCP) checkpoint" if sharded else "a one-process checkpoint"
        raise CorruptCheckpoint(f"{path}: {CHECKPOINT_MANIFEST} says {said} but the directory holds {held}")
    needed = (
        [DCP_METADATA, CHECKPOINT_STATE, *_shard_files(path)] if sharded else [CHECKPOINT_WEIGHTS, CHECKPOINT_STATE]
    )
    listed = list(dict.fromkeys([*needed, *files]))
    rank, ranks = share
    for name in listed:
        if name not in files:
            raise CorruptCheckpoint(f"{path}: {CHECKPOINT_MANIFEST} does not list {name}, which the loader reads")
        # .metadata on every rank: each reads it next, and only once its bytes check out
        mine = ranks == 1 or name == DCP_METADATA or hashed_by(name, listed, ranks) == rank
        _verify_file(path, name, files[name], hash_it=mine)
    if sharded:  # only now, with its bytes verified, is .metadata read (DCP's classes only)
        for name in dcp_referenced_files(path):
            if not _plain_name(name):
                raise CorruptCheckpoint(f"{path}: {DCP_METADATA} refers to {name!r}, a path outside the checkpoint")
            if name not in files:
                raise CorruptCheckpoint(
                    f"{path}: {DCP_METADATA} refers to {name}, which {CHECKPOINT_MANIFEST} does not list"
                )


def _plain_name(name: object) -> bool:
    """A file name directly inside the checkpoint directory: no separator, not `.`/`..`, not absolute."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
        and not os.path.isabs(name)
    )


def _inside(file: Path, root: Path) -> bool:
    """Whether `file`, links followed, lies in `root` (links followed)."""
    try:
        return file.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):  # a link loop
        return False


def _check_location(path: Path) -> None:
    """A checkpoint directory reached through a symbolic link (step-N itself, or the run's
    `checkpoints/` folder) must stay inside its run directory (the parent of `checkpoints/`): one
    leading elsewhere would resume another run's, or anyone's, files."""
    linked = path.is_symlink() or (path.parent.name == CHECKPOINTS and path.parent.is_symlink())
    if linked and not _inside(path, path.absolute().parent.parent):
        raise CorruptCheckpoint(f"{path}: a symbolic link leading out of the run directory (to {path.resolve()})")


def _shard_files(path: Path) -> list[str]:
    """The files of a sharded checkpoint that DCP may read: shards and (per-rank) metadata."""
    return sorted(
        p.name
        for p in path.iterdir()
        if p.name != DCP_METADATA and (p.name.endswith(".distcp") or p.name.endswith(DCP_METADATA))
    )


_DCP_SHARD = re.compile(r"__(\d+)_\d+\.distcp")


def hashed_by(name: str, names: list[str], ranks: int) -> int:
    """Which of `ranks` ranks hashes file `name` of a checkpoint holding `names` when they verify it
    together: a DCP shard `__R_*.distcp` rank R (the rank that wrote it, on the same layout); the
    others (state.pt, a one-process checkpoint's weights, shards of ranks beyond) in turn."""
    writer = _writer_rank(name, ranks)
    if writer is not None:
        return writer
    others = sorted(n for n in names if n != DCP_METADATA and _writer_rank(n, ranks) is None)
    return others.index(name) % ranks if name in others else 0


def _writer_rank(name: str, ranks: int) -> int | None:
    """R for a DCP shard `__R_<i>.distcp` when R is one of `ranks`, else None."""
    shard = _DCP_SHARD.fullmatch(name)
    return int(shard.group(1)) if shard is not None and int(shard.group(1)) < ranks else None


def _verify_file(path: Path, name: str, expected: Any, hash_it: bool = True) -> None:
    file = path / name
    if not _inside(file, path):
        raise CorruptCheckpoint(f"{path}: {name} is a symbolic link leading out of the checkpoint")
    if not file.is_file():
        raise CorruptCheckpoint(f"{path}: {name} is missing")
    expected = expected if isinstance(expected, dict) else {}
    if file.stat().st_size != expected.get("bytes") or (hash_it and sha256_of(file) != expected.get("sha256")):
        raise CorruptCheckpoint(f"{path}: {name} does not match its checksum")


def dcp_referenced_files(path: Path) -> list[str]:
    """The files a sharded checkpoint's .metadata says hold its items (read through DCP's allow-list)."""
    from gputrain.checkpoint.safe_dcp import UnreadableMetadata, UnsafeCheckpointContent, read_metadata

    try:
        metadata = read_metadata(path / DCP_METADATA)
    except UnreadableMetadata as err:
        raise CorruptCheckpoint(f"{path}: {err}") from None
    except UnsafeCheckpointContent as err:
        raise CorruptCheckpoint(f"{path}: {err}; refused to load it (it could run code)") from None
    storage = metadata.storage_data if isinstance(metadata.storage_data, dict) else {}
    names = {getattr(info, "relative_path", None) for info in storage.values()}
    return sorted(str(name) for name in names)


def checkpoint_step(path: Path) -> int | None:
    """The step the checkpoint's marker names (None where it cannot be read)."""
    try:
        first = (path / CHECKPOINT_MARKER).read_bytes().split()[0]
    except (OSError, IndexError):
        return None
    return int(first) if first.isdigit() else None


def read_state(path: Path) -> dict[str, Any]:
    """state.pt, read with weights_only=True (tensors and plain values only).

    Raises:
        CorruptCheckpoint: the file is not a torch file, or holds other objects (it could run code).
        CheckpointMismatch: it holds something other than a training state.
    """
    try:
        state = torch.load(path / CHECKPOINT_STATE, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise CorruptCheckpoint(
            f"{path}: {CHECKPOINT_STATE} holds objects other than tensors and plain values; "
            "refused to load it (it could run code)"
        ) from None
    except Exception as err:  # noqa: BLE001 - a malformed archive fails in many ways inside torch's reader
        raise CorruptCheckpoint(
            f"{path}: {CHECKPOINT_STATE} is not a readable torch file ({_first_line(err)})"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        raise CheckpointMismatch(path, f"{CHECKPOINT_STATE} holds {kind_of_value(state)}, not a training state")
    return state


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """model.safetensors, every tensor in host memory."""
    try:
        return load_file(str(path / CHECKPOINT_WEIGHTS))
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise CorruptCheckpoint(
            f"{path}: {CHECKPOINT_WEIGHTS} is not a valid safetensors file ({_first_line(err)})"
        ) from None


def model_weights(path: Path, weights: Mapping[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """`weights` keyed as `model.state_dict()` is, once checked to be that state dict's names, shapes and
    dtypes (names compared without wrapper segments such as torch.compile's `_orig_mod.`).

    Raises:
        CheckpointMismatch: they are not.
    """
    own = {canonical_name(name): name for name in model.state_dict(keep_vars=True)}
    expected = {canonical_name(name): Spec.of(t) for name, t in model.state_dict(keep_vars=True).items()}
    saved = {canonical_name(name): t for name, t in weights.items()}
    check_weights(
        path, CHECKPOINT_WEIGHTS, {n: Spec.of(t) for n, t in saved.items()}, expected, tied_groups(model, True)
    )
    return {own[name]: t for name, t in saved.items()}


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__


def list_checkpoints(root: Path) -> list[Path]:
    """Committed-looking checkpoint directories, newest first (not yet verified)."""
    if not root.is_dir():
        return []
    found = [(s, p) for p in root.iterdir() if p.is_dir() and (s := step_of_name(p.name)) is not None]
    return [p for _, p in sorted(found, reverse=True)]


def _leftovers(root: Path) -> list[Path]:
    """Temporaries of saves that never finished (`.step-N.tmp-PID`) and old copies of re-saved
    steps (`.step-N.old-PID`), from processes other than this one."""
    if not root.is_dir():
        return []
    return [
        p
        for p in root.iterdir()
        if p.is_dir()
        and p.name.startswith(".step-")
        and (".tmp-" in p.name or ".old-" in p.name)
        and not p.name.endswith(f"-{os.getpid()}")
    ]


def _restore_interrupted_swaps(root: Path) -> None:
    """A crash between the two renames of a re-save leaves step-N absent and its complete old copy
    under `.step-N.old-PID`: put it back."""
    for old in _leftovers(root):
        name = old.name[1:].partition(".old-")
        if name[1] and not (root / name[0]).exists():
            old.rename(root / name[0])


def resume_candidates(root: Path) -> list[Path]:
    """The checkpoints to try, newest first, once an interrupted re-save's old copy is put back."""
    _restore_interrupted_swaps(root)
    return list_checkpoints(root)


def find_resumable(root: Path) -> Path | None:
    """The newest checkpoint that verifies. Damaged ones are skipped with a warning naming them;
    if checkpoints exist but none verifies, stop rather than silently restart from step 0."""
    return first_verified(resume_candidates(root), verify_checkpoint)


def scan_verified(
    candidates: list[Path], verify: Callable[[Path], None]
) -> tuple[Path | None, list[tuple[Path, CorruptCheckpoint]]]:
    """The first of `candidates` that `verify` passes (None where none does), and the damaged ones
    passed over on the way, each with why."""
    damaged: list[tuple[Path, CorruptCheckpoint]] = []
    for path in candidates:
        try:
            verify(path)
            return path, damaged
        except CorruptCheckpoint as err:
            damaged.append((path, err))
    return None, damaged


def first_verified(candidates: list[Path], verify: Callable[[Path], None]) -> Path | None:
    """The first of `candidates` that `verify` passes (damaged ones skipped with a warning naming
    them); None where there are none.

    Raises:
        RunError: checkpoints exist but none verifies: stop rather than restart from step 0.
    """
    found, damaged = scan_verified(candidates, verify)
    for _, err in damaged:
        log.warning("skipping damaged checkpoint: %s", err)
    if found is None and candidates:
        listed = "; ".join(str(err) for _, err in damaged)
        raise RunError(f"no valid checkpoint to resume from: {listed} (use checkpoint.resume=never to start over)")
    return found


def rotate_checkpoints(root: Path, keep_last: int, keep: Collection[int] = frozenset()) -> None:
    """Delete all but the newest `keep_last` checkpoints, sparing the steps in `keep` (the best)."""
    for path in list_checkpoints(root)[keep_last:]:
        if step_of_name(path.name) not in keep:
            shutil.rmtree(path, ignore_errors=True)
    for path in _leftovers(root):  # debris of a process that was killed while saving
        shutil.rmtree(path, ignore_errors=True)
