"""Checkpoints as directories `checkpoints/step-<N>/`, complete or absent.

A checkpoint is written under a temporary name, every file fsynced, a `manifest.json` of
SHA-256 checksums added, then the `COMMITTED` marker last, and only then renamed into place.
Loading verifies the manifest before any state is used, and uses `weights_only=True`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle  # only for its exception type: nothing here unpickles
import shutil
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_file, save_model
from torch import nn

from gputrain.errors import RunError

log = logging.getLogger("gputrain")

MARKER = "COMMITTED"
MANIFEST = "manifest.json"
MODEL_FILE = "model.safetensors"
STATE_FILE = "state.pt"


class CorruptCheckpoint(Exception):
    """A checkpoint failed verification; the message says which file and why."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_file(path: Path) -> None:
    with path.open("rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
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


def step_dir_name(step: int) -> str:
    return f"step-{step}"


def save_checkpoint(root: Path, step: int, model: nn.Module, state: dict[str, Any]) -> Path:
    """Write model weights (safetensors) and training state atomically; return the final path."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{step_dir_name(step)}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    _phase()
    save_model(model, str(tmp / MODEL_FILE))
    _phase()
    torch.save(state, tmp / STATE_FILE)
    _phase()
    return commit_checkpoint_dir(tmp, root / step_dir_name(step), step)


def commit_checkpoint_dir(tmp: Path, final: Path, step: int, fmt: str | None = None) -> Path:
    """Seal a fully written temporary checkpoint directory and move it into place: a manifest of
    every file's size and SHA-256, fsync, the marker last, rename. Shared by the one-process and the
    sharded (fmt="dcp") savers so both keep the same discipline."""
    names = sorted(p.name for p in tmp.iterdir() if p.is_file())
    files = {name: {"sha256": _sha256(tmp / name), "bytes": (tmp / name).stat().st_size} for name in names}
    manifest: dict[str, Any] = {"step": step, "files": files}
    if fmt is not None:
        manifest["format"] = fmt
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    _phase()
    for name in [*names, MANIFEST]:
        _fsync_file(tmp / name)
    _phase()
    # the marker carries the manifest's own checksum, so a damaged manifest is caught too
    (tmp / MARKER).write_text(f"{step} {_sha256(tmp / MANIFEST)}\n")
    _fsync_file(tmp / MARKER)
    _fsync_dir(tmp)
    _phase()
    if final.exists():  # re-saving a step (after a resume): swap, never leave a half state
        trash = final.with_name(f".{final.name}.old-{os.getpid()}")
        final.rename(trash)
        _phase()  # a crash here leaves the old copy in `trash`: find_resumable puts it back
        tmp.rename(final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        tmp.rename(final)
    _fsync_dir(final.parent)
    return final


def save_weights(model: nn.Module | dict[str, torch.Tensor], path: Path) -> None:
    """Write final weights (a module, or a gathered state dict) as safetensors via a temporary
    name, so `path` is never half a file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    if isinstance(model, nn.Module):
        save_model(model, str(tmp))  # handles tied weights (one copy saved)
    else:
        save_file(model, str(tmp))
    _fsync_file(tmp)
    tmp.replace(path)


def verify_checkpoint(path: Path) -> None:
    """Raise CorruptCheckpoint unless every byte checks out: the marker names this step and the
    manifest's checksum, and the manifest lists each file's size and SHA-256. Nothing is unpickled."""
    if not (path / MARKER).is_file():
        raise CorruptCheckpoint(f"{path}: incomplete (no {MARKER} marker)")
    marker = (path / MARKER).read_bytes().split()
    step = _step_of(path)  # None for a checkpoint copied under another name: trust the marker's step then
    if (
        len(marker) != 2
        or not marker[0].isdigit()
        or (marker[0].startswith(b"0") and marker[0] != b"0")
        or (step is not None and int(marker[0]) != step)
    ):
        raise CorruptCheckpoint(f"{path}: the {MARKER} marker is damaged")
    step = int(marker[0])
    if not (path / MANIFEST).is_file():
        raise CorruptCheckpoint(f"{path}: {MANIFEST} is missing")
    if _sha256(path / MANIFEST).encode() != marker[1]:
        raise CorruptCheckpoint(f"{path}: {MANIFEST} does not match its checksum")
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError):
        raise CorruptCheckpoint(f"{path}: {MANIFEST} is unreadable") from None
    if not isinstance(files, dict) or manifest.get("step") != step:
        raise CorruptCheckpoint(f"{path}: {MANIFEST} does not describe this checkpoint")
    # a sharded (DCP) checkpoint lists its own shard files; a one-process one has exactly these two
    for name in files if manifest.get("format") == "dcp" else (MODEL_FILE, STATE_FILE):
        file = path / name
        if name not in files or not file.is_file():
            raise CorruptCheckpoint(f"{path}: {name} is missing")
        expected = files[name] if isinstance(files[name], dict) else {}
        if file.stat().st_size != expected.get("bytes") or _sha256(file) != expected.get("sha256"):
            raise CorruptCheckpoint(f"{path}: {name} does not match its checksum")


def load_checkpoint(path: Path, model: nn.Module, *, verified: bool = False) -> dict[str, Any]:
    """Verify, then read the training state and load the weights into `model`.

    Nothing in a checkpoint can run code: weights are safetensors (raw tensors and a JSON header)
    and the state is read with `weights_only=True`, which refuses any pickled object other than
    tensors and plain containers. The state is read before the weights so a refused file leaves
    the model untouched.

    Raises:
        CorruptCheckpoint: a damaged or hostile file, naming it.
        RunError: the weights do not fit this model.
    """
    if not verified:  # find_resumable has already checked every byte; hashing twice doubles resume I/O
        verify_checkpoint(path)
    try:
        state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise CorruptCheckpoint(
            f"{path}: {STATE_FILE} holds objects other than tensors and plain values; "
            "refused to load it (it could run code)"
        ) from None
    except (RuntimeError, OSError, EOFError, ValueError) as err:
        raise CorruptCheckpoint(f"{path}: {STATE_FILE} is not a readable torch file ({_first_line(err)})") from None
    if not isinstance(state, dict):
        raise CorruptCheckpoint(f"{path}: {STATE_FILE} does not hold a training state")
    try:
        missing, unexpected = load_model(model, str(path / MODEL_FILE), strict=False)
    except (SafetensorError, OSError, ValueError) as err:
        raise CorruptCheckpoint(f"{path}: {MODEL_FILE} is not a valid safetensors file ({_first_line(err)})") from None
    if missing or unexpected:
        raise RunError(
            f"checkpoint {path} does not fit this model: missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}"
        )
    return state


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__


def _step_of(path: Path) -> int | None:
    name = path.name
    if not name.startswith("step-") or not name[5:].isdigit():
        return None
    return int(name[5:])


def list_checkpoints(root: Path) -> list[Path]:
    """Committed-looking checkpoint directories, newest first (not yet verified)."""
    if not root.is_dir():
        return []
    found = [(s, p) for p in root.iterdir() if p.is_dir() and (s := _step_of(p)) is not None]
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


def find_resumable(root: Path) -> Path | None:
    """The newest checkpoint that verifies. Damaged ones are skipped with a warning naming them;
    if checkpoints exist but none verifies, stop rather than silently restart from step 0."""
    _restore_interrupted_swaps(root)
    candidates = list_checkpoints(root)
    problems = []
    for path in candidates:
        try:
            verify_checkpoint(path)
            return path
        except CorruptCheckpoint as err:
            log.warning("skipping damaged checkpoint: %s", err)
            problems.append(str(err))
    if candidates:
        raise RunError(
            "no valid checkpoint to resume from: "
            + "; ".join(problems)
            + " (use checkpoint.resume=never to start over)"
        )
    return None


def rotate_checkpoints(root: Path, keep_last: int, keep: Collection[int] = frozenset()) -> None:
    """Delete all but the newest `keep_last` checkpoints, sparing the steps in `keep` (the best)."""
    for path in list_checkpoints(root)[keep_last:]:
        if _step_of(path) not in keep:
            shutil.rmtree(path, ignore_errors=True)
    for path in _leftovers(root):  # debris of a process that was killed while saving
        shutil.rmtree(path, ignore_errors=True)
