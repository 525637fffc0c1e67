"""A label for gputrain's own host-device syncs, so a profile does not blame them on the user.

The loop syncs on purpose in a few places: the non-finite guard's one flag per step, and the
loss, gradient norm and timings read on logging steps. Under a profiler those reads run inside a
`record_function(OWN_SYNC)` range, which the profiler's sync count skips. Outside a profile the
label costs one C call.
"""

from __future__ import annotations

import contextlib

import torch

OWN_SYNC = "gputrain::own_sync"

_UNLABELLED = contextlib.nullcontext()


def own_sync() -> contextlib.AbstractContextManager[object]:
    """Wrap a deliberate sync: labelled while a profiler records, a shared no-op otherwise."""
    if torch.autograd._profiler_enabled():
        return torch.profiler.record_function(OWN_SYNC)
    return _UNLABELLED
