"""Choose the training device and say why, the way the doctor would explain it."""

from __future__ import annotations

import torch

from gputrain.errors import ConfigError


def _cuda_unavailable() -> tuple[bool, str]:
    """(whether this machine has a GPU at all, why torch cannot use CUDA here and the fix)."""
    # Imported here: the doctor's modules import this one's package.
    from gputrain.env.checks import gpu_present, why_cuda_unavailable
    from gputrain.env.facts import collect_env

    facts = collect_env()
    cause, fix = why_cuda_unavailable(facts)
    return gpu_present(facts), f"{cause}; {fix}" if fix else cause


def explain_cuda_unavailable() -> str:
    """One line on why `torch.cuda.is_available()` is False: "no GPU on this machine (...)", or,
    where a GPU exists but torch cannot use it, the cause and the fix (a CUDA build, the driver...)."""
    return _cuda_unavailable()[1]


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend and backend.is_available())


def resolve_device(requested: str) -> tuple[torch.device, str]:
    """Turn `train.device` into a device and a human reason for the choice.

    Raises:
        ConfigError: the device is unknown or not present on this machine.
    """
    if requested == "auto":
        if torch.cuda.is_available():
            name = torch.cuda.get_device_name(0)
            return torch.device("cuda", 0), f"auto: CUDA GPU found ({name})"
        if _mps_available():
            return torch.device("mps"), "auto: Apple MPS found"
        has_gpu, why = _cuda_unavailable()
        if not has_gpu:
            return torch.device("cpu"), "auto: no GPU on this machine; training on the CPU"
        return torch.device("cpu"), f"auto: this machine has a GPU but torch cannot use it — {why}"
    if requested == "cpu":
        return torch.device("cpu"), "requested"
    if requested == "mps":
        if not _mps_available():
            raise ConfigError(
                "train.device",
                "MPS is not available on this machine (it needs Apple silicon and a macOS build of torch)",
                requested,
                hint="use train.device=auto or cpu",
            )
        return torch.device("mps"), "requested"
    if requested == "cuda" or requested.startswith("cuda:"):
        index_text = requested.partition(":")[2] or "0"
        if not index_text.isdigit():
            raise ConfigError(
                "train.device", "the CUDA index must be a number", requested, hint="e.g. cuda, cuda:0, cuda:1"
            )
        if not torch.cuda.is_available():
            has_gpu, why = _cuda_unavailable()
            hint = None if has_gpu else "use train.device=auto or cpu"
            raise ConfigError("train.device", f"CUDA is not available: {why}", requested, hint=hint)
        index, count = int(index_text), torch.cuda.device_count()
        if index >= count:
            raise ConfigError(
                "train.device", f"there are {count} visible CUDA device(s), numbered 0..{count - 1}", requested
            )
        return torch.device("cuda", index), f"requested ({torch.cuda.get_device_name(index)})"
    raise ConfigError("train.device", "unknown device", requested, hint="choose from auto, cpu, cuda, cuda:N, mps")


def queued_copy(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` (on the host) on `device`, the copy queued on the current stream. To a CUDA device it
    goes through pinned memory: from pageable memory the host would wait for the copy."""
    if device == tensor.device:
        return tensor
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
