"""The config's size estimate (config/sizes.py): a lower bound of the real model's parameters,
close to it where the config's sizes dominate, and a refusal, with the numbers, of what cannot
fit in this machine's memory — without torch or the model code (the models are built here, on
the meta device, only to check the estimate)."""

from __future__ import annotations

import pytest
import torch

from gputrain.config import load_config
from gputrain.config.memory_limit import MemoryLimit, rank_memory_limit
from gputrain.config.sizes import check_fits_in_memory, data_demand, model_demand
from gputrain.data.spec import DataSpec
from gputrain.errors import ConfigError
from gputrain.models import build_model

IMAGES = DataSpec(task="classification", input_shape=(3, 32, 32), num_classes=10)
# the layers the data decides (input, head, flattened map) kept small, so the config's sizes dominate
TABLE = DataSpec(task="classification", input_shape=(8,), num_classes=2)
TINY_IMAGES = DataSpec(task="classification", input_shape=(3, 2, 2), num_classes=2)
TOKENS = DataSpec(task="lm", input_shape=(64,), vocab_size=500)


@pytest.fixture
def big_machine(monkeypatch):
    """load_config as on a machine with 1 TiB, so the configs below load wherever the test runs."""
    monkeypatch.setattr("gputrain.config.sizes.rank_memory_limit", lambda *_: MemoryLimit(2**40, "a test's 1 TiB"))


def real_parameters(overrides: dict, spec: DataSpec) -> int:
    config = load_config(overrides)
    with torch.device("meta"):
        model = build_model(config.model, spec)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("overrides, spec, tight", [
    ({"model.name": "mlp", "model.hidden_sizes": [1024, 2048, 512]}, TABLE, 0.95),
    ({"model.name": "cnn", "model.channels": [64, 128, 256]}, TINY_IMAGES, 0.95),
    ({"model.name": "resnet18"}, IMAGES, 0.9),
    ({"model.name": "resnet34", "model.base_width": 32}, IMAGES, 0.9),
    ({"model.name": "resnet50", "model.base_width": 16}, IMAGES, 0.9),
    ({"model.name": "gpt", "model.preset": "tiny", "data.seq_len": 64}, TOKENS, 0.75),  # vocab from the data
    ({"model.name": "gpt", "model.n_layer": 3, "model.d_model": 128, "model.n_head": 4,
      "model.vocab_size": 512, "data.seq_len": 64}, TOKENS, 0.95),
])
def test_estimate_is_a_lower_bound_close_to_the_built_model(overrides, spec, tight):
    demand = model_demand(load_config(overrides))
    assert demand is not None
    real = real_parameters(overrides, spec)
    estimate = demand.bytes // 4
    assert tight * real <= estimate <= real, (estimate, real)


def test_too_big_for_this_machine_is_refused_with_the_numbers(big_machine):
    memory = 8 * 2**30
    mlp = load_config({"model.name": "mlp", "model.hidden_sizes": [32768, 32768, 32768]})
    with pytest.raises(ConfigError) as info:
        check_fits_in_memory(mlp, memory)
    assert info.value.field == "model.hidden_sizes"
    assert str(info.value) == ("config error: model.hidden_sizes = [32768, 32768, 32768]: asks for model.name=mlp "
                               "with at least 2.1B parameters: 8.0 GiB or more, but this machine has 8.0 GiB of "
                               "memory\n  use a smaller model.hidden_sizes (or set GPUTRAIN_SKIP_MEMORY_CHECK=1 to try "
                               "anyway)")
    check_fits_in_memory(mlp, 9 * 2**30)  # fits
    gpt = load_config({"model.name": "gpt", "model.preset": "gpt2-1.5b", "model.n_layer": 100})
    with pytest.raises(ConfigError) as info:
        check_fits_in_memory(gpt, memory)
    assert info.value.field == "model.n_layer" and "3.1B parameters: 11.5 GiB" in str(info.value)
    vocab = load_config({"model.name": "gpt", "model.d_model": 1024, "model.n_head": 16, "model.n_layer": 1,
                         "model.vocab_size": 4_000_000})
    with pytest.raises(ConfigError) as info:
        check_fits_in_memory(vocab, memory)
    assert info.value.field == "model.vocab_size"
    resnet = load_config({"model.name": "resnet50", "model.base_width": 1024})
    with pytest.raises(ConfigError) as info:
        check_fits_in_memory(resnet, memory)
    assert info.value.field == "model.base_width"


def test_synthetic_data_too_big_is_refused(big_machine):
    memory = 8 * 2**30
    data = load_config({"data.name": "synthetic", "data.shape": [3, 224, 224], "data.num_samples": 20_000})
    assert data_demand(data).bytes == 20_000 * 3 * 224 * 224 * 4
    with pytest.raises(ConfigError) as info:
        check_fits_in_memory(data, memory)
    assert info.value.field == "data.num_samples" and "fp32 samples of shape [3, 224, 224]" in str(info.value)
    lm = load_config({"data.name": "synthetic", "data.task": "lm", "data.seq_len": 4096, "data.num_samples": 200_000,
                      "model.name": "gpt", "model.preset": "tiny", "model.seq_len": 4096})
    with pytest.raises(ConfigError, match="data.num_samples = 200000: asks for 200000 4097-token windows"):
        check_fits_in_memory(lm, memory)
    assert data_demand(load_config({"data.name": "digits"})) is None


def test_load_config_checks_against_this_machine():
    memory = rank_memory_limit()
    assert memory is not None and memory.bytes > 2**30
    with pytest.raises(ConfigError) as info:  # 211 TB of weights: more than any machine
        load_config({"model.name": "gpt", "model.n_layer": 1024, "model.d_model": 65536, "model.n_head": 64})
    assert info.value.field == "model.d_model"
    assert f"but one rank can have {memory.bytes / 2**30:.1f} GiB ({memory.what})" in str(info.value)
    load_config({"model.name": "gpt", "model.preset": "gpt2-124m"})  # and the published sizes load
