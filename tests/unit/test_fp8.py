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
    config = load_config(None, ["train.precision=fp8", "train.fp8_recipe=rowwise", "train.compile=true"])
    assert (config.train.precision, config.train.fp8_recipe) == ("fp8", "rowwise")
    assert load_config().train.fp8_recipe == "tensorwise"
    with pytest.raises(ConfigError, match=r"train\.fp8_recipe") as err:
        load_config(None, ["train.fp8_recipe=blockwise"])
    assert "tensorwise" in str(err.value) and "rowwise" in str(err.value)


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
    config = {"train.precision": "fp8", "train.device": "cpu", "train.compile": True}
    with pytest.raises(ConfigError, match="fp8 needs"):
        Trainer(model, data, config=config, run_dir=tmp_path / "run").setup()
    assert not (tmp_path / "run").exists()


def test_cli_refuses_with_exit_2_and_one_line(cli, tmp_path):
    result = cli(
        "train", "--run-dir", "run", "train.precision=fp8", "train.compile=true", "train.device=cpu", cwd=tmp_path
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "fp8 needs" in lines[0] and "sm_89" in lines[0], result.stderr
    assert not (tmp_path / "run").exists()


def test_fp8_without_compile_is_refused_with_the_config():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["train.precision=fp8"])
    message = str(err.value)
    assert "\n" not in message and "train.compile" in message and "train.compile=true" in message
    assert "0.45× bf16" in message
    assert load_config(None, ["train.precision=fp8", "train.compile=true"]).train.compile
    assert not load_config(None, ["train.precision=bf16"]).train.compile  # only fp8 needs it


def test_python_api_refuses_fp8_without_compile(tmp_path):
    data = TensorData(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    with pytest.raises(ConfigError, match=r"train\.compile.*needs train\.compile=true"):
        Trainer(nn.Linear(8, 2), data, config={"train.precision": "fp8"}, run_dir=tmp_path / "run").setup()
    assert not (tmp_path / "run").exists()


def test_cli_refuses_fp8_without_compile_in_one_line(cli, tmp_path):
    result = cli("train", "--run-dir", "run", "train.precision=fp8", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs train.compile=true" in lines[0], result.stderr
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


def _meta_gpt(**sizes: object) -> nn.Module:
    from gputrain.config.schema import ModelConfig
    from gputrain.data.spec import DataSpec
    from gputrain.models import build_model

    spec = DataSpec(task="lm", input_shape=(1024,), vocab_size=50304)
    with torch.device("meta"):  # the shapes, no memory (a d_model 2048 GPT holds 1.3B parameters)
        return build_model(ModelConfig(name="gpt", vocab_size=50304, dropout=0.0, **sizes), spec)


def test_gpt2_124m_plan():
    model = _meta_gpt(preset="gpt2-124m")
    plan = plan_fp8(model, "tensorwise")
    assert len(plan.converted) == 24 and all(n.endswith(("attn.c_attn", "mlp.c_fc")) for n in plan.converted)
    assert plan.skipped["lm_head"] == "output head"
    # the 768-wide outputs (attention's and the MLP's projections): N 768 <= 1024 with K <= 4096
    assert sum(r == "too small to gain" for r in plan.skipped.values()) == 24
    # 12 × (768·2304 + 768·3072) of 12 × (768·2304 + 768·768 + 768·3072 + 3072·768) + 768·50304
    assert plan.share == pytest.approx(12 * 768 * 5376 / (12 * 768 * 9216 + 768 * 50304))
    assert not plan.expected_to_pay and "not expected to pay" in plan.describe()
    assert "d_model 2048" in plan.expectation()
    assert "this run is bf16" in plan_fp8(model, "rowwise").describe()  # its 768-wide layers are too small
    assert plan_fp8(model, "rowwise").converted == []


def test_d_model_2048_plan_converts_every_block_linear():
    model = _meta_gpt(n_layer=24, n_head=16, d_model=2048)
    tensorwise, rowwise = plan_fp8(model, "tensorwise"), plan_fp8(model, "rowwise")
    assert len(tensorwise.converted) == 96 and tensorwise.skipped == {"lm_head": "output head"}
    assert tensorwise.expected_to_pay and tensorwise.share > 0.9
    assert "expected to pay" in tensorwise.describe() and "not expected" not in tensorwise.describe()
    # rowwise also needs N > 2048 (or N > 4096 where K <= 2048): attention's 2048→2048 and the MLP's
    # 8192→2048 projections stay in bf16; c_attn (2048→6144) and c_fc (2048→8192) convert
    assert len(rowwise.converted) == 48 and all(n.endswith(("c_attn", "c_fc")) for n in rowwise.converted)
    assert rowwise.expected_to_pay


def test_plan_recorded_as_data():
    record = plan_fp8(_meta_gpt(preset="gpt2-124m"), "tensorwise").to_dict()
    assert record["recipe"] == "tensorwise" and (record["converted"], record["linear_layers"]) == (24, 49)
    assert len(record["skipped"]["too small to gain"]) == 24 and record["skipped"]["output head"] == ["lm_head"]
    assert record["expected_to_pay"] is False and "not expected to pay" in record["expectation"]


def test_plan_matches_torchaos_own_filter():
    """The thresholds are torchao's: where it is installed, its `_auto_filter_for_recipe` agrees
    layer by layer (the output head aside, which torchtitan also keeps out by name)."""
    pytest.importorskip("torchao.float8", reason="torchao is not installed: the copy of its thresholds is tested alone")
    from torchao.float8 import _auto_filter_for_recipe

    shapes = [(k, n) for k in (512, 768, 1000, 1024, 2048, 3072, 4096, 4112, 8192) for n in (768, 1024, 1040, 2048,
              3072, 4096, 4112, 6144, 8192)]
    for recipe in ("tensorwise", "rowwise"):
        theirs = _auto_filter_for_recipe(recipe, filter_fqns=[])
        with torch.device("meta"):
            layers = nn.ModuleDict({f"l{k}_{n}": nn.Linear(k, n) for k, n in shapes})
            layers["head"] = nn.Linear(16, 16)  # the last Linear: the output head
        plan = plan_fp8(layers, recipe)  # type: ignore[arg-type]
        agreed = {name for name, m in layers.items() if name != "head" and theirs(m, name)}
        assert set(plan.converted) == agreed, recipe


def test_conversion_trains_under_bf16_autocast_on_cpu():
    pytest.importorskip("torchao.float8")
    from gputrain.fp8 import apply_fp8

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 2048), nn.ReLU(), nn.Linear(2048, 16))
    plan = apply_fp8(model, plan_fp8(model, "tensorwise"))
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


def test_plan_is_in_the_start_facts_env_json_records(monkeypatch):
    """place_run decides the plan from the shapes; env.json's "run" block (start_facts) records it.
    The device check is bypassed: a CPU cannot run float8, the decision does not need one."""
    from gputrain.train import build

    monkeypatch.setattr(build, "resolve_precision", lambda requested, device: ("fp8", "asked for"))
    config = load_config(None, ["train.precision=fp8", "train.compile=true", "train.device=cpu"])
    model = nn.Sequential(nn.Linear(64, 2048), nn.ReLU(), nn.Linear(2048, 16))
    data = TensorData(torch.randn(8, 64), torch.randint(0, 16, (8,)))
    place = build.place_run(config, model, data)
    record = place.start_facts()["fp8"]
    assert (record["converted"], record["linear_layers"]) == (1, 2) and record["skipped"] == {"output head": ["2"]}
    assert type(model[0]) is nn.Linear  # deciding changes nothing
    monkeypatch.undo()
    bf16 = build.place_run(load_config(None, ["train.device=cpu"]), model, data)
    assert "fp8" not in bf16.start_facts()
