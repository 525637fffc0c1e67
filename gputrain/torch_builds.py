"""Which pip commands install torchvision, timm and transformers beside the installed torch without
ever replacing it: the one place gputrain's messages and `scripts/install.py --ecosystem` take them.

A torchvision wheel is built for one torch release and one build of it (CPU, CUDA x.y, ROCm): a
torchvision built for another does not import (`operator torchvision::nms does not exist`). PyPI's
Linux wheels are the CUDA builds, so beside a CPU torch (`2.13.0+cpu`) torchvision must come from
PyTorch's CPU index, and pip left to choose takes the newest torchvision, whose torch pin makes it
replace the installed torch. So every command here names the torchvision series of the installed
torch, the index of its build, and the installed torch itself (`torch==2.13.0+cpu`): pip then keeps
that torch and picks the torchvision built for it, or fails, but never swaps torch. A torchvision
already installed but built for another torch satisfies `torchvision==0.28.*` as far as pip knows
("Requirement already satisfied"), so that case uninstalls it first.

Standard library only, and no import of gputrain: `scripts/install.py` loads this file by its path
before gputrain (or torch) is installed.
"""

from __future__ import annotations

import re

PYTORCH_INDEX = "https://download.pytorch.org/whl"
CPU_INDEX = f"{PYTORCH_INDEX}/cpu"

TORCHVISION_SERIES = {minor: f"0.{minor + 15}" for minor in range(14)}
"""torch 2.<minor> -> the torchvision series built for it (torchvision's own table: 2.0 -> 0.15,
2.5 -> 0.20, 2.13 -> 0.28); a later 2.x follows the same rule (`torchvision_series`)."""

_BUILD = re.compile(r"^(cpu|cu\d+|rocm[\d.]+|xpu)$")


def torchvision_series(torch_version: str) -> str | None:
    """The torchvision series for `torch_version` ("2.13.0+cpu" -> "0.28"), or None for a torch
    outside 2.x (pip's own choice is all there is then)."""
    match = re.match(r"^(\d+)\.(\d+)", torch_version)
    if match is None or match.group(1) != "2":
        return None
    minor = int(match.group(2))
    return TORCHVISION_SERIES.get(minor, f"0.{minor + 15}")


def build_index(torch_version: str) -> str | None:
    """PyTorch's index for the build of `torch_version` (its local part: +cpu, +cu128, +rocm6.3),
    or None for a build without one: PyPI's own, whose torchvision is on PyPI too."""
    local = torch_version.partition("+")[2]
    return f"{PYTORCH_INDEX}/{local}" if _BUILD.match(local) else None


def torchvision_install(
    torch_version: str, *, broken: bool = False, index: str | None = None, pip: str = "python -m pip"
) -> str:
    """The shell command that installs the torchvision built for `torch_version` and keeps that
    torch. `broken`: a torchvision is installed but does not import (built for another torch): it
    is uninstalled first, or pip would call it satisfied. `index`: a mirror of the build's index."""
    series = torchvision_series(torch_version)
    wanted = f"'torchvision=={series}.*'" if series else "torchvision"
    index = index or build_index(torch_version)
    command = f"{pip} install {wanted} 'torch=={torch_version}'" + (f" --index-url {index}" if index else "")
    return f"{pip} uninstall -y torchvision && {command}" if broken else command


def libraries_install(
    packages: list[str], torch_version: str, torchvision_version: str | None, pip: str = "python -m pip"
) -> str:
    """The shell command that installs `packages` (timm, transformers) from the usual index while
    keeping the installed torch and, where given, torchvision (its installed version, or the series
    of one installed first): pip cannot swap either for the newest builds of PyPI."""
    pins = [f"'torch=={torch_version}'"] + ([f"'torchvision=={torchvision_version}'"] if torchvision_version else [])
    return f"{pip} install {' '.join(packages)} {' '.join(pins)}"
