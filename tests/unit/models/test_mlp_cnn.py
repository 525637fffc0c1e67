import pytest
import torch
from torch import nn

from gputrain.config import load_config
from gputrain.data.spec import DataSpec
from gputrain.errors import ConfigError
from gputrain.models import available_models, build_model

IMAGE = DataSpec(task="classification", input_shape=(1, 8, 8), num_classes=10)
TABLE = DataSpec(task="classification", input_shape=(13,), num_classes=3)


def _model(spec, **overrides):
    config = load_config(None, {f"model.{k}": v for k, v in overrides.items()})
    return build_model(config.model, spec)


def test_registry_lists_the_foundation_models():
    assert {"mlp", "cnn"} <= set(available_models())


@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 28, 28), (3, 32, 32), (3, 17, 23)])
def test_cnn_adapts_to_channels_and_size(shape):
    model = _model(DataSpec(task="classification", input_shape=shape, num_classes=7), name="cnn")
    assert model(torch.randn(2, *shape)).shape == (2, 7)


def test_cnn_is_the_mnist_example_shape():
    model = _model(IMAGE, name="cnn")
    kinds = [type(m) for m in model.modules() if not isinstance(m, (nn.Sequential, nn.ReLU, nn.Flatten))]
    assert kinds[1:] == [nn.Conv2d, nn.Conv2d, nn.MaxPool2d, nn.Dropout, nn.Linear, nn.Dropout, nn.Linear]


def test_cnn_rejects_tables_with_a_hint():
    with pytest.raises(ConfigError, match="model.name=mlp"):
        _model(TABLE, name="cnn")


def test_mlp_flattens_any_input_and_uses_hidden_sizes():
    model = _model(IMAGE, name="mlp", hidden_sizes=[32, 16])
    assert model(torch.randn(4, 1, 8, 8)).shape == (4, 10)
    assert [m.out_features for m in model.modules() if isinstance(m, nn.Linear)] == [32, 16, 10]


def test_regression_head_width():
    spec = DataSpec(task="regression", input_shape=(5,), num_outputs=1)
    assert _model(spec, name="mlp")(torch.randn(3, 5)).shape == (3, 1)


@pytest.mark.parametrize("activation, cls", [("relu", nn.ReLU), ("leaky_relu", nn.LeakyReLU), ("gelu", nn.GELU),
                                             ("silu", nn.SiLU), ("tanh", nn.Tanh), ("sigmoid", nn.Sigmoid)])
def test_activation_choice(activation, cls):
    model = _model(TABLE, name="mlp", activation=activation)
    assert any(isinstance(m, cls) for m in model.modules())


@pytest.mark.parametrize("init", ["constant", "normal", "trunc_normal", "xavier_uniform", "xavier_normal",
                                  "kaiming_uniform", "kaiming_normal", "orthogonal"])
def test_init_schemes_change_weights_and_zero_biases(init):
    torch.manual_seed(0)
    default = _model(TABLE, name="mlp")
    torch.manual_seed(0)
    custom = _model(TABLE, name="mlp", init=init)
    first = next(m for m in custom.modules() if isinstance(m, nn.Linear))
    assert not torch.equal(first.weight, next(m for m in default.modules() if isinstance(m, nn.Linear)).weight)
    assert torch.count_nonzero(first.bias) == 0
    if init == "constant":
        assert torch.all(first.weight == 0.01)
    if init == "orthogonal":
        w = first.weight
        gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
        assert torch.allclose(gram / gram.diagonal().mean(), torch.eye(len(gram)), atol=1e-4)
    if init == "trunc_normal":
        assert first.weight.abs().max() <= 0.04


def test_dropout_override():
    model = _model(IMAGE, name="cnn", dropout=0.1)
    assert {m.p for m in model.modules() if isinstance(m, nn.Dropout)} == {0.1}
