"""Install gputrain with the torch build this machine can use, then the package itself.

PyPI's Linux torch wheels are CUDA builds: several GB of CUDA libraries that a machine without a
GPU never uses. So: where an NVIDIA GPU is present, torch comes from PyPI (a CUDA build); where
none is, from PyTorch's CPU-only index (about a tenth of the download). A torch already installed
is kept. Standard library only: it runs before anything else is installed.

    python3 scripts/install.py [--test] [--dry-run]
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
NVIDIA_VENDOR = "0x10de"


def nvidia_gpu_present() -> bool:
    """An NVIDIA GPU on this machine: the driver's /proc entry, a display/3D controller of NVIDIA's
    on the PCI bus, or a working nvidia-smi. The driver need not work: a GPU wants a CUDA build."""
    if Path("/proc/driver/nvidia/version").exists():
        return True
    for device in Path("/sys/bus/pci/devices").glob("*"):
        try:
            vendor = (device / "vendor").read_text().strip()
            kind = (device / "class").read_text().strip()
        except OSError:
            continue
        if vendor == NVIDIA_VENDOR and kind.startswith("0x03"):
            return True
    smi = shutil.which("nvidia-smi")
    return smi is not None and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


def torch_command(gpu: bool) -> list[str] | None:
    """The pip command that installs torch here, or None when torch is already installed."""
    if importlib.util.find_spec("torch") is not None:
        return None
    pip = [sys.executable, "-m", "pip", "install"]
    return [*pip, "torch"] if gpu else [*pip, "torch", "--index-url", CPU_INDEX]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--test", action="store_true", help="also the test extras (pytest, hypothesis, ruff, mypy)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args()
    gpu = nvidia_gpu_present()
    steps = [command for command in (torch_command(gpu),) if command is not None]
    steps.append([sys.executable, "-m", "pip", "install", "-e", f"{ROOT}[test]" if args.test else str(ROOT)])
    build = "an NVIDIA GPU is present: a CUDA build of torch" if gpu else "no NVIDIA GPU: the CPU build of torch"
    print(f"install: {build}" + ("" if torch_command(gpu) is not None else " (torch is already installed: kept)"))
    for command in steps:
        print("install: " + " ".join(command), flush=True)
        if args.dry_run:
            continue
        if subprocess.run(command).returncode != 0:
            if "--index-url" in command:
                print(f"install: {CPU_INDEX} could not be used from here. Install a CPU build of torch from an "
                      "index you can reach (torch >= 2.10), then run this again: it keeps an installed torch.",
                      file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
