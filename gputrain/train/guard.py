"""The non-finite guard a run gets (train.on_nonfinite): the one entry point to nonfinite.py (the
guard's interface, `off`, and the host-side guard) and device_guard.py (`stop` on the device).

Whatever it picks, the update calls `guard.step(...)` and the loop `guard.settle(...)`: no caller
asks which guard it holds."""

from __future__ import annotations

import torch

from gputrain.precision import Precision
from gputrain.train import device_guard
from gputrain.train.device_guard import DeviceGuard
from gputrain.train.nonfinite import Guard, NonFiniteGuard

__all__ = ["Guard", "build_guard"]


def build_guard(
    mode: str,
    optimizer: torch.optim.Optimizer,
    precision: Precision,
    *,
    device: torch.device,
    distributed: bool,
    pipelined: bool = False,
    window: int = 1,
) -> Guard:
    """The guard for `mode`: on the device where `stop` can be decided there (no host sync per step),
    else on the host (one small sync per step); `off`: a guard that applies every update.
    `window`: the logging interval, the device guard's longest wait before a read."""
    if mode == "off":
        return Guard(precision)
    if not pipelined and device_guard.fits(optimizer, mode, precision.scaler is not None, distributed):
        return DeviceGuard(precision, device=device, distributed=distributed, window=window)
    return NonFiniteGuard(mode, precision, distributed=distributed)
