"""checkpoint/safe_dcp.py: a sharded (torch.distributed.checkpoint) checkpoint crafted to run code is
refused, and the code never runs: neither through its `.metadata` nor through a non-tensor item
(issue 7, figure 5). The checkpoints are real DCP directories written in one process (conftest.py),
sealed as a multi-rank job seals them; the attacker re-seals after tampering."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import pytest
import torch

from gputrain.checkpoint import CorruptCheckpoint
from gputrain.checkpoint.safe_dcp import SafeLoadPlanner, UnsafeCheckpointContent
from tests.unit.checkpoint.helpers import Payload, model_and_optimizer, read_and_apply, reseal


def test_hostile_metadata_is_refused_and_never_runs(sharded_checkpoint, tmp_path):
    path, _ = sharded_checkpoint
    sentinel = tmp_path / "PWNED"
    (path / ".metadata").write_bytes(pickle.dumps(Payload(sentinel)))
    reseal(path)  # checksums are no defence against whoever can write the files
    model, optimizer = model_and_optimizer(1)
    with pytest.raises(CorruptCheckpoint, match=r"metadata asks for posix.system.*refused to load it"):
        read_and_apply(path, model, optimizer)
    assert not sentinel.exists()


def test_truncated_metadata_is_a_damaged_checkpoint(sharded_checkpoint):
    path, _ = sharded_checkpoint
    data = (path / ".metadata").read_bytes()
    (path / ".metadata").write_bytes(data[: len(data) // 2])
    reseal(path)
    model, optimizer = model_and_optimizer(1)
    with pytest.raises(CorruptCheckpoint, match="metadata is unreadable"):
        read_and_apply(path, model, optimizer)


def test_hostile_non_tensor_item_is_refused_and_never_runs(tmp_path):
    sentinel = tmp_path / "PWNED"
    hostile = io.BytesIO()
    torch.save(Payload(sentinel), hostile)  # what a crafted optimizer hyperparameter would hold
    hostile.seek(0)
    planner = SafeLoadPlanner()
    item = type("Item", (), {"dest_index": type("Index", (), {"fqn": "optim.param_groups.0.lr"})()})()
    with pytest.raises(UnsafeCheckpointContent, match="optim.param_groups.0.lr"):
        planner.load_bytes(item, hostile)  # type: ignore[arg-type]
    assert not sentinel.exists()


def test_the_package_never_loads_dcp_with_its_default_reader_or_planner():
    """DCP's defaults unpickle without limits: every dcp.load call must pass our reader and planner."""
    import ast

    package = Path(__file__).resolve().parents[3] / "gputrain"
    calls = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "dcp"):
                calls.append((path.name, {k.arg for k in node.keywords}))
    assert calls, "the reader should call dcp.load"
    for name, keywords in calls:
        assert {"storage_reader", "planner"} <= keywords, name
    assert "SafeFileSystemReader(" in (package / "checkpoint" / "by_name.py").read_text()
