"""A live-bytes tracker: every tensor storage an op creates, counted until it is freed.

The same mode runs over fake tensors (the plan: shapes only, nothing allocated or computed) and over
real ones (a check that fake tensors make the storages real kernels do; the plan itself is checked
against the CPU allocator's own count, allocator.py, which also sees what no dispatcher does). Each
storage is counted once, by its own size, from the op that created it until Python drops it (a
weak reference's callback); views share their base's storage and add nothing. Storages made before
the mode started (the parameters) are registered by `track`, under their category.

While `recording`, each rise of gradients or `other` is noted: a layout that scales the two by
different factors (gradients sharded, activations not) peaks where its own sum does, which need not
be where the one-device sum did (`frontier`).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

CATEGORIES = ("weights", "buffers", "gradients", "optimizer", "inputs", "other")


def _storage(t: torch.Tensor) -> Any:
    return t.untyped_storage()


class LiveBytes(TorchDispatchMode):
    """Counts live storage bytes (by category) and their peak; `other` is activations and temporaries,
    `inputs` the batch the step was given (registered, so that a view of it is not counted as new)."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[str, int]] = {}
        self.bytes = dict.fromkeys(CATEGORIES, 0)
        self.total = 0
        self.peak = 0
        self.at_peak = dict(self.bytes)
        self._refs: dict[int, weakref.ref[Any]] = {}
        self.recording = False
        self._points: list[tuple[int, int]] = []
        self._born: dict[int, int] = {}  # storage -> the first point it was counted in (while recording)

    def _note(self) -> None:
        if self.recording:
            self._points.append((self.bytes["gradients"], self.bytes["other"]))

    def start_recording(self) -> None:
        self._points, self._born, self.recording = [], {}, True
        self._note()

    def frontier(self) -> tuple[tuple[int, int], ...]:
        """Stop recording; the (gradients, other) points no other point exceeds in both: where any sum
        of the two with positive weights is largest is one of them."""
        self.recording = False
        best: list[tuple[int, int]] = []
        for grads, other in sorted(set(self._points), reverse=True):
            if not best or other > best[-1][1]:
                best.append((grads, other))
        return tuple(best)

    def _add(self, storage: Any, category: str) -> None:
        key = id(storage)
        if key in self.live:
            return
        size = int(storage.nbytes())
        self.live[key] = (category, size)
        self.bytes[category] += size
        self.total += size
        self._refs[key] = weakref.ref(storage, self._on_free(key))
        if self.recording:
            self._born[key] = len(self._points)
        if self.total > self.peak:
            self.peak, self.at_peak = self.total, dict(self.bytes)
        self._note()

    def _on_free(self, key: int) -> Any:
        return lambda _: self._free(key)

    def _free(self, key: int) -> None:
        entry = self.live.pop(key, None)
        self._refs.pop(key, None)
        self._born.pop(key, None)
        if entry is not None:
            self.bytes[entry[0]] -= entry[1]
            self.total -= entry[1]

    def track(self, tensors: Iterable[torch.Tensor], category: str) -> None:
        """Count tensors that already exist (or move them to `category`: a gradient, an optimizer state)."""
        for t in tensors:
            storage = _storage(t)
            entry = self.live.get(id(storage))
            if entry is not None and entry[0] != category:
                self.bytes[entry[0]] -= entry[1]
                self.bytes[category] += entry[1]
                self.live[id(storage)] = (category, entry[1])
                if category == "gradients" and entry[0] == "other":
                    self._regrade(id(storage), entry[1])
                self._note()
            elif entry is None:
                self._add(storage, category)

    def _regrade(self, key: int, size: int) -> None:
        """A tensor made as `other` turned out a gradient (autograd computed it, then stored it as
        `.grad`): it was one from its birth, in the points noted since then too."""
        born = self._born.pop(key, None)
        if born is not None:
            for i in range(born, len(self._points)):
                grads, other = self._points[i]
                self._points[i] = (grads + size, other - size)

    def reset_peak(self) -> None:
        self.peak, self.at_peak = self.total, dict(self.bytes)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self._add(_storage(t), "other")
        return out
