"""train.precision=fp8 on a machine without a float8 GPU: the config path, the one-line refusal
(Python API and CLI, before anything heavy), and which layers would be converted. Where torchao is
installed, the conversion itself runs on CPU too (its float8 matmul has a CPU fallback)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gputrain import Trainer
from gputrain.config import load_config
from gputrain.data.tensors import TensorData
from gputrain.errors import ConfigError
from gputrain.fp8 import plan_fp8
from gputrain.precision import Precision, resolve_precision


def test_fp8_and_its_recipe_are_config_values():
    config = load_config(None, ["train.precision=fp8", "train.fp8_recipe=rowwise"])
    assert (config.train.precision, config.train.fp8_recipe) == ("fp8", "rowwise")
    assert load_config().train.fp8_recipe == "tensorwise"
    with pytest.raises(ConfigError, match=r"train\.fp8_recipe"):
        load_config(None, ["train.fp8_recipe=blockwise"])


def _one_line_refusal(err: pytest.ExceptionInfo[ConfigError]) -> str:
    message = str(err.value)
    assert "\n" not in message and "train.precision" in message
    return message


def test_refused_on_cpu_naming_the_gpu_that_would_do():
    with pytest.raises(ConfigError) as err:
        resolve_precision("fp8", torch.device("cpu"))
    message = _one_line_refusal(err)
    assert "sm_89" in message and "H100" in message and "device is cpu" in message and "bf16" in message


def test_refused_on_a_gpu_older_than_sm89(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(ConfigError) as err:
        resolve_precision("fp8", torch.device("cuda", 0))
    assert "NVIDIA A100-SXM4-80GB (sm_80)" in _one_line_refusal(err)


def test_without_torchao_says_how_to_install_it(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    with pytest.raises(ConfigError) as err:
        resolve_precision("fp8", torch.device("cuda", 0))
    assert "pip install 'gputrain[fp8]'" in _one_line_refusal(err)


def test_python_api_refuses_before_building(tmp_path):
    data = TensorData(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    model = nn.Sequential(nn.Linear(8, 2))
    with pytest.raises(ConfigError, match="fp8 needs"):
        Trainer(model, data, config={"train.precision": "fp8", "train.device": "cpu"}, run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_cli_refuses_with_exit_2_and_one_line(cli, tmp_path):
    result = cli("train", "--run-dir", "run", "train.precision=fp8", "train.device=cpu", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "fp8 needs" in lines[0] and "sm_89" in lines[0], result.stderr
    assert not (tmp_path / "run").exists()


def test_fp8_autocasts_the_rest_in_bf16():
    assert Precision("fp8", torch.device("cpu")).autocast_dtype == torch.bfloat16


def _meta_model() -> nn.Module:
    with torch.device("meta"):  # sizes only: no memory
        embed = nn.Embedding(512, 4096)
        head = nn.Linear(4096, 512, bias=False)
        head.weight = embed.weight  # tied, and not the last Linear here
        return nn.ModuleDict({
            "embed": embed, "big": nn.Linear(4096, 4096), "wide": nn.Linear(1024, 8192),
            "odd": nn.Linear(4096, 1000), "small": nn.Linear(768, 768), "head": head, "out": nn.Linear(4096, 16),
        })


def test_plan_keeps_heads_odd_and_small_layers_in_bf16():
    tensorwise = plan_fp8(_meta_model(), "tensorwise")
    assert tensorwise.converted == ["big", "wide"]
    assert tensorwise.skipped == {"odd": "dims not multiples of 16", "small": "too small to gain",
                                  "head": "output head", "out": "output head"}
    rowwise = plan_fp8(_meta_model(), "rowwise")  # needs K > 1024 as well: "wide" does not pay
    assert rowwise.converted == ["big"] and rowwise.skipped["wide"] == "too small to gain"
    assert "2 of 6 Linear layers in float8" in tensorwise.describe()


def test_gpt2_124m_plan():
    from gputrain.config.schema import ModelConfig
    from gputrain.data.spec import DataSpec
    from gputrain.models import build_model

    spec = DataSpec(task="lm", input_shape=(1024,), vocab_size=50304)
    with torch.device("meta"):
        model = build_model(ModelConfig(name="gpt", preset="gpt2-124m", vocab_size=50304, dropout=0.0), spec)
    plan = plan_fp8(model, "tensorwise")
    assert len(plan.converted) == 24 and all(n.endswith(("attn.c_attn", "mlp.c_fc")) for n in plan.converted)
    assert plan.skipped["lm_head"] == "output head"
    assert "this run is bf16" in plan_fp8(model, "rowwise").describe()  # its 768-wide layers are too small


def test_conversion_trains_under_bf16_autocast_on_cpu():
    pytest.importorskip("torchao.float8")
    from gputrain.fp8 import apply_fp8

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 2048), nn.ReLU(), nn.Linear(2048, 16))
    plan = apply_fp8(model, "tensorwise")
    assert plan.converted == ["0"] and type(model[0]).__name__ == "Float8Linear"
    assert type(model[2]) is nn.Linear  # the head
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(model(torch.randn(32, 64)), torch.randint(0, 16, (32,)))
    loss.backward()
    assert torch.isfinite(loss) and model[0].weight.grad is not None


def test_mfu_of_an_fp8_run_is_against_the_fp8_peak(monkeypatch, tmp_path):
    from gputrain.observe import peak

    monkeypatch.setenv("GPUTRAIN_CACHE_DIR", str(tmp_path))  # no bench result: the datasheet decides
    monkeypatch.setattr(peak, "device_name", lambda device: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(peak, "_sm_count", lambda device: 132)
    value, source = peak.resolve_peak(torch.device("cuda", 0), "fp8")
    assert value == pytest.approx(1979e12) and "fp8" in source
    assert peak.resolve_peak(torch.device("cuda", 0), "bf16")[0] == pytest.approx(989.5e12)
