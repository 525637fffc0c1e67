"""checkpoint/sharded.py in one process: a sharded checkpoint (conftest.py) loads into a model and
optimizer of any layout through the safe reader. Several ranks saving and resuming:
tests/dist/test_equivalence.py and tests/dist/test_sharded_waste.py."""

from __future__ import annotations

import torch

from gputrain.checkpoint.sharded import is_sharded_checkpoint
from tests.unit.checkpoint.helpers import model_and_optimizer, read_and_apply


def test_a_genuine_sharded_checkpoint_loads_through_the_safe_reader(sharded_checkpoint):
    path, saved_model = sharded_checkpoint
    assert is_sharded_checkpoint(path)
    model, optimizer = model_and_optimizer(1)  # other weights, other optimizer state
    state = read_and_apply(path, model, optimizer)
    assert state["loop"]["global_step"] == 1
    for a, b in zip(model.parameters(), saved_model.parameters()):
        assert torch.equal(a, b)
    assert optimizer.param_groups[0]["lr"] == 3e-3  # a non-tensor item, read with weights_only=True
