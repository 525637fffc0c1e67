"""A package's public names, imported on first use (PEP 562).

A package's `__init__` names its public surface here without importing it: importing
`gputrain.run.files` must not load torch through `gputrain.run.record`, and the CLI answers a usage
error before torch loads (tests/unit/test_import_graph.py's layer rules)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package` that answers each name of `exports` ({name: submodule})
    from its submodule, imported then."""

    def get(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return get
