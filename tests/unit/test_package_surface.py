"""Each package's `__init__` names its public surface (gputrain/lazy.py): every name resolves to the
object of the module it names, and importing the package itself imports none of them (no torch)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

PACKAGES = ("gputrain.run", "gputrain.evaluate", "gputrain.train")


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_resolves_to_its_modules_object(package: str) -> None:
    module = importlib.import_module(package)
    assert module.__all__, package
    for name in module.__all__:
        owner = importlib.import_module(f"{package}.{module._EXPORTS[name]}")
        assert getattr(module, name) is getattr(owner, name), f"{package}.{name}"
    with pytest.raises(AttributeError, match="has no attribute 'nothing_here'"):
        module.nothing_here  # noqa: B018 - the read is the test


def test_importing_a_package_loads_none_of_its_modules() -> None:
    code = "import sys, gputrain.run, gputrain.evaluate, gputrain.train; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
