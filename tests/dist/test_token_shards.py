"""A prepared folder of token shards on 2 gloo ranks trains exactly as one process with the same
global batch (the BatchPlan gives each rank its part of every global batch, each rank reading only
its own windows from the maps), and a checkpoint taken mid-epoch resumes on the other world size,
2 -> 1 and 1 -> 2, to the unbroken run's losses and weights (issue 30 §3). The windows span shard
boundaries and the run crosses an epoch. About 40 s on 2 idle cores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gputrain import Trainer
from tests.dist.harness import run_ranks
from tests.dist.shard_jobs import shard_runs
from tests.unit.data.prepared_files import token_ids, write_prepared

# 40 training windows of 16 tokens: 5 steps of 8 an epoch; checkpoints at steps 3 (mid-epoch) and 6. SGD: Adam
# would scale the rounding noise of gradients that are 0 in exact arithmetic (the key bias's) up to the step size
BASE = ["model.name=gpt", "model.n_layer=1", "model.n_head=2", "model.d_model=16", "model.dropout=0.0",
        "data.name=tokens", "data.seq_len=16", "data.num_workers=0", "train.batch_size=8", "train.max_steps=7",
        "train.epochs=5", "train.seed=3", "optim.name=sgd", "optim.lr=0.5", "log.every_steps=1",
        "log.tensorboard=false", "log.progress=none", "eval.every_epochs=0", "checkpoint.enabled=true",
        "checkpoint.every_steps=3", "checkpoint.keep_last=5", "checkpoint.resume=never", "train.device=cpu"]
DDP = ["parallel.strategy=ddp"]


def _losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["loss"] for row in rows if "split" not in row}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("token_shards")
    ids = token_ids(16 * 40 + 1, vocab=50)
    shards = [ids[a:b] for a, b in ((0, 100), (100, 101), (101, 350), (350, len(ids)))]  # cuts inside windows
    data = write_prepared(root / "corpus", shards, [token_ids(100, seed=1)])
    base = [f"data.path={data}"]
    dirs = {name: root / name for name in ("single", "ddp", "ddp_from_single", "single_from_ddp")}
    Trainer.from_config(None, run_dir=dirs["single"], overrides=BASE + base + ["parallel.strategy=none"]).fit()
    two = [(str(dirs["ddp"]), base + DDP),
           (str(dirs["ddp_from_single"]), [*base, *DDP, f"checkpoint.resume={dirs['single']}/checkpoints/step-3"])]
    assert run_ranks(shard_runs, two, timeout_s=240) == [[7, 7]] * 2
    Trainer.from_config(None, run_dir=dirs["single_from_ddp"], overrides=BASE + base + [
        "parallel.strategy=none", f"checkpoint.resume={dirs['ddp']}/checkpoints/step-3"]).fit()
    return dirs


@pytest.mark.parametrize(("case", "steps"), [("ddp", [1, 2, 3, 4, 5, 6, 7]), ("ddp_from_single", [4, 5, 6, 7]),
                                             ("single_from_ddp", [4, 5, 6, 7])])
def test_two_ranks_and_a_resume_on_the_other_world_size_equal_one_process(
    runs: dict[str, Path], case: str, steps: list[int]
) -> None:
    expected, got = _losses(runs["single"]), _losses(runs[case])
    assert sorted(got) == steps
    torch.testing.assert_close(torch.tensor([got[s] for s in steps]), torch.tensor([expected[s] for s in steps]),
                               rtol=1e-5, atol=1e-5)
    ref, weights = load_file(runs["single"] / "model.safetensors"), load_file(runs[case] / "model.safetensors")
    assert weights.keys() == ref.keys()
    for key in ref:
        torch.testing.assert_close(weights[key], ref[key], rtol=1e-5, atol=1e-5, msg=f"{case}: {key}")
