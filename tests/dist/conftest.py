"""One spawned 2-rank gloo job runs every trainer-level case of the distributed tests, because
starting processes is the slow part; the tests then compare the run directories it leaves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.dist.harness import run_ranks
from tests.dist.jobs import BASE, USER_TP_CONFIG, dist_job, user_model_and_data

DEEP = ["model.hidden_sizes=[32,32,32]"]
CKPT = ["checkpoint.enabled=true", "checkpoint.every_steps=2"]

# name -> (overrides on 2 ranks, name of the one-process run it must equal)
TWO_RANK_CASES: dict[str, tuple[list[str], str]] = {
    "ddp": (["parallel.strategy=ddp", "log.breakdown_every=1"], "single"),
    "fsdp": (["parallel.strategy=fsdp", "log.breakdown_every=1"], "single"),
    "ddp_accum": (["parallel.strategy=ddp", "train.grad_accum=2"], "single"),
    "ddp_compile": (["parallel.strategy=ddp", "train.compile=true"], "single"),  # the mlp: an nn.Sequential
    "fsdp_accum": (["parallel.strategy=fsdp", "train.grad_accum=2"], "single"),
    "fsdp_ac_full": (["parallel.strategy=fsdp", "parallel.activation_checkpointing=full"], "single"),
    "ddp_ac_selective": (["parallel.strategy=ddp", "parallel.activation_checkpointing=selective"], "single"),
    "tp": (["parallel.strategy=tp", "log.breakdown_every=1"], "single"),
    "pp_gpipe": (["parallel.strategy=pp", "parallel.pp_schedule=gpipe", "train.grad_accum=2"], "single"),
    "pp_1f1b": (["parallel.strategy=pp", "parallel.pp_schedule=1f1b", "train.grad_accum=2"], "single"),
    "pp_interleaved": (["parallel.strategy=pp", "parallel.pp_schedule=interleaved_1f1b", "train.grad_accum=2",
                        *DEEP], "single_deep"),
    "hybrid_replicate": (["parallel.strategy=hybrid", "parallel.dp_replicate=2", "parallel.dp_shard=1"], "single"),
    "hybrid_shard": (["parallel.strategy=hybrid", "parallel.dp_replicate=1", "parallel.dp_shard=2"], "single"),
    "hybrid_tp": (["parallel.strategy=hybrid", "parallel.dp_shard=1", "parallel.tp=2"], "single"),
    "hybrid_pp": (["parallel.strategy=hybrid", "parallel.dp_shard=1", "parallel.pp=2", "train.grad_accum=2"],
                  "single"),
    # checkpoints: written by FSDP on 2 ranks (sync and async), resumed by other layouts from step 2
    "fsdp_ckpt": (["parallel.strategy=fsdp", *CKPT], "single"),
    "fsdp_async_ckpt": (["parallel.strategy=fsdp", *CKPT, "checkpoint.async_save=true"], "single"),
    "ddp_from_fsdp": (["parallel.strategy=ddp", "checkpoint.resume={fsdp_ckpt}/checkpoints/step-2"], "single"),
    "tp_from_fsdp": (["parallel.strategy=tp", "checkpoint.resume={fsdp_async_ckpt}/checkpoints/step-2"], "single"),
    "pp_from_fsdp": (["parallel.strategy=pp", "parallel.pp_schedule=gpipe",
                      "checkpoint.resume={fsdp_ckpt}/checkpoints/step-2"], "single"),
    "fsdp_from_single": (["parallel.strategy=fsdp", "checkpoint.resume={single_ckpt}/checkpoints/step-2"], "single"),
    # written by a pipeline (each rank holds one stage's parameters), resumed on one process
    "pp_ckpt": (["parallel.strategy=pp", "parallel.pp_schedule=gpipe", "train.grad_accum=2", *CKPT], "single"),
}
SINGLE_CASES = {"single": [], "single_deep": DEEP, "single_ckpt": CKPT}


def step_losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["loss"] for row in rows if "split" not in row}


@pytest.fixture(scope="session")
def dist_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run directories by case name, and what the job's other checks returned (rank 0's)."""
    import torch.nn.functional as F

    from gputrain.train.trainer import Trainer

    root = tmp_path_factory.mktemp("dist")
    dirs = {name: root / name for name in [*SINGLE_CASES, *TWO_RANK_CASES]}
    for name, overrides in SINGLE_CASES.items():
        Trainer.from_config(None, run_dir=dirs[name], overrides=BASE + ["parallel.strategy=none", *overrides]).fit()
    fill = {name: str(path) for name, path in dirs.items()}
    runs = [(str(dirs[n]), [o.format(**fill) for o in overrides]) for n, (overrides, _) in TWO_RANK_CASES.items()]
    nonfinite_dirs = {strategy: str(root / f"nonfinite_{strategy}") for strategy in ("ddp", "fsdp")}
    # a model of the user's own: on one process, and on 2 ranks under tp with its plan as a dict and as a function
    model, data = user_model_and_data()
    dirs["user_single"] = root / "user_single"
    Trainer(model, data, loss_fn=F.cross_entropy, config={**USER_TP_CONFIG, "parallel.strategy": "none"},
            run_dir=dirs["user_single"]).fit()
    user_tp_dirs = {plan: root / f"user_tp_{plan}" for plan in ("dict", "function", "none")}
    dirs.update({f"user_tp_{plan}": path for plan, path in user_tp_dirs.items()})
    results = run_ranks(dist_job, runs, nonfinite_dirs, {k: str(v) for k, v in user_tp_dirs.items()}, timeout_s=300)
    return {"dirs": dirs, "gpt_tp": results[0]["gpt_tp"], "by_rank": results}


@pytest.fixture(scope="session")
def dist_runs(dist_results: dict[str, Any]) -> dict[str, Path]:
    return dist_results["dirs"]
