"""checkpoint/matching.py: whether an intact checkpoint is this run's, said in words that name what
differs. Whole runs resumed against checkpoints of other models, optimizers and states:
tests/adversarial/test_checkpoint_files.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from gputrain.checkpoint.matching import CheckpointMismatch, Spec, check_weights, first_difference, tied_groups

PATH = Path("runs/x/checkpoints/step-4")


def _specs(model: nn.Module) -> dict[str, Spec]:
    return {name: Spec.of(t) for name, t in model.state_dict().items()}


def test_the_same_model_fits_and_one_name_of_a_tied_pair_is_enough() -> None:
    model = nn.Sequential(nn.Embedding(8, 4), nn.Linear(4, 8, bias=False))
    model[1].weight = model[0].weight  # tied, as a GPT's head and embedding
    saved = {"0.weight": Spec.of(model[0].weight)}
    check_weights(PATH, "model.safetensors", saved, _specs(model), tied_groups(model))


@pytest.mark.parametrize(("saved", "problem"), [
    (nn.Linear(4, 3), "model.safetensors: weight has shape [3, 4] in the checkpoint, [2, 4] in this run's model "
                      "(1 more differ: bias)"),
    (nn.Linear(4, 2).double(), "model.safetensors: weight is float64 in the checkpoint, float32 in this run's model "
                               "(1 more differ)"),
    (nn.Linear(4, 2, bias=False), "model.safetensors: the parameters differ: this run's model has bias, which the "
                                  "checkpoint lacks"),
])
def test_another_model_is_named_by_what_differs(saved: nn.Module, problem: str) -> None:
    with pytest.raises(CheckpointMismatch) as err:
        check_weights(PATH, "model.safetensors", _specs(saved), _specs(nn.Linear(4, 2)), [])
    assert str(err.value) == f"cannot resume: {PATH}: {problem}"
    assert err.value.exit_code == 2  # not this run's checkpoint: bad input


def test_first_difference_says_where_a_saved_structure_stops_fitting() -> None:
    live = {"base_lrs": [0.1], "last_epoch": 3, "state": {"m": torch.zeros(2)}}
    assert first_difference(live, {"base_lrs": [0.2], "last_epoch": 7, "state": {"m": torch.ones(2)}}, "s") is None
    assert first_difference(live, {**live, "base_lrs": [0.1, 0.1]}, "s") == "s.base_lrs has 2 entries, this run's has 1"
    assert first_difference(live, {**live, "last_epoch": "3"}, "s") == "s.last_epoch is a str, this run's is an int"
    assert first_difference(live, {"base_lrs": [0.1], "state": {}}, "s") == "s lacks last_epoch"
