"""The log lines of other libraries gputrain silences (gputrain/known_warnings.py): each known line
is dropped, and only it: a line of the same logger with another message, the same message from
another logger, or torchao's line beside a CUDA torch, where it may mean something, all stay."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

import gputrain  # noqa: F401  (installs the filters)
from gputrain import known_warnings

ROOT = Path(__file__).resolve().parents[2]
SO = "/venv/lib/python3.11/site-packages/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so"
PYTREE = (
    "<enum 'KernelPreference'> is an Enum subclass and is now natively supported by torch.compile as an "
    "opaque value type. Calling register_constant() on Enum subclasses is deprecated"
)


def _kept(logger: str, message: str) -> bool:
    record = logging.getLogger(logger).makeRecord(logger, logging.WARNING, __file__, 1, message, (), None)
    return all(f.filter(record) for f in logging.getLogger(logger).filters)


@pytest.mark.parametrize(
    ("logger", "message", "kept"),
    [
        ("torchao", f"Failed to load {SO}: Could not load this library: {SO}", False),
        ("torchao", "Failed to load /x/torchao/_C_cutlass_90a.abi3.so: Could not load this library", False),
        ("torchao", "Failed to load /x/other_package/_C_mxfp8.so: missing symbol", True),  # not torchao's kernels
        ("torchao", "Skipping import of cpp extensions due to incompatible torch version", True),
        ("torchao.float8", f"Failed to load {SO}", True),  # another logger
        ("torch.utils._pytree", PYTREE, False),
        ("torch.utils._pytree", "register_pytree_node is deprecated: use register_pytree_node instead", True),
        ("torch", PYTREE, True),
        ("gputrain", f"Failed to load {SO}", True),
    ],
)
def test_only_the_known_lines_are_dropped(logger: str, message: str, kept: bool) -> None:
    assert _kept(logger, message) is kept


def test_torchaos_line_stays_beside_a_cuda_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a CUDA build, torchao's kernels should load: a failure there is news, not noise."""
    import torch

    monkeypatch.setattr(torch.version, "cuda", "12.8")
    assert _kept("torchao", f"Failed to load {SO}: Could not load this library")


def test_installing_twice_adds_one_filter() -> None:
    known_warnings.install()
    known_warnings.install()
    for name, known in known_warnings.KNOWN.items():
        assert logging.getLogger(name).filters.count(known) == 1


def test_an_hf_model_builds_without_torchaos_or_torchs_lines() -> None:
    """The real thing: transformers builds a model (importing torchao where it is installed) in a
    process that imported gputrain first, and its standard error holds none of the known lines."""
    pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[test]')")
    code = (
        "import gputrain, logging, transformers\n"
        "logging.basicConfig()\n"
        "transformers.AutoModelForCausalLM.from_config(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=1))\n"
    )
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=True
    )
    assert "Failed to load" not in out.stderr and "natively supported by torch.compile" not in out.stderr, out.stderr
