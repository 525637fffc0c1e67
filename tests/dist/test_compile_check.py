"""train.compile under DDP: each rank checks its first step against eager on its own module, the
ranks agree, and where compiled gradients are wrong every rank trains eagerly, so 2 ranks still
train exactly like 1 process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.dist.harness import run_ranks
from tests.unit.train.test_compile import QUIET, _data, _WrongWhenCompiled


def wrong_when_compiled(rank: int, run_dir: str) -> dict[str, Any]:
    from gputrain import Trainer

    torch.manual_seed(0)
    model = _WrongWhenCompiled()
    config = {**QUIET, "train.compile": True, "parallel.strategy": "ddp"}
    summary = Trainer(model, _data(), config=config, run_dir=run_dir).fit()
    weights = {k: v.tolist() for k, v in model.state_dict().items()}  # plain lists: the process ends after it
    return {"compile": summary["train"]["compile"], "weights": weights}


def test_wrong_compiled_gradients_on_two_ranks_train_like_one_eager_process(tmp_path: Path) -> None:
    from gputrain import Trainer

    ranks = run_ranks(wrong_when_compiled, str(tmp_path / "ddp"), timeout_s=240)
    torch.manual_seed(0)
    model = _WrongWhenCompiled()
    Trainer(model, _data(), config=QUIET, run_dir=tmp_path / "eager").fit()
    for got in ranks:
        assert got["compile"].startswith("off: rank 0: first.weight: gradient norm 0 compiled")
        for key, value in model.state_dict().items():
            torch.testing.assert_close(torch.tensor(got["weights"][key]), value, rtol=1e-5, atol=1e-6, msg=key)


def gpt_compiled_whole(rank: int, run_dir: str) -> dict[str, Any]:
    """The tiny GPT under DDP, compiled: the whole model in one graph (DDP wraps nothing between the
    blocks; torch's DDPOptimizer splits the graph at gradient buckets where there are several)."""
    from torch._dynamo.utils import counters

    from gputrain import Trainer
    from gputrain.config.schema import ModelConfig
    from gputrain.data.spec import DataSpec
    from gputrain.data.tensors import TensorData
    from gputrain.models import build_model

    spec = DataSpec(task="lm", input_shape=(16,), vocab_size=64)
    tokens = torch.randint(0, 64, (64, 17), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="gpt", preset="tiny", dropout=0.0), spec)
    config = {**QUIET, "train.compile": True, "parallel.strategy": "ddp", "train.max_steps": 3}
    data = TensorData(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
    summary = Trainer(model, data, spec=spec, config=config, run_dir=run_dir).fit()
    return {
        "compile": summary["train"]["compile"],
        "checksum": sum(float(p.double().sum()) for p in model.parameters()),
        "whole": "forward" in vars(model),
        "blocks": sum("forward" in vars(b) for b in model.blocks),
        "graphs": counters["stats"]["unique_graphs"],
        "breaks": sum(counters["graph_break"].values()),
        "names": sorted(model.state_dict()),
    }


def test_a_gpt_under_ddp_compiles_whole_checks_its_first_step_and_keeps_its_names(tmp_path: Path) -> None:
    ranks = run_ranks(gpt_compiled_whole, str(tmp_path / "ddp"), timeout_s=240)
    for got in ranks:
        assert got["compile"] == "compiled (first step's gradients equal eager's)"
        assert got["whole"] and got["blocks"] == 0  # one compiled forward, none per block
        assert got["graphs"] >= 1 and got["breaks"] == 0
        assert not any("_orig_mod" in name for name in got["names"])
    assert ranks[0]["checksum"] == ranks[1]["checksum"]  # the gradients were all-reduced: the same weights
