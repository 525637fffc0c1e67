"""Install gputrain with the torch build this machine can use, then the package itself.

PyPI's Linux torch wheels are CUDA builds: several GB of CUDA libraries that a machine without a
GPU never uses. So: where an NVIDIA GPU is present, torch comes from PyPI (a CUDA build); where
none is, from PyTorch's CPU-only index (about a tenth of the download). A torch already installed
is kept. `--ecosystem` then adds timm, torchvision and transformers for the installed torch: the
torchvision built for its build (PyTorch's index of it: CPU, cuXXX), installed with that torch named
so pip can never replace it, checked by running `torchvision.ops.nms` (gputrain/torch_builds.py).
Standard library only: it runs before anything else is installed.

    python3 scripts/install.py [--test] [--ecosystem] [--index-url URL] [--dry-run]

Every PyTorch index is probed first (one request, PROBE_TIMEOUT_S): where it cannot be reached,
nothing is installed and the commands that would work are printed, at once, instead of pip's
minutes of retries. Exit status: 0 done; 1 pip failed, or the torchvision installed does not
import; 3 an index cannot be reached (the message says what to run instead).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import shlex
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
NVIDIA_VENDOR = "0x10de"
PROBE_TIMEOUT_S = 5.0
UNREACHABLE = 3
"""Exit status where an index cannot be reached (1 is pip's own failure)."""
VERIFY = "import torch, torchvision; from torchvision.ops import nms; nms(torch.zeros(1, 4), torch.zeros(1), 0.5)"
"""What a torchvision built for this torch runs; one built for another fails on its C++ ops."""


def _torch_builds() -> ModuleType:
    """gputrain/torch_builds.py, loaded by its path: gputrain is not installed yet, and importing
    the package would import torch."""
    spec = importlib.util.spec_from_file_location("gputrain_torch_builds", ROOT / "gputrain" / "torch_builds.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


builds = _torch_builds()
CPU_INDEX: str = builds.CPU_INDEX
PIP = f"{shlex.quote(sys.executable)} -m pip"


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


def installed(package: str) -> str | None:
    """The installed version of `package` (torch: "2.13.0+cpu"), or None; read without importing it."""
    importlib.invalidate_caches()  # one this script has just installed is seen too
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def unreachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why `url` cannot be reached (one request, `timeout` seconds), or None where it answers.
    Any HTTP answer, an error status included, means the server is there."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url.rstrip("/") + "/", method="HEAD"), timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None
    except urllib.error.URLError as exc:
        return str(exc.reason)
    except (OSError, ValueError) as exc:  # a timeout, a refused connection, a malformed URL
        return f"{type(exc).__name__}: {exc}"


def script() -> str:
    """This script as it was run, for the commands printed."""
    return f"{shlex.quote(sys.executable)} {shlex.quote(sys.argv[0] or str(Path(__file__)))}"


def say_unreachable(index: str, why: str, alternatives: list[str]) -> int:
    print(f"install: {index} cannot be reached from here ({why}); nothing was installed from it.", file=sys.stderr)
    print("install: run one of these instead:", file=sys.stderr)
    for line in alternatives:
        print(f"  {line}", file=sys.stderr)
    return UNREACHABLE


def again(comment: str, prefix: str = "", index: bool = False) -> str:
    """This command as it was run, without its --index-url, with one of its own (`index`) or
    behind `prefix`; `comment` says what the line does."""
    argv, skip = [], False
    for arg in sys.argv[1:]:
        if skip or arg.startswith("--index-url="):
            skip = False
            continue
        if arg == "--index-url":
            skip = True
            continue
        argv.append(shlex.quote(arg))
    command = " ".join([prefix + script(), *argv, *(["--index-url", "URL"] if index else [])])
    return f"{command}   # {comment}"


def torch_step(gpu: bool, index: str) -> tuple[str | None, list[str]]:
    """(the command that installs torch here, or None when torch is already installed; what to run
    instead where `index` cannot be reached)."""
    if installed("torch") is not None:
        return None, []
    if gpu:
        return f"{PIP} install torch", []
    return f"{PIP} install torch --index-url {index}", [
        again(f"URL: a mirror of {CPU_INDEX}", index=True),
        again("through a proxy", prefix="HTTPS_PROXY=http://HOST:PORT "),
        f"{PIP} install torch && {again('from PyPI: a CUDA build of torch, several GB')}",
    ]


def torchvision_works() -> bool:
    return subprocess.run([sys.executable, "-c", VERIFY], capture_output=True).returncode == 0


def ecosystem_steps(index: str | None) -> tuple[list[str], str | None, list[str]]:
    """(the commands that add torchvision, timm and transformers for the installed torch, the
    PyTorch index they need or None, what to run instead where that index cannot be reached)."""
    torch_version = installed("torch")
    if torch_version is None:  # --dry-run before torch is there: known once it is
        return (
            [f"{PIP} install torchvision timm transformers  # for the torch just installed (run this again)"],
            None,
            [],
        )
    vision = installed("torchvision")
    works = vision is not None and torchvision_works()
    steps = []
    if not works:
        steps.append(builds.torchvision_install(torch_version, broken=vision is not None, index=index, pip=PIP))
    series = builds.torchvision_series(torch_version)
    pinned = vision if works else (f"{series}.*" if series else None)
    steps.append(builds.libraries_install(["timm", "transformers"], torch_version, pinned, pip=PIP))
    needs = None if works else (index or builds.build_index(torch_version))
    instead = [
        again(f"URL: a mirror of {needs}", index=True),
        again("through a proxy", prefix="HTTPS_PROXY=http://HOST:PORT "),
        f"# not PyPI's torchvision: it is built for PyPI's CUDA torch and does not import beside torch {torch_version}",
    ]
    return steps, needs, instead


def run(command: str, dry_run: bool) -> bool:
    print(f"install: {command}", flush=True)
    return dry_run or subprocess.run(command, shell=True).returncode == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--test", action="store_true", help="also the test extras (pytest, hypothesis, ruff, mypy)")
    parser.add_argument(
        "--ecosystem",
        action="store_true",
        help="also timm, torchvision and transformers, for the installed torch (never replacing it)",
    )
    parser.add_argument(
        "--index-url",
        metavar="URL",
        help=f"a mirror of PyTorch's index for this build (default {CPU_INDEX}, or the cuXXX one of a CUDA torch)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args()
    gpu = nvidia_gpu_present()
    torch_index = args.index_url or CPU_INDEX
    torch_command, instead = torch_step(gpu, torch_index)
    build = "an NVIDIA GPU is present: a CUDA build of torch" if gpu else "no NVIDIA GPU: the CPU build of torch"
    print(f"install: {build}" + ("" if torch_command is not None else " (torch is already installed: kept)"))
    # every index this run needs is probed before anything is installed
    if torch_command is not None and "--index-url" in torch_command and (why := unreachable(torch_index)):
        return say_unreachable(torch_index, why, instead)
    steps, index, instead = ecosystem_steps(args.index_url) if args.ecosystem else ([], None, [])
    if index is not None and (why := unreachable(index)):
        return say_unreachable(index, why, instead)
    package = shlex.quote(f"{ROOT}[test]" if args.test else str(ROOT))
    for command in [c for c in (torch_command,) if c is not None] + [f"{PIP} install -e {package}"]:
        if not run(command, args.dry_run):
            return 1
    if not args.ecosystem:
        return 0
    if torch_command is not None and not args.dry_run:  # the torch just installed decides the torchvision
        steps, index, instead = ecosystem_steps(args.index_url)
    for command in steps:
        if not run(command, args.dry_run):
            return 1
    if args.dry_run:
        return 0
    if not torchvision_works():
        torch_version = installed("torch") or ""
        fix = builds.torchvision_install(torch_version, broken=True, index=args.index_url, pip=PIP)
        print(f"install: torchvision does not import beside torch {torch_version}; run: {fix}", file=sys.stderr)
        return 1
    print("install: torchvision.ops.nms runs with this torch: timm and torchvision models can be used")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
