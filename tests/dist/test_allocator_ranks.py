"""The C allocator setting in real ranks (distributed/allocator.py): 2 gloo ranks started without
gputrain's launcher (so only the setting each rank makes for itself once its strategy is resolved)
train a tiny GPT under FSDP, with the threshold fixed before the model is parallelised and
materialised; each rank's glibc then still mmaps a 24 MiB block after a 30 MiB one
was freed (the threshold stays fixed: freed shards go back to the OS), and env.json records the
setting. Under DDP (nothing gathered per step) the ranks keep glibc as it is: the threshold rose.
The ranks `gputrain train --nproc-per-node 2` starts get no threshold from the launcher under auto
(a DDP job records glibc as it is), GLIBC_TUNABLES with GPUTRAIN_ALLOCATOR=glibc, and nothing with
GPUTRAIN_ALLOCATOR=off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gputrain.distributed.allocator import libc_name
from tests.dist.harness import ROOT, run_ranks
from tests.unit.distributed.malloc_probe import has_mallinfo2

GPT = [
    "data.name=synthetic",
    "data.task=lm",
    "data.seq_len=16",
    "data.num_samples=64",
    "model.name=gpt",
    "model.n_layer=2",
    "model.n_head=2",
    "model.d_model=16",
    "data.vocab_size=64",
    "train.batch_size=8",
    "train.epochs=1",
    "train.max_steps=2",
    "log.progress=none",
    "log.tensorboard=false",
    "checkpoint.enabled=false",
    'eval.metrics=["loss"]',
    "train.device=cpu",
]


def _rank(rank: int, run_dir: str, strategy: str) -> dict[str, Any]:
    from gputrain.distributed.allocator import applied_allocator
    from gputrain.train import build
    from gputrain.train.trainer import Trainer
    from tests.unit.distributed.malloc_probe import free_a_block, mmapped

    seen: list[str | None] = []
    parallelize = build.parallelize

    def recording(*args: Any, **kwargs: Any) -> Any:  # where the model is sharded and materialised
        seen.append(choice.name if (choice := applied_allocator()) else None)
        return parallelize(*args, **kwargs)

    build.parallelize = recording  # type: ignore[assignment]  # this spawned rank only
    Trainer.from_config(None, run_dir=run_dir, overrides=[*GPT, f"parallel.strategy={strategy}"]).fit()
    choice = applied_allocator()
    free_a_block(30 << 20)  # glibc's dynamic threshold would rise to 30 MiB here
    return {"choice": choice.name if choice else None, "before_parallelize": seen, "mmaps_24m": mmapped(24 << 20)}


@pytest.mark.skipif(libc_name() is None or not has_mallinfo2(), reason="glibc >= 2.33's malloc only")
@pytest.mark.parametrize(
    ("strategy", "choice", "mmaps_24m", "said"),
    [
        ("fsdp", "glibc-mmap-threshold", True, "glibc mmap threshold 128 KiB (a job that shards its parameters"),
        # DDP gathers nothing per step: an mmap per large tensor would cost page faults for nothing
        ("ddp", "system", False, "the C library's malloc, untouched by gputrain (no parameter shards gathered"),
    ],
)
def test_fsdp_ranks_run_with_the_fixed_threshold_ddp_ranks_without_and_the_run_records_which(
    tmp_path: Path, strategy: str, choice: str, mmaps_24m: bool, said: str
) -> None:
    run_dir = tmp_path / "run"
    ranks = run_ranks(_rank, str(run_dir), strategy, world=2, timeout_s=120)
    # in force before the model is materialised (and the constructor's evaluation check gathers it)
    assert ranks == [{"choice": choice, "before_parallelize": [choice], "mmaps_24m": mmaps_24m}] * 2
    started = json.loads((run_dir / "env.json").read_text())["run"]
    assert started["allocator"].startswith(said), started["allocator"]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"


@pytest.mark.skipif(libc_name() is None, reason="glibc's malloc only")
@pytest.mark.parametrize(
    ("env", "said"),
    [
        # auto: the launcher exports no threshold (it cannot know the strategy); a DDP rank sets none
        ({}, "the C library's malloc, untouched by gputrain (no parameter shards gathered on the CPU side"),
        (
            {"GPUTRAIN_ALLOCATOR": "glibc"},
            "glibc mmap threshold 128 KiB (GPUTRAIN_ALLOCATOR=glibc; from the process's start (the launcher's "
            "GLIBC_TUNABLES))",
        ),
        ({"GPUTRAIN_ALLOCATOR": "off"}, "the C library's malloc, untouched by gputrain (GPUTRAIN_ALLOCATOR=off)"),
    ],
)
def test_the_launcher_gives_the_ranks_the_threshold_only_where_glibc_is_asked_for(
    tmp_path: Path, env: dict[str, str], said: str
) -> None:
    run_dir = tmp_path / "run"
    mlp = [
        "model.name=mlp",
        "data.name=synthetic",
        "data.shape=[8]",
        "data.num_samples=64",
        "model.hidden_sizes=[8]",
        "train.batch_size=16",
        "train.max_steps=2",
        "log.progress=none",
        "log.tensorboard=false",
        "checkpoint.enabled=false",
        "parallel.strategy=ddp",
        "train.device=cpu",
    ]
    clean = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "WORLD_SIZE", "GPUTRAIN_ALLOCATOR")}
    result = subprocess.run(
        [sys.executable, "-m", "gputrain", "train", "--nproc-per-node", "2", "--run-dir", str(run_dir), *mlp],
        cwd=ROOT,
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads((run_dir / "env.json").read_text())["run"]["allocator"].startswith(said)
