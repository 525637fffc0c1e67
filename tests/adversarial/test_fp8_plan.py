"""fp8's decisions, all made before a GPU is touched (issue 28, part 2): which Linear layers go to
float8 at the exact edges of torchao's size thresholds for each recipe (written out here from
torchao's `_auto_filter_for_tensorwise` / `_auto_filter_for_rowwise`, so the table holds where
torchao is not installed), the output head and odd shapes kept in bf16, and the configs that
cannot train in fp8 (no compile, an unknown recipe) refused in one line naming the field."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gputrain.config import load_config
from gputrain.errors import ConfigError
from gputrain.fp8 import plan_fp8
from tests.conftest import run_cli

SMALL, ODD = "too small to gain", "dims not multiples of 16"

# (in_features K, out_features N, tensorwise's reason, rowwise's reason); None: converted
EDGES = [
    # tensorwise: kept where K <= 4096 and N <= 1024
    (4096, 1024, SMALL, SMALL),
    (4112, 1024, None, SMALL),  # K past 4096; rowwise: N <= 2048
    (4096, 1040, None, SMALL),  # N past 1024
    (768, 3072, None, SMALL),  # GPT-2 124M's c_fc: tensorwise converts; rowwise: K <= 1024
    (3072, 768, SMALL, SMALL),  # GPT-2 124M's MLP projection
    (768, 768, SMALL, SMALL),
    # rowwise: kept where N <= 2048, or K <= 1024, or N <= 4096 and K <= 2048
    (8192, 2048, None, SMALL),  # N <= 2048
    (8192, 2064, None, None),
    (1024, 8192, None, SMALL),  # K <= 1024
    (1040, 8192, None, None),
    (2048, 4096, None, SMALL),  # N <= 4096 and K <= 2048
    (2064, 4096, None, None),
    (2048, 4112, None, None),
    (2048, 6144, None, None),  # a d_model 2048 GPT's c_attn
    # hardware: both dimensions multiples of 16, before any size rule
    (4104, 8192, ODD, ODD),
    (8192, 4104, ODD, ODD),
    (8192, 8200, ODD, ODD),
]


@pytest.mark.parametrize(("k", "n", "tensorwise", "rowwise"), EDGES)
def test_threshold_edges(k: int, n: int, tensorwise: str | None, rowwise: str | None) -> None:
    with torch.device("meta"):
        model = nn.ModuleDict({"layer": nn.Linear(k, n), "head": nn.Linear(16, 16)})
    for recipe, expected in (("tensorwise", tensorwise), ("rowwise", rowwise)):
        plan = plan_fp8(model, recipe)  # type: ignore[arg-type]
        assert plan.skipped.get("layer") == expected, (recipe, k, n)
        assert ("layer" in plan.converted) is (expected is None)
        assert plan.skipped["head"] == "output head"


def _tied() -> nn.Module:
    with torch.device("meta"):
        embed = nn.Embedding(50304, 4096)
        head = nn.Linear(4096, 50304, bias=False)
        head.weight = embed.weight
        # the tied head is not the last Linear: kept for its shared weight; the last one as the output
        return nn.ModuleDict({"embed": embed, "head": head, "big": nn.Linear(8192, 8192), "out": nn.Linear(8192, 16)})


def _nested() -> nn.Module:
    with torch.device("meta"):
        return nn.Sequential(nn.Sequential(nn.Linear(8192, 8192), nn.GELU()), nn.ModuleList([nn.Linear(8192, 64)]))


def _no_linear() -> nn.Module:
    with torch.device("meta"):
        return nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten())


def _only_head() -> nn.Module:
    with torch.device("meta"):
        return nn.Sequential(nn.Linear(8192, 8192))


# (model, recipe, converted, skipped, expected to pay, words the plan's line holds)
MODELS = [
    # the 50k-wide head does 3× the big layer's work: float8 would cover a quarter, not expected to pay
    (_tied, "tensorwise", ["big"], {"head": "output head", "out": "output head"}, False, "1 of 3 Linear layers"),
    (_nested, "rowwise", ["0.0"], {"1.0": "output head"}, True, "expected to pay"),
    (_no_linear, "tensorwise", [], {}, False, "this run is bf16"),
    (_only_head, "tensorwise", [], {"0": "output head"}, False, "this run is bf16"),
]


@pytest.mark.parametrize(("make", "recipe", "converted", "skipped", "pays", "words"), MODELS)
def test_model_shapes(make, recipe, converted, skipped, pays, words) -> None:  # type: ignore[no-untyped-def]
    plan = plan_fp8(make(), recipe)
    assert (plan.converted, plan.skipped, plan.expected_to_pay) == (converted, skipped, pays)
    assert words in plan.describe() and "\n" not in plan.describe()


# config overrides that cannot train in fp8, and what the one line must hold
REFUSED = [
    (["train.precision=fp8"], "train.compile = False: train.precision=fp8 needs train.compile=true"),
    (["train.precision=fp8", "train.compile=false"], "needs train.compile=true"),
    (["train.precision=fp8", "train.compile=true", "train.fp8_recipe=blockwise"], "choose from tensorwise, rowwise"),
    (["train.fp8_recipe=rowwise_with_gw_hp"], "train.fp8_recipe = 'rowwise_with_gw_hp': unknown choice"),
    (["train.fp8_recipe=ROWWISE"], "train.fp8_recipe = 'ROWWISE'"),
    (["train.fp8_recipe="], "train.fp8_recipe = ''"),
    (["train.fp8_recipe=1"], "train.fp8_recipe = 1"),
]


@pytest.mark.parametrize(("overrides", "words"), REFUSED)
def test_refused_configs(overrides: list[str], words: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert words in str(err.value).splitlines()[0]


ACCEPTED = [
    ["train.precision=fp8", "train.compile=true"],
    ["train.precision=fp8", "train.compile=true", "train.fp8_recipe=rowwise"],
    ["train.fp8_recipe=rowwise"],  # the recipe alone: unused outside fp8, and no compile needed
    ["train.precision=bf16"],
]


@pytest.mark.parametrize("overrides", ACCEPTED)
def test_accepted_configs(overrides: list[str]) -> None:
    load_config(None, overrides)


def test_cli_fp8_without_compile_exit_2_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("train", "--run-dir", "run", "data.name=synthetic", "train.precision=fp8", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "train.compile" in lines[0] and "0.45×" in lines[0], result.stderr
    assert not (tmp_path / "run").exists()
