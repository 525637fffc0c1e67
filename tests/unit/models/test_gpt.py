"""The GPT: GPT-2's size, causality, init, and every way its config can be wrong."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from gputrain.config import load_config
from gputrain.data.spec import DataSpec
from gputrain.errors import ConfigError
from gputrain.models import build_model
from gputrain.models.gpt import GPT


def _lm(seq_len: int = 16, vocab: int = 40) -> DataSpec:
    return DataSpec(task="lm", input_shape=(seq_len,), vocab_size=vocab)


def _build(spec: DataSpec, device: str = "cpu", **fields: object) -> GPT:
    config = load_config({"model.name": "gpt", "data.seq_len": spec.input_shape[0], **fields})
    with torch.device(device):
        return build_model(config.model, spec)  # type: ignore[return-value]


def test_gpt2_124m_has_the_published_parameter_count() -> None:
    model = _build(_lm(1024, 50257), device="meta", **{"model.preset": "gpt2-124m"})
    assert sum(p.numel() for p in model.parameters()) == 124_439_808  # shared embedding counted once
    assert model.lm_head.weight is model.wte.weight


@pytest.mark.parametrize(("preset", "millions"), [("gpt2-350m", 354.8), ("gpt2-774m", 774.0), ("gpt2-1.5b", 1557.6)])
def test_larger_presets_have_gpt2_sizes(preset: str, millions: float) -> None:
    model = _build(_lm(1024, 50257), device="meta", **{"model.preset": preset})
    assert sum(p.numel() for p in model.parameters()) / 1e6 == pytest.approx(millions, abs=0.1)


def test_a_later_token_never_changes_an_earlier_output() -> None:
    torch.manual_seed(0)
    model = _build(_lm(), **{"model.preset": "tiny"}).eval()
    x = torch.randint(40, (2, 16))
    changed = x.clone()
    changed[:, 9:] = torch.randint(40, (2, 7))
    with torch.no_grad():
        a, b = model(x), model(changed)
    torch.testing.assert_close(a[:, :9], b[:, :9], rtol=0, atol=1e-6)
    assert (a[:, 9:] - b[:, 9:]).abs().max() > 1e-3  # and the later positions do see the change


def test_gpt2_init_scales_the_residual_projections() -> None:
    torch.manual_seed(0)
    model = _build(_lm(vocab=512), **{"model.n_layer": 8, "model.n_head": 4, "model.d_model": 256})
    assert model.wte.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.blocks[0].mlp.c_fc.weight.std().item() == pytest.approx(0.02, rel=0.05)
    residual = 0.02 / math.sqrt(2 * 8)
    assert model.blocks[3].attn.c_proj.weight.std().item() == pytest.approx(residual, rel=0.05)
    assert model.blocks[3].mlp.c_proj.weight.std().item() == pytest.approx(residual, rel=0.05)
    assert model.blocks[0].attn.c_attn.bias.abs().max().item() == 0.0


def test_another_init_scheme_replaces_the_linear_weights() -> None:
    torch.manual_seed(0)
    model = _build(_lm(vocab=512), **{"model.preset": "tiny", "model.init": "xavier_uniform"})
    fc = model.blocks[0].mlp.c_fc.weight  # [256, 64]: xavier's std with gelu's (relu) gain is sqrt(2)·sqrt(2/320)
    assert fc.std().item() == pytest.approx(math.sqrt(2) * math.sqrt(2 / 320), rel=0.05)
    assert model.wpe.weight.std().item() == pytest.approx(0.02, rel=0.1)


def test_sizes_activation_and_dropout_come_from_the_config() -> None:
    model = _build(_lm(), **{"model.n_layer": 3, "model.n_head": 2, "model.d_model": 32, "model.dropout": 0.1,
                            "model.bias": False, "model.vocab_size": 64})
    assert len(model.blocks) == 3 and model.wte.weight.shape == (64, 32)
    assert model.wpe.weight.shape == (16, 32)  # no preset, no model.seq_len: the data's window
    assert model.blocks[0].attn.c_attn.bias is None and model.ln_f.bias is None
    assert model.drop.p == 0.1
    gelu = model.blocks[0].mlp.act
    assert isinstance(gelu, nn.GELU) and gelu.approximate == "tanh"  # activation=auto: GPT-2's gelu
    silu = _build(_lm(), **{"model.preset": "tiny", "model.activation": "silu"}).blocks[0].mlp.act
    assert isinstance(silu, nn.SiLU)


def test_data_window_beyond_the_context_names_both_fields() -> None:
    with pytest.raises(ConfigError) as err:
        load_config({"model.name": "gpt", "model.preset": "tiny", "data.seq_len": 256})
    assert str(err.value).startswith("config error: data.seq_len = 256: is longer than the model's context "
                                     "(model.preset=tiny's context = 128)")
    with pytest.raises(ConfigError, match=r"data.seq_len = 64: .*\(model.seq_len = 32\)"):
        load_config({"model.name": "gpt", "model.seq_len": 32, "data.seq_len": 64})


def test_bad_sizes_and_data_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"model.n_head = 5: d_model \(64\) must be a multiple of n_head \(5\)"):
        load_config({"model.name": "gpt", "model.preset": "tiny", "model.n_head": 5})
    with pytest.raises(ConfigError, match=r"model.vocab_size = 30: is smaller than the data's vocabulary \(40 ids\)"):
        _build(_lm(), **{"model.preset": "tiny", "model.vocab_size": 30})
    with pytest.raises(ConfigError, match=r"model.name = 'gpt': gpt models token sequences"):
        _build(DataSpec(task="classification", input_shape=(1, 8, 8), num_classes=10), **{"model.preset": "tiny"})


def test_forward_rejects_a_sequence_longer_than_the_context() -> None:
    model = _build(_lm(), **{"model.preset": "tiny", "model.seq_len": 16})
    with pytest.raises(ValueError, match="17 tokens is longer than the model's context \\(16\\)"):
        model(torch.zeros(1, 17, dtype=torch.long))
