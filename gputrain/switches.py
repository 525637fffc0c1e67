"""Process-wide switches, set in one place at run start: the CUDA device, TF32, cuDNN autotuning
and deterministic algorithms. They outlive any one object, so no constructor touches them.

TF32 goes through torch's legacy `allow_tf32` flags on purpose. Since torch 2.9 there is also a
`fp32_precision` API, and torch raises when a reader (inductor reads both) asks one API after the
other was written with a conflicting value. A legacy write leaves a state both APIs read
consistently (checked on torch 2.10-2.13), whatever the process had set before.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch


def set_tf32(enabled: bool) -> None:
    """TF32 tensor cores for FP32 matmuls and convolutions (Ampere and newer), on or off."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


@contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """TF32 on or off for a block (a benchmark), then back to what it was."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    set_tf32(enabled)
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@dataclass(frozen=True, slots=True)
class ProcessSwitches:
    """What `apply_process_switches` set, for the device line of the console."""

    tf32: bool
    cudnn_benchmark: bool
    deterministic: bool

    def describe(self, device: torch.device) -> str:
        parts = []
        if device.type == "cuda":
            parts.append(f"tf32 {'on' if self.tf32 else 'off'}")
            parts.append(f"cudnn.benchmark {'on' if self.cudnn_benchmark else 'off'}")
        if self.deterministic:
            parts.append("deterministic algorithms")
        return ", ".join(parts)


def apply_process_switches(device: torch.device, precision: str, deterministic: bool) -> ProcessSwitches:
    """Set the switches for a run on `device` in `precision` (train.precision, resolved).

    - CUDA device: made current, so events, streams and new tensors land on the run's GPU rather
      than GPU 0 (a run on cuda:1 would otherwise also open a context on cuda:0).
    - TF32: on for every mode but fp32, where fp32 means IEEE FP32; bf16 and fp16 runs use it in
      their fp32 islands.
    - cuDNN autotuning: on for speed, off for determinism (its choice can vary between runs).
    """
    tf32_on = device.type == "cuda" and precision != "fp32"
    if device.type == "cuda":
        torch.cuda.set_device(device)
        set_tf32(tf32_on)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    benchmark = device.type == "cuda" and not deterministic
    torch.backends.cudnn.benchmark = benchmark
    return ProcessSwitches(tf32=tf32_on, cudnn_benchmark=benchmark, deterministic=deterministic)
