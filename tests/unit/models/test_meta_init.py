"""Built on the meta device and materialised later (models/meta.py), every built-in model gets the
weights an eager build gives for the same seed, and leaves the generator where the eager build does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from gputrain import Trainer
from gputrain.config import load_config
from gputrain.data import build_data
from gputrain.data.spec import DataSpec
from gputrain.errors import UsageError
from gputrain.models import build_model
from gputrain.models.meta import build_on_meta, is_meta, prepare_meta_init
from gputrain.train.state import seed_everything

VECTORS = DataSpec(task="classification", input_shape=(12,), num_classes=3)
IMAGES = DataSpec(task="classification", input_shape=(3, 16, 16), num_classes=5)
TOKENS = DataSpec(task="lm", input_shape=(16,), vocab_size=40)
GPT = {"model.n_layer": 2, "model.n_head": 2, "model.d_model": 16, "data.seq_len": 16}
CASES = {
    "mlp": (VECTORS, {}),
    "mlp-orthogonal": (VECTORS, {"model.init": "orthogonal"}),
    "cnn": (IMAGES, {"model.channels": [4, 8], "model.hidden": 16}),
    "resnet18": (IMAGES, {"model.base_width": 4}),
    "resnet34-kaiming": (IMAGES, {"model.base_width": 4, "model.init": "kaiming_normal"}),
    "resnet50": (IMAGES, {"model.base_width": 4}),
    "gpt": (TOKENS, GPT),
    "gpt-trunc_normal": (TOKENS, {**GPT, "model.init": "trunc_normal"}),
}


def _materialised(model: nn.Module) -> nn.Module:
    plan = prepare_meta_init(model)
    plan.materialize([model], dict(model.named_modules()), torch.device("cpu"))
    return model


@pytest.mark.parametrize("case", list(CASES))
def test_meta_build_materialises_the_eager_weights(case: str) -> None:
    spec, fields = CASES[case]
    config = load_config({"model.name": case.split("-")[0], **fields})
    torch.manual_seed(7)
    eager = build_model(config.model, spec)
    after_eager = torch.get_rng_state()
    torch.manual_seed(7)
    model = build_model(config.model, spec, on_meta=True)
    assert is_meta(model) and all(p.is_meta for p in model.parameters())
    _materialised(model)
    assert not is_meta(model)
    expected, got = eager.state_dict(), model.state_dict()
    assert got.keys() == expected.keys()
    for key in expected:
        assert torch.equal(got[key], expected[key]), key
    assert torch.equal(torch.get_rng_state(), after_eager), "the generator must end where the eager build left it"
    if case.startswith("gpt"):
        assert model.get_parameter("lm_head.weight") is model.get_parameter("wte.weight")


def test_from_config_trains_from_the_eager_weights(tmp_path: Path) -> None:
    overrides = {"model.name": "mlp", "model.hidden_sizes": [16], "train.max_steps": 1, "log.progress": "none",
                 "log.tensorboard": False, "checkpoint.enabled": False, "train.device": "cpu"}
    config = load_config(None, overrides)
    seed_everything(config.train.seed)
    bundle = build_data(config.data, config.train.seed)
    eager = build_model(config.model, bundle.spec)
    trainer = Trainer.from_config(config, run_dir=tmp_path / "run", evaluate=False)
    for key, value in eager.state_dict().items():
        assert torch.equal(trainer.model.state_dict()[key], value), key


def _user_model() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 2))


@pytest.mark.parametrize("given", ["meta module", "function"])
def test_the_python_api_takes_a_model_on_meta_or_a_function_building_one(tmp_path: Path, given: str) -> None:
    data = TensorDataset(torch.randn(32, 6), torch.randint(2, (32,)))
    torch.manual_seed(3)
    eager = _user_model()
    torch.manual_seed(3)
    if given == "function":
        model: nn.Module | object = _user_model
    else:
        with torch.device("meta"):
            model = _user_model()
    config = {"train.max_steps": 1, "train.batch_size": 8, "log.progress": "none", "log.tensorboard": False,
              "checkpoint.enabled": False, "train.device": "cpu"}
    trainer = Trainer(model, data, config=config, run_dir=tmp_path / "run")  # type: ignore[arg-type]
    for key, value in eager.state_dict().items():
        assert torch.equal(trainer.model.state_dict()[key], value), key
    assert trainer.fit()["status"] == "completed"


class _NoReset(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))


def test_a_module_that_cannot_initialise_itself_is_named() -> None:
    with pytest.raises(UsageError, match="_NoReset"):
        build_on_meta(lambda: nn.Sequential(nn.Linear(3, 3), _NoReset()))


def test_a_model_partly_on_meta_is_refused_not_overwritten() -> None:
    from gputrain.models.meta import is_meta

    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3, device="meta"))
    with pytest.raises(UsageError, match="partly on the meta device"):
        is_meta(model)
    assert not is_meta(nn.Linear(2, 2))
