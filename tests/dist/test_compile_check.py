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
