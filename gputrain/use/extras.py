"""The optional `export` extra (onnx, onnxscript, onnxruntime): found, or a usage error that says
how to install it."""

from __future__ import annotations

import importlib.util

from gputrain.errors import UsageError

EXPORT_EXTRA = ("onnx", "onnxscript", "onnxruntime")
INSTALL_HINT = "pip install 'gputrain[export]' (or pip install onnx onnxscript onnxruntime)"


def missing_export_extra() -> list[str]:
    """The packages of the export extra that are not installed."""
    return [name for name in EXPORT_EXTRA if importlib.util.find_spec(name) is None]


def require_export_extra(what: str) -> None:
    """Raises UsageError (exit 2) naming `what` needs the extra and how to install it."""
    missing = missing_export_extra()
    if missing:
        raise UsageError(f"{what} needs {', '.join(missing)}, not installed: {INSTALL_HINT}")
