"""Mixed precision as one small object: the autocast context plus, for fp16 only, a GradScaler.

bf16 has fp32's exponent range, so it never needs loss scaling.
"""

from __future__ import annotations

import contextlib

import torch

from gputrain.errors import ConfigError
from gputrain.fp8 import check_fp8_supported
from gputrain.observe.own_sync import own_sync

# fp8: the float8 layers (fp8.py) cast their own inputs; everything around them runs in bf16
_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}
_NO_AUTOCAST = contextlib.nullcontext()


def resolve_precision(requested: str, device: torch.device) -> tuple[str, str]:
    """(precision, reason). auto: bf16 where the GPU supports it, fp16 on older CUDA GPUs, else fp32."""
    if requested == "fp8":
        check_fp8_supported(device)
    if requested != "auto":
        if requested in ("fp16", "tf32") and device.type == "cpu":
            raise ConfigError("train.precision", f"{requested} is a GPU mode; on CPU use fp32 or bf16", requested)
        if requested == "tf32" and device.type != "cuda":
            raise ConfigError("train.precision", "tf32 needs an NVIDIA GPU (Ampere or newer)", requested)
        return requested, "requested"
    if device.type == "cuda":
        # tensor-core bf16 from Ampere (sm_80) on; torch.cuda.is_bf16_supported() also says yes where
        # bf16 is only emulated (V100, T4), which is slower than fp16 with loss scaling there
        if torch.cuda.get_device_capability(device) >= (8, 0):
            return "bf16", "auto: the GPU supports bf16"
        return "fp16", "auto: this GPU has no fast bf16, fp16 with loss scaling"
    if device.type == "mps":
        return "fp16", "auto: MPS"
    return "fp32", "auto: CPU"


class Precision:
    """Autocast + optional GradScaler with the hooks the training step needs."""

    def __init__(self, mode: str, device: torch.device) -> None:
        self.mode = mode
        self.device = device
        self.autocast_dtype = _AUTOCAST_DTYPES.get(mode)
        self.scaler = torch.amp.GradScaler(device.type) if mode == "fp16" and device.type == "cuda" else None

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        if self.autocast_dtype is None:
            return _NO_AUTOCAST  # fp32: no per-step context object to build
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients back to their true scale before clipping or measuring them."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is None:
            optimizer.step()
            return
        with own_sync():  # the scaler reads its overflow flag before stepping: a sync of ours
            self.scaler.step(optimizer)
        self.scaler.update()

    def skip_step(self) -> None:
        """Drop this step's update; the scaler still records any overflow and resets for the next step."""
        if self.scaler is not None:
            self.scaler.update()

    def state_dict(self) -> dict:
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
