"""Checkpoints written in a background thread (`checkpoint.async_save=true`).

The training loop pays only for a copy of the weights and optimizer state to host memory; hashing,
writing and fsyncing happen in a thread, with the same atomic protocol as a synchronous save
(temporary directory, fsync, manifest, marker last, rename). At most one save is in flight: the
next save, and the end of the run, wait for it first, and a failure surfaces there as a RunError.
The thread is a daemon so a second Ctrl-C still exits at once; the half-written temporary it
leaves is never at a final path and is removed by the next run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gputrain.checkpoint.io import save_checkpoint
from gputrain.errors import RunError
from gputrain.run.layout import checkpoint_name


class _Weights:
    """Stands in for the module: `save_checkpoint` only needs `state_dict()`."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self._tensors = tensors

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self._tensors)


def snapshot(obj: Any, memo: dict[tuple, torch.Tensor] | None = None) -> Any:
    """A host-memory copy of nested state that training can no longer change. Tensors that shared
    memory still share it (tied weights are written once, as in a synchronous save)."""
    memo = {} if memo is None else memo
    if isinstance(obj, torch.Tensor):
        key = (obj.device, obj.data_ptr(), obj.dtype, tuple(obj.shape), obj.stride())
        if key not in memo:
            memo[key] = obj.detach().to("cpu", copy=True)
        return memo[key]
    if isinstance(obj, Mapping):
        return {k: snapshot(v, memo) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(snapshot(v, memo) for v in obj)
    return obj


class HostCopy:
    """A checkpoint's weights and state copied to host memory, to be written later."""

    def __init__(self, weights: _Weights, state: dict[str, Any]) -> None:
        self.weights = weights
        self.state = state

    @classmethod
    def of(cls, model: nn.Module, state: dict[str, Any]) -> HostCopy:
        memo: dict[tuple, torch.Tensor] = {}
        return cls(_Weights(snapshot(model.state_dict(), memo)), snapshot(state, memo))


class AsyncSaver:
    """One background checkpoint at a time; `wait()` joins it and re-raises its failure."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._pending: Path | None = None

    def save(
        self,
        root: Path,
        step: int,
        model: nn.Module,
        state: dict[str, Any],
        after: Callable[[Path], None] | None = None,
    ) -> Path:
        """Snapshot now, write in the background; return the path the checkpoint will have."""
        self.wait()
        return self.save_copy(root, step, HostCopy.of(model, state), after)

    def save_copy(self, root: Path, step: int, copy: HostCopy, after: Callable[[Path], None] | None = None) -> Path:
        """Write a copy already in host memory in the background (after the save in flight)."""
        self.wait()
        self._pending = root / checkpoint_name(step)
        self._thread = threading.Thread(
            target=self._write,
            args=(root, step, copy.weights, copy.state, after),
            name=f"gputrain-checkpoint-{step}",
            daemon=True,
        )
        self._thread.start()
        return self._pending

    def _write(
        self, root: Path, step: int, weights: _Weights, state: dict[str, Any], after: Callable[[Path], None] | None
    ) -> None:
        try:
            path = save_checkpoint(root, step, weights, state)  # type: ignore[arg-type]
            if after is not None:
                after(path)
        except BaseException as err:  # noqa: BLE001 - handed to the training thread in wait()
            self._error = err

    def wait(self) -> None:
        """Block until the save in flight (if any) is committed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise RunError(f"writing checkpoint {self._pending} failed: {type(err).__name__}: {err}") from err
