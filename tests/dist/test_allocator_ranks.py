"""The C allocator setting in real ranks (distributed/allocator.py): 2 gloo ranks started without
gputrain's launcher (so only the setting each rank makes for itself as it joins) train a tiny GPT
under FSDP; each rank's glibc then still mmaps a 24 MiB block after a 30 MiB one was freed (the
threshold stays fixed: freed shards go back to the OS), and env.json records the setting. The ranks
`gputrain train --nproc-per-node 2` starts have it from their start (GLIBC_TUNABLES), and
GPUTRAIN_ALLOCATOR=off turns it off."""

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
    "parallel.strategy=fsdp",
    "log.progress=none",
    "log.tensorboard=false",
    "checkpoint.enabled=false",
    'eval.metrics=["loss"]',
    "train.device=cpu",
]


def _rank(rank: int, run_dir: str) -> dict[str, Any]:
    from gputrain.distributed.allocator import applied_allocator
    from gputrain.train.trainer import Trainer
    from tests.unit.distributed.malloc_probe import free_a_block, mmapped

    Trainer.from_config(None, run_dir=run_dir, overrides=GPT).fit()
    choice = applied_allocator()
    free_a_block(30 << 20)  # glibc's dynamic threshold would rise to 30 MiB here
    return {"choice": choice.name if choice else None, "mmaps_24m": mmapped(24 << 20)}


@pytest.mark.skipif(libc_name() is None or not has_mallinfo2(), reason="glibc >= 2.33's malloc only")
def test_each_fsdp_rank_runs_with_the_fixed_threshold_and_the_run_records_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    ranks = run_ranks(_rank, str(run_dir), world=2, timeout_s=120)
    assert ranks == [{"choice": "glibc-mmap-threshold", "mmaps_24m": True}] * 2
    started = json.loads((run_dir / "env.json").read_text())["run"]
    assert started["allocator"].startswith("glibc mmap threshold 128 KiB (a job of several processes")
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"


@pytest.mark.skipif(libc_name() is None, reason="glibc's malloc only")
@pytest.mark.parametrize(
    ("env", "said"),
    [
        (
            {},
            "glibc mmap threshold 128 KiB (a job of several processes: freed shards go back to the OS; from the "
            "process's start (the launcher's GLIBC_TUNABLES))",
        ),
        ({"GPUTRAIN_ALLOCATOR": "off"}, "the C library's malloc, untouched by gputrain (GPUTRAIN_ALLOCATOR=off)"),
    ],
)
def test_the_ranks_the_launcher_starts_have_it_from_their_start_unless_switched_off(
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
    assert json.loads((run_dir / "env.json").read_text())["run"]["allocator"] == said
