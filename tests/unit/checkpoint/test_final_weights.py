"""The final model.safetensors of a model with tied weights loads back with the standard calls the
README names: safetensors' `load_model`, or `load_state_dict(load_file(...), strict=False)`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, load_model

from gputrain import Trainer
from gputrain.config import load_config
from gputrain.data import build_data
from gputrain.models import build_model

GPT = {"model.name": "gpt", "model.n_layer": 1, "model.n_head": 2, "model.d_model": 16, "data.name": "synthetic",
       "data.task": "lm", "data.seq_len": 8, "data.num_samples": 64, "data.vocab_size": 32, "train.max_steps": 3,
       "train.batch_size": 16, "train.device": "cpu", "log.progress": "none", "log.tensorboard": False,
       "checkpoint.enabled": False}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    run_dir = tmp_path_factory.mktemp("tied") / "run"
    trainer = Trainer.from_config(None, run_dir=run_dir, overrides=GPT)
    trainer.fit()
    return run_dir / "model.safetensors", {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def _fresh() -> torch.nn.Module:
    config = load_config(None, GPT)
    torch.manual_seed(123)  # other weights than the trained ones
    return build_model(config.model, build_data(config.data, 0).spec)


def test_the_tie_is_saved_once(trained: tuple[Path, dict[str, torch.Tensor]]) -> None:
    path, _ = trained
    stored = load_file(str(path))
    assert ("wte.weight" in stored) != ("lm_head.weight" in stored)


@pytest.mark.parametrize("how", ["load_model", "load_state_dict"])
def test_the_standard_calls_restore_every_weight(trained: tuple[Path, dict[str, torch.Tensor]], how: str) -> None:
    path, weights = trained
    model = _fresh()
    if how == "load_model":
        load_model(model, str(path))
    else:
        missing, unexpected = model.load_state_dict(load_file(str(path)), strict=False)
        assert not unexpected and set(missing) <= {"wte.weight", "lm_head.weight"}  # the tie's other name
    assert model.lm_head.weight is model.wte.weight  # still tied
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, weights[name], rtol=0, atol=0, msg=name)
