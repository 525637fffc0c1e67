"""Conv2d forward + backward throughput: the convnet counterpart of the matmul figure."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gputrain.bench.precision import fp32_precision
from gputrain.bench.result import BenchResult, Settings
from gputrain.bench.timing import measure

__all__ = ["bench_conv2d", "conv_dtypes"]

_TORCH_DTYPE = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def conv_dtypes(device: torch.device) -> tuple[str, ...]:
    """fp32 on a CPU; on a GPU what training uses: tf32 (cuDNN's fp32 default) and bf16/fp16."""
    if device.type != "cuda":
        return ("fp32",)
    major, _ = torch.cuda.get_device_capability(device)
    return ("tf32", "bf16") if major >= 8 else ("fp32", "fp16")


def bench_conv2d(device: torch.device, dtype: str, settings: Settings) -> BenchResult:
    """FLOP/s of a 3×3, stride-1 conv (a ResNet stage) forward plus both backward products.

    Forward is 2·N·C_out·H·W·C_in·9 FLOPs; the input and weight gradients cost one forward each.
    """
    n, c, hw = settings.conv_batch, settings.conv_channels, settings.conv_hw
    torch_dtype = _TORCH_DTYPE[dtype]
    # channels_last is what cuDNN's tensor-core kernels want; on the CPU it is oneDNN's layout too.
    x = torch.randn(n, c, hw, hw, device=device, dtype=torch_dtype).to(memory_format=torch.channels_last)
    w = torch.randn(c, c, 3, 3, device=device, dtype=torch_dtype).to(memory_format=torch.channels_last)
    x.requires_grad_(True)
    w.requires_grad_(True)
    grad_out = torch.randn(n, c, hw, hw, device=device, dtype=torch_dtype).to(memory_format=torch.channels_last)

    def step() -> None:
        out = F.conv2d(x, w, padding=1)
        torch.autograd.grad(out, (x, w), grad_out)

    with fp32_precision("tf32" if dtype == "tf32" else "ieee"):
        timing = measure(step, device, **settings.timing_kwargs())
    flops = 3 * 2 * n * c * hw * hw * c * 9
    return BenchResult(
        "conv2d_fwd_bwd", device.type, dtype, f"N{n} C{c} {hw}x{hw} k3", flops / timing.median_s, "FLOP/s"
    )
