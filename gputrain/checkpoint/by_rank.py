"""A sharded checkpoint's bytes are read once, by the rank that has them anyway.

Saving: each rank hashes the shard files it has just written (from the page cache) and DCP's own
gathering of the write results carries the digests to rank 0, which records them in the manifest
and commits; rank 0 hashes only what no rank reported (its own state.pt, .metadata). This holds for
the background (async) save too: the digests travel with the write, no extra collective is needed.

Resuming: the ranks verify a checkpoint together. Every rank runs every structural check, and each
large file is hashed by one rank only (io.hashed_by: a shard by the rank that wrote it); their
verdicts are gathered so that every rank skips, or resumes from, the same checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from gputrain.checkpoint.io import (
    CorruptCheckpoint,
    file_digest,
    first_verified,
    resume_candidates,
    verify_checkpoint,
)
from gputrain.distributed.context import DistContext

_DIGESTS = "__gputrain_file_digests__"
"""The name under which a rank's digests ride with its write results (removed before .metadata)."""


class DigestingWriter(FileSystemWriter):
    """DCP's file-system writer, plus: each rank hashes the files it wrote, and the coordinator
    (rank 0) collects every rank's digests in `digests` when the checkpoint's metadata is written."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path)
        self.digests: dict[str, dict[str, Any]] = {}
        """File name -> {"sha256", "bytes"} for every rank's shard files; filled on rank 0 by `finish`."""

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        written = super().write_data(plan, planner)
        written.wait()  # the file-system writer writes before it returns; this only unwraps the result
        results = written.value()
        root = Path(self.path)
        prefix = getattr(plan.storage_data, "prefix", None)
        names = {r.storage_data.relative_path for r in results if hasattr(r.storage_data, "relative_path")}
        if isinstance(prefix, str):  # a file with no item recorded in it is still this rank's
            names |= {p.name for p in root.iterdir() if p.name.startswith(prefix) and p.name.endswith(".distcp")}
        digests = {name: file_digest(root / name) for name in sorted(names)}
        carried = WriteResult(index=MetadataIndex(_DIGESTS), size_in_bytes=0, storage_data=digests)
        done: Future[list[WriteResult]] = Future()
        done.set_result([*results, carried])
        return done

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        kept: list[list[WriteResult]] = []
        for rank_results in results:
            kept.append([])
            for result in rank_results:
                if result.index.fqn == _DIGESTS:
                    self.digests.update(result.storage_data)
                else:
                    kept[-1].append(result)
        super().finish(metadata, kept)


def verify_together(path: Path, ctx: DistContext) -> None:
    """`verify_checkpoint` with the hashing split over the ranks (collective). Every rank reaches
    the same verdict: a problem any rank found is raised on all (the lowest rank's).

    Raises:
        CorruptCheckpoint: the checkpoint is damaged or hostile.
    """
    if not ctx.enabled:
        verify_checkpoint(path)
        return
    problem: str | None = None
    try:
        verify_checkpoint(path, share=(ctx.rank, ctx.world_size))
    except CorruptCheckpoint as err:
        problem = str(err)
    found: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(found, problem)
    first = next((p for p in found if p), None)
    if first is not None:
        raise CorruptCheckpoint(first)


def find_resumable_together(root: Path, ctx: DistContext) -> Path | None:
    """`find_resumable` for a job of several ranks (collective): rank 0 lists the checkpoints (and
    puts back an interrupted re-save), every rank tries the same ones newest first, verifying each
    together, and all resume from the same one or stop with the same error.

    Raises:
        RunError: checkpoints exist but none verifies.
    """
    box: list[Any] = [[str(p) for p in resume_candidates(root)] if ctx.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return first_verified([Path(p) for p in box[0]], lambda path: verify_together(path, ctx))
