"""scripts/install.py and the README's ecosystem block, run as written in fresh virtual
environments (--system-site-packages: they see this machine's torch, and install only into
themselves), and the command gputrain proposes for a torchvision built for another torch.

Where the index of the installed torch's build cannot be reached from here (PyTorch's CPU index
from a machine that reaches only PyPI), the install itself is not run: the test asserts the one
message and exit status 3 that answer at once, and skips the rest with the reason. Where it can
be reached (CI), the command runs for real and torchvision.ops.nms must run beside the same torch.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import torch

from gputrain.torch_builds import build_index

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "install.py"
INDEX = build_index(torch.__version__)
"""The index of this torch's build (None: PyPI's own build, whose torchvision is on PyPI)."""
sys.path.insert(0, str(SCRIPT.parent))
import install  # noqa: E402 - scripts/ is not a package

VERIFY = [
    "-c",
    "import torch, torchvision; from torchvision.ops import nms; nms(torch.zeros(1, 4), torch.zeros(1), 0.5); "
    "print(torch.__version__)",
]


def _venv(path: Path) -> Path:
    """A fresh environment that sees this machine's packages and installs into itself; its python."""
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(path)
    return path / "bin" / "python"


def _env(python: Path) -> dict[str, str]:
    """`python` first on PATH (the commands printed say `python -m pip`), the checkout not on sys.path."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{python.parent}{os.pathsep}{env['PATH']}"
    return env


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on leaving: a connection there is refused


def _skip_unless_reachable(index: str | None) -> None:
    why = install.unreachable(index) if index else None
    if why:
        pytest.skip(f"{index} cannot be reached from here ({why}): the install itself is not run")


def test_an_unreachable_index_answers_at_once_with_the_commands_to_run(tmp_path: Path) -> None:
    python = _venv(tmp_path / "venv")
    index = f"http://127.0.0.1:{_closed_port()}/whl/cpu"
    done = subprocess.run([str(python), str(SCRIPT), "--ecosystem", "--index-url", index], env=_env(python),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == install.UNREACHABLE == 3, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith(f"install: {index} cannot be reached from here (")
    assert lines[0].endswith("nothing was installed from it.")
    assert lines[1] == "install: run one of these instead:"
    # this command again, at a mirror or through a proxy: never PyPI's torchvision beside a CPU torch
    assert lines[2] == f"  {python} {SCRIPT} --ecosystem --index-url URL   # URL: a mirror of {index}"
    assert lines[3] == f"  HTTPS_PROXY=http://HOST:PORT {python} {SCRIPT} --ecosystem   # through a proxy"
    assert "Retrying" not in done.stderr and "WARNING" not in done.stderr  # pip never ran: no minutes of retries
    assert "pip install" not in done.stdout  # nothing installed, not even gputrain
    assert not list((tmp_path / "venv").glob("lib/python*/site-packages/*gputrain*"))


def test_the_readme_ecosystem_block_installs_a_torchvision_that_runs(tmp_path: Path) -> None:
    block = re.search(r"### Models from timm, torchvision and Hugging Face\n+```bash\n(.*?)```",
                      (ROOT / "README.md").read_text(), re.S)
    assert block is not None
    install_line = block.group(1).splitlines()[0].split("#")[0].strip()
    assert install_line == "python3 scripts/install.py --ecosystem"  # the README's first command, as written
    python = _venv(tmp_path / "venv")
    argv = [str(python), *shlex.split(install_line)[1:]]
    if INDEX and (why := install.unreachable(INDEX)):
        done = subprocess.run(argv, cwd=ROOT, env=_env(python), capture_output=True, text=True, timeout=120)
        assert done.returncode == 3 and f"install: {INDEX} cannot be reached from here" in done.stderr
        pytest.skip(f"{INDEX} cannot be reached from here ({why}): the README's install is not run")
    done = subprocess.run(argv, cwd=ROOT, env=_env(python), capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
    ran = subprocess.run([str(python), *VERIFY], env=_env(python), capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0 and ran.stdout.strip() == torch.__version__, ran.stderr  # torch kept as it was


def _broken_torchvision(python: Path) -> None:
    """A torchvision installed in the environment (pip can see and uninstall it) that fails to import
    as PyPI's CUDA build does beside a CPU torch."""
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "torchvision").mkdir(parents=True)
    broken = "raise RuntimeError('operator torchvision::nms does not exist')\n"
    (site / "torchvision" / "__init__.py").write_text(broken)
    info = site / "torchvision-0.28.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torchvision\nVersion: 0.28.0\n")
    (info / "RECORD").write_text("torchvision/__init__.py,,\ntorchvision-0.28.0.dist-info/METADATA,,\n"
                                 "torchvision-0.28.0.dist-info/RECORD,,\n")


def test_the_command_gputrain_proposes_for_a_broken_torchvision_fixes_it(tmp_path: Path) -> None:
    python = _venv(tmp_path / "venv")
    _broken_torchvision(python)
    env = {**_env(python), "PYTHONPATH": str(ROOT)}
    asked = subprocess.run([str(python), "-m", "gputrain", "train", "model.name=torchvision:resnet18",
                            "--run-dir", str(tmp_path / "run")], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=300)
    assert asked.returncode == 2 and "Traceback" not in asked.stderr
    assert "needs torchvision, which is installed but cannot be imported" in asked.stderr
    command = asked.stderr.split("install the torchvision built for this torch: ", 1)[1].strip()
    # installing over the broken one would print "Requirement already satisfied" and change nothing
    assert command.startswith("python -m pip uninstall -y torchvision && python -m pip install ")
    assert f"'torch=={torch.__version__}'" in command  # the installed torch is named: pip cannot swap it
    _skip_unless_reachable(INDEX)
    fixed = subprocess.run(command, shell=True, cwd=tmp_path, env=_env(python), capture_output=True, text=True,
                           timeout=1800)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    ran = subprocess.run([str(python), *VERIFY], env=_env(python), capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0 and ran.stdout.strip() == torch.__version__, ran.stderr


def test_without_torch_an_unreachable_cpu_index_offers_a_mirror_a_proxy_or_pypis_torch(tmp_path: Path) -> None:
    if install.nvidia_gpu_present():
        pytest.skip("a machine with an NVIDIA GPU installs PyPI's torch: no CPU index to reach")
    builder = venv.EnvBuilder(system_site_packages=False, with_pip=False)  # no torch in it
    builder.create(tmp_path / "bare")
    python = tmp_path / "bare" / "bin" / "python"
    index = f"http://127.0.0.1:{_closed_port()}/whl/cpu"
    done = subprocess.run([str(python), str(SCRIPT), "--index-url", index], env=_env(python), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert done.stderr.splitlines()[2:] == [
        f"  {python} {SCRIPT} --index-url URL   # URL: a mirror of {install.CPU_INDEX}",
        f"  HTTPS_PROXY=http://HOST:PORT {python} {SCRIPT}   # through a proxy",
        f"  {python} -m pip install torch && {python} {SCRIPT}   # from PyPI: a CUDA build of torch, several GB",
    ]
