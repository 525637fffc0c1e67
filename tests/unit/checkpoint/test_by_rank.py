"""checkpoint/by_rank.py in one process: the writer hashes the shard files it wrote and hands the
digests to the commit (so rank 0 reads no shard again), and verifying "together" on one process is
plain verification. Two real ranks: tests/dist/test_sharded_waste.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

from gputrain.checkpoint import CorruptCheckpoint
from gputrain.checkpoint.by_rank import DigestingWriter, verify_together
from gputrain.checkpoint.io import commit_checkpoint_dir, file_digest
from gputrain.run.layout import CHECKPOINT_STATE
from gputrain.distributed.context import DistContext
from tests.unit.checkpoint.helpers import model_and_optimizer


def _save(tmp: Path) -> DigestingWriter:
    model, optimizer = model_and_optimizer(0)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    writer = DigestingWriter(tmp)
    dcp.save({"model": model_sd, "optim": optim_sd}, storage_writer=writer, no_dist=True)
    torch.save({"loop": {"global_step": 1}}, tmp / CHECKPOINT_STATE)  # what a sharded save writes beside the shards
    return writer


def test_the_writer_reports_a_digest_of_every_shard_file_it_wrote(tmp_path: Path) -> None:
    tmp = tmp_path / ".step-1.tmp"
    writer = _save(tmp)
    shards = sorted(p.name for p in tmp.iterdir() if p.suffix == ".distcp")
    assert shards and sorted(writer.digests) == shards
    assert all(writer.digests[name] == file_digest(tmp / name) for name in shards)
    assert "__gputrain_file_digests__" not in (tmp / ".metadata").read_bytes().decode("latin-1")  # not an item


def test_one_process_verifies_alone_and_refuses_a_damaged_shard(tmp_path: Path) -> None:
    tmp = tmp_path / ".step-1.tmp"
    writer = _save(tmp)
    path = commit_checkpoint_dir(tmp, tmp_path / "step-1", 1, fmt="dcp", known=writer.digests)
    verify_together(path, DistContext())
    shard = next(p for p in path.iterdir() if p.suffix == ".distcp")
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpoint, match=shard.name):
        verify_together(path, DistContext())
