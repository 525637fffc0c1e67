"""Datasheet peak dense FLOP/s per GPU model and dtype: the denominator of MFU.

Figures are dense (NVIDIA quotes tensor-core figures "with sparsity"; those are halved here) and
for matrix multiply with FP32 accumulation, which is what torch uses for fp16 and bf16 (and torchao's
float8 matmuls for "fp8", a figure only GPUs of compute capability 8.9+ have). "fp32" is
the non-tensor-core FP32 rate; "tf32" is FP32 matmul on tensor cores. A dtype a GPU cannot run
on tensor cores (bf16 and tf32 before Ampere) has no entry.

A device with fewer streaming multiprocessors than its product (a MIG slice, which torch names
"... MIG 1g.10gb") gets the figure scaled by its share of the SMs; the full product's figure would
make its MFU several times too low.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DTYPES", "PEAKS", "GpuPeak", "datasheet_peak_flops", "match_gpu_model"]

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
T = 1e12


@dataclass(frozen=True)
class GpuPeak:
    """Dense peak FLOP/s of one GPU model, with where the numbers come from."""

    model: str
    pattern: str
    """Regex matched against the upper-cased torch device name, `NVIDIA `/`Tesla ` removed."""
    flops: dict[str, float]
    source: str
    sms: int
    """Streaming multiprocessors of the whole product (the figures are for all of them)."""


# Most specific pattern first: "H100 PCIE" must win over "H100", "A10" must not match "A100".
PEAKS: tuple[GpuPeak, ...] = (
    GpuPeak(
        "B200",
        r"^B200\b",
        {"fp32": 80 * T, "tf32": 1100 * T, "bf16": 2250 * T, "fp16": 2250 * T, "fp8": 4500 * T},
        "NVIDIA HGX B200 datasheet (per GPU, 1000 W; sparse figures halved)",
        sms=148,
    ),
    GpuPeak(
        "GH200",
        r"^GH200\b",
        {"fp32": 67 * T, "tf32": 494.5 * T, "bf16": 989.5 * T, "fp16": 989.5 * T, "fp8": 1979 * T},
        "NVIDIA GH200 Grace Hopper Superchip datasheet (sparse figures halved)",
        sms=132,
    ),
    GpuPeak(
        "H200 NVL",
        r"^H200 NVL",
        {"fp32": 60 * T, "tf32": 417.5 * T, "bf16": 835.5 * T, "fp16": 835.5 * T, "fp8": 1670.5 * T},
        "NVIDIA H200 NVL datasheet (sparse figures halved)",
        sms=132,
    ),
    GpuPeak(
        "H200 SXM",
        r"^H200\b",
        {"fp32": 67 * T, "tf32": 494.5 * T, "bf16": 989.5 * T, "fp16": 989.5 * T, "fp8": 1979 * T},
        "NVIDIA H200 SXM datasheet (sparse figures halved)",
        sms=132,
    ),
    GpuPeak(
        "H100 NVL",
        r"^H100 NVL",
        {"fp32": 60 * T, "tf32": 417.5 * T, "bf16": 835.5 * T, "fp16": 835.5 * T, "fp8": 1670.5 * T},
        "NVIDIA H100 NVL datasheet (sparse figures halved)",
        sms=132,
    ),
    GpuPeak(
        "H100 PCIe",
        r"^H100 PCIE",
        {"fp32": 51 * T, "tf32": 378 * T, "bf16": 756.5 * T, "fp16": 756.5 * T, "fp8": 1513 * T},
        "NVIDIA H100 PCIe datasheet (sparse figures halved)",
        sms=114,
    ),
    GpuPeak(
        "H100 SXM",
        r"^H100\b",
        {"fp32": 67 * T, "tf32": 494.5 * T, "bf16": 989.5 * T, "fp16": 989.5 * T, "fp8": 1979 * T},
        "NVIDIA H100 SXM5 datasheet (sparse figures halved)",
        sms=132,
    ),
    GpuPeak(
        "A100",
        r"^A100\b",
        {"fp32": 19.5 * T, "tf32": 156 * T, "bf16": 312 * T, "fp16": 312 * T},
        "NVIDIA A100 Tensor Core GPU datasheet (SXM4 and PCIe; dense)",
        sms=108,
    ),
    GpuPeak(
        "A10",
        r"^A10$",
        {"fp32": 31.2 * T, "tf32": 62.5 * T, "bf16": 125 * T, "fp16": 125 * T},
        "NVIDIA A10 Tensor Core GPU datasheet (sparse figures halved)",
        sms=72,
    ),
    GpuPeak(
        "L40S",
        r"^L40S\b",
        {"fp32": 91.6 * T, "tf32": 183 * T, "bf16": 362.05 * T, "fp16": 362.05 * T, "fp8": 733 * T},
        "NVIDIA L40S datasheet (sparse figures halved)",
        sms=142,
    ),
    GpuPeak(
        "L4",
        r"^L4$",
        {"fp32": 30.3 * T, "tf32": 60 * T, "bf16": 121 * T, "fp16": 121 * T, "fp8": 242.5 * T},
        "NVIDIA L4 Tensor Core GPU datasheet (sparse figures halved)",
        sms=58,
    ),
    GpuPeak(
        "V100S PCIe",
        r"^V100S",
        {"fp32": 16.4 * T, "fp16": 130 * T},
        "NVIDIA V100 Tensor Core GPU datasheet (V100S PCIe)",
        sms=80,
    ),
    GpuPeak(
        "V100 PCIe",
        r"^V100-PCIE",
        {"fp32": 14 * T, "fp16": 112 * T},
        "NVIDIA V100 Tensor Core GPU datasheet (V100 PCIe)",
        sms=80,
    ),
    GpuPeak(
        "V100 SXM2",
        r"^V100\b",
        {"fp32": 15.7 * T, "fp16": 125 * T},
        "NVIDIA V100 Tensor Core GPU datasheet (V100 SXM2)",
        sms=80,
    ),
    GpuPeak(
        "T4",
        r"^T4$",
        {"fp32": 8.1 * T, "fp16": 65 * T},
        "NVIDIA T4 Tensor Core GPU datasheet (FP16 mixed precision)",
        sms=40,
    ),
    # GeForce: tensor rates with FP32 accumulation, which are half the FP16-accumulate headline.
    GpuPeak(
        "RTX 4090",
        r"^GEFORCE RTX 4090$",
        {"fp32": 82.6 * T, "tf32": 82.6 * T, "bf16": 165.2 * T, "fp16": 165.2 * T, "fp8": 330.3 * T},
        "NVIDIA Ada Lovelace GPU architecture whitepaper, RTX 4090 (FP32 accumulate, dense)",
        sms=128,
    ),
    GpuPeak(
        "RTX 3090",
        r"^GEFORCE RTX 3090$",
        {"fp32": 35.6 * T, "tf32": 35.6 * T, "bf16": 71 * T, "fp16": 71 * T},
        "NVIDIA Ampere GA102 GPU architecture whitepaper, RTX 3090 (FP32 accumulate, dense)",
        sms=82,
    ),
)


def _normalise(device_name: str) -> str:
    name = device_name.strip().upper()
    for prefix in ("NVIDIA ", "TESLA "):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    return name


def match_gpu_model(device_name: str) -> GpuPeak | None:
    """The table row for a device name as torch reports it, e.g. "NVIDIA H100 80GB HBM3"."""
    name = _normalise(device_name)
    for row in PEAKS:
        if re.search(row.pattern, name):
            return row
    return None


def datasheet_peak_flops(device_name: str, dtype: str, sm_count: int | None = None) -> tuple[float, str] | None:
    """(dense peak FLOP/s, source) for this GPU and dtype; None for CPUs and unknown pairs.

    Args:
        device_name: as `torch.cuda.get_device_name()` gives it.
        dtype: "fp32", "tf32", "bf16", "fp16" or "fp8".
        sm_count: the device's streaming multiprocessors (`multi_processor_count`); fewer than the
            product has (a MIG slice) scales the figure down. A MIG slice of unknown size has no
            figure.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    row = match_gpu_model(device_name)
    if row is None or dtype not in row.flops:
        return None
    peak = row.flops[dtype]
    source = f"{row.source}: {row.model} {dtype} {peak / T:g} TFLOP/s"
    mig = _MIG.search(_normalise(device_name))
    if sm_count is not None and 0 < sm_count < row.sms:
        peak *= sm_count / row.sms
        source += f" × {sm_count}/{row.sms} SMs" + (f" (MIG slice {mig.group(1).lower()})" if mig else "")
    elif mig and sm_count is None:
        return None
    return peak, source


_MIG = re.compile(r"\bMIG (\S+)")
