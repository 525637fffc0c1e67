"""The sharded (torch.distributed.checkpoint) checkpoint the sharded and safe_dcp tests read."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict

from gputrain.checkpoint.io import commit_checkpoint_dir
from gputrain.run.layout import CHECKPOINT_STATE
from tests.unit.checkpoint.helpers import model_and_optimizer


@pytest.fixture
def sharded_checkpoint(tmp_path: Path) -> tuple[Path, nn.Module]:
    """A real DCP directory written in one process, sealed with our manifest and marker exactly as
    a multi-rank job seals it; and the model it holds."""
    model, optimizer = model_and_optimizer(0)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    tmp = tmp_path / ".step-1.tmp"
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp), no_dist=True)
    torch.save({"loop": {"global_step": 1}}, tmp / CHECKPOINT_STATE)
    final = commit_checkpoint_dir(tmp, tmp_path / "step-1", 1, fmt="dcp")
    return final, model
