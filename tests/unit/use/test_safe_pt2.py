"""A .pt2 file crafted to run code is refused and the code never runs; an honest one loads."""

from __future__ import annotations

import ast
import json
import os
import pickle
import zipfile
from pathlib import Path

import pytest
import torch

from gputrain.use.safe_pt2 import UnsafeProgram, load_program

PACKAGE = Path(__file__).resolve().parents[3] / "gputrain"


class Payload:
    """Unpickling this runs `touch <sentinel>`."""

    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self) -> tuple:
        return os.system, (f"touch {self.sentinel}",)


class _Affine(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


@pytest.fixture
def program_file(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    path = tmp_path / "model.pt2"
    torch.export.save(torch.export.export(_Affine().eval(), (torch.randn(2, 3),)), path)
    return path


def _rewrite(path: Path, change: dict[str, bytes]) -> None:
    """The archive with some members replaced or added, as someone handing it over could."""
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    root = next(iter(members)).split("/")[0]
    members.update({f"{root}/{name}": data for name, data in change.items()})
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def test_an_honest_program_loads_and_runs(program_file: Path) -> None:
    before = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    module = load_program(program_file).module()
    x = torch.randn(2, 3)
    expected = torch.export.load(program_file).module()(x)
    torch.testing.assert_close(module(x), expected, rtol=0, atol=0)
    assert os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD") == before  # the switch is put back


def test_a_pickled_weight_payload_is_refused_and_never_runs(program_file: Path, tmp_path: Path) -> None:
    sentinel = tmp_path / "SENTINEL"
    with zipfile.ZipFile(program_file) as archive:
        config_name = next(n for n in archive.namelist() if n.endswith("model_weights_config.json"))
        config = json.loads(archive.read(config_name))
    entry = config["config"]["linear.weight"]
    entry["use_pickle"] = True  # torch.export.load reads such a payload with weights_only=False
    _rewrite(
        program_file,
        {
            "data/weights/model_weights_config.json": json.dumps(config).encode(),
            f"data/weights/{entry['path_name']}": pickle.dumps(Payload(sentinel)),
        },
    )
    with pytest.raises(UnsafeProgram, match="not plain tensors"):
        load_program(program_file)
    assert not sentinel.exists()


def test_a_pickled_object_constant_is_refused_before_torch_reads_it(program_file: Path, tmp_path: Path) -> None:
    sentinel = tmp_path / "SENTINEL"
    _rewrite(program_file, {"data/constants/opaque_obj_0": pickle.dumps(Payload(sentinel))})
    with pytest.raises(UnsafeProgram, match="pickled objects"):
        load_program(program_file)
    assert not sentinel.exists()


def test_only_the_safe_loader_reads_exported_programs() -> None:
    """torch.export.load and AOTInductor's loader are reached through gputrain/use/safe_pt2.py alone
    (the package-wide scanner in tests/unit/checkpoint cannot tell its guarded call from a bare one)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "safe_pt2.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in ("torch.export", "torch._inductor"):
                found += [f"{path.name}: import {a.name}" for a in node.names if "load" in a.name]
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(("export.load", "aoti_load_package")):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node.func)}")
    assert found == []
