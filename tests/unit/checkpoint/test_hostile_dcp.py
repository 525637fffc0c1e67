"""A sharded (torch.distributed.checkpoint) checkpoint crafted to run code is refused, and the
code never runs: neither through its `.metadata` nor through a non-tensor item (issue 7, figure 5).

The checkpoints are real DCP directories written in one process, sealed with our manifest and
marker exactly as a multi-rank job seals them; the attacker re-seals after tampering."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict

from gputrain.checkpoint import CorruptCheckpoint
from gputrain.checkpoint.io import STATE_FILE, commit_checkpoint_dir
from gputrain.checkpoint.safe_dcp import SafeLoadPlanner, UnsafeCheckpointContent
from gputrain.checkpoint.sharded import is_sharded_checkpoint, load_portable_checkpoint
from tests.unit.checkpoint.test_hostile_files import Payload, reseal


def _model_and_optimizer(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


@pytest.fixture
def sharded_checkpoint(tmp_path: Path) -> tuple[Path, nn.Module]:
    model, optimizer = _model_and_optimizer(0)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    tmp = tmp_path / ".step-1.tmp"
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp), no_dist=True)
    torch.save({"loop": {"global_step": 1}}, tmp / STATE_FILE)
    final = commit_checkpoint_dir(tmp, tmp_path / "step-1", 1, fmt="dcp")
    return final, model


def test_a_genuine_sharded_checkpoint_loads_through_the_safe_reader(sharded_checkpoint):
    path, saved_model = sharded_checkpoint
    assert is_sharded_checkpoint(path)
    model, optimizer = _model_and_optimizer(1)  # other weights, other optimizer state
    state = load_portable_checkpoint(path, model, optimizer)
    assert state["loop"]["global_step"] == 1
    for a, b in zip(model.parameters(), saved_model.parameters()):
        assert torch.equal(a, b)
    assert optimizer.param_groups[0]["lr"] == 3e-3  # a non-tensor item, read with weights_only=True


def test_hostile_metadata_is_refused_and_never_runs(sharded_checkpoint, tmp_path):
    path, _ = sharded_checkpoint
    sentinel = tmp_path / "PWNED"
    (path / ".metadata").write_bytes(pickle.dumps(Payload(sentinel)))
    reseal(path)  # checksums are no defence against whoever can write the files
    model, optimizer = _model_and_optimizer(1)
    with pytest.raises(CorruptCheckpoint, match=r"metadata asks for posix.system.*refused to load it"):
        load_portable_checkpoint(path, model, optimizer)
    assert not sentinel.exists()


def test_truncated_metadata_is_a_damaged_checkpoint(sharded_checkpoint):
    path, _ = sharded_checkpoint
    data = (path / ".metadata").read_bytes()
    (path / ".metadata").write_bytes(data[: len(data) // 2])
    reseal(path)
    model, optimizer = _model_and_optimizer(1)
    with pytest.raises(CorruptCheckpoint, match="metadata is unreadable"):
        load_portable_checkpoint(path, model, optimizer)


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
    assert calls, "the sharded loader should call dcp.load"
    for name, keywords in calls:
        assert {"storage_reader", "planner"} <= keywords, name
    assert "SafeFileSystemReader(" in (package / "checkpoint" / "sharded.py").read_text()
