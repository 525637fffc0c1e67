"""The environment of the Python processes gputrain starts (torchrun's ranks, the all-reduce
benchmark's ranks, the doctor's smoke ranks): they import the gputrain this process runs, never a
folder named `gputrain` in the working directory.

`python -m gputrain` (what torchrun runs in each rank) puts the working directory first on sys.path,
so a folder there named gputrain (a checkout, a copy, anything with an `__init__.py`) would be
imported in the ranks instead. PYTHONSAFEPATH=1 (Python 3.11+, `python -P`) leaves the working
directory out; the folder this process's gputrain came from goes first on PYTHONPATH (where it is
not one of the interpreter's own site folders: an uninstalled checkout still runs in its ranks).
Python 3.10 has no safe path: there a working directory whose `gputrain` would be imported instead is
refused before anything starts (`check_not_shadowed`). Torch-free.
"""

from __future__ import annotations

import os
import site
import sys
from collections.abc import Mapping
from pathlib import Path

from gputrain.errors import UsageError

PACKAGE_PARENT = Path(__file__).resolve().parent.parent
"""The folder this process's gputrain is imported from."""


def child_environment(env: Mapping[str, str]) -> dict[str, str]:
    """`env` for a Python process gputrain starts: the working directory off its sys.path, this
    gputrain's folder first on it where the interpreter would not find it by itself."""
    out = dict(env, PYTHONSAFEPATH="1")
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if not _site_folder(PACKAGE_PARENT) and (not paths or Path(paths[0]).resolve() != PACKAGE_PARENT):
        out["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_PARENT), *paths])
    return out


def check_not_shadowed(cwd: Path | None = None) -> None:
    """Where the safe path is missing (Python 3.10), a `gputrain` package in the working directory
    that is not this one would be the ranks' gputrain.

    Raises:
        UsageError: naming the folder and the way out.
    """
    if sys.version_info >= (3, 11):
        return
    folder = Path.cwd() if cwd is None else cwd
    shadow = folder / "gputrain"
    if (shadow / "__init__.py").is_file() and folder.resolve() != PACKAGE_PARENT:
        raise UsageError(
            f"{shadow}: a folder named gputrain in the working directory would be imported by the ranks instead "
            f"of the gputrain this command runs ({PACKAGE_PARENT / 'gputrain'}); run the command from another "
            "directory (Python 3.11+ leaves the working directory out)"
        )


def _site_folder(folder: Path) -> bool:
    """Whether `folder` is on every Python's path already (site-packages, the user's site folder)."""
    folders = [*site.getsitepackages(), site.getusersitepackages()]
    return any(Path(f).resolve() == folder for f in folders if f)
