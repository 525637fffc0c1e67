"""Who am I in the job: rank, world size, data-parallel coordinates, from torchrun's variables."""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from gputrain.distributed.allocator import apply_allocator
from gputrain.distributed.orphans import die_with_launcher

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from gputrain.distributed.parallel_dims import ParallelDims


@dataclass(frozen=True, slots=True)
class DistContext:
    """This rank's place in the job. `init_distributed` makes it; `parallelize.setup_parallel` returns
    a copy laid out for the run's parallelism (degrees, mesh, data-parallel coordinates)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    dp_rank: int = 0
    """This rank's index among the data-parallel replicas (what slice of each batch it reads)."""
    dp_size: int = 1
    """Number of data-parallel ranks the global batch is split over."""
    dims: ParallelDims | None = None
    """Degrees of each parallelism; None until laid out (parallelize.setup_parallel)."""
    mesh: DeviceMesh | None = None
    """The named world mesh (pp, dp_replicate, dp_shard, tp, and flattened dp); None on one process."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def env_world() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from torchrun's (or Slurm's) environment; (0, 1, 0) otherwise."""
    from gputrain.distributed.slurm import export_slurm_env

    export_slurm_env()  # srun without torchrun: translate SLURM_PROCID/NTASKS/LOCALID into torchrun's names
    if "WORLD_SIZE" in os.environ:
        return int(os.environ.get("RANK", 0)), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    return 0, 1, 0


def rank_device(local_rank: int) -> torch.device:
    """The GPU of the rank with this node-local index. Usually GPU `local_rank`; where the launcher
    shows each rank only its own GPU(s) (Slurm's --gpus-per-task or --gpu-bind), there are fewer
    visible than ranks on the node, and the index wraps."""
    return torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))


def process_group_backend(device: torch.device, cpu_collectives: bool) -> str:
    """nccl on CUDA, gloo on CPU; both when collectives must also run on CPU tensors of a CUDA job
    (FSDP's CPU offload keeps gradient shards on the CPU, and their norm is all-reduced there)."""
    if device.type != "cuda":
        return "gloo"
    return "cuda:nccl,cpu:gloo" if cpu_collectives else "nccl"


def init_distributed(device: torch.device, timeout_s: float = 600.0, cpu_collectives: bool = False) -> DistContext:
    """Join the process group when launched with several ranks (see `process_group_backend`).

    `timeout_s` bounds every collective: a rank whose peer died fails after it instead of hanging.
    """
    rank, world, local_rank = env_world()
    # what needs no layout (off, glibc, the user's, CUDA's: allocator.py); a training rank adds the
    # fixed threshold of a sharded job once its strategy is resolved (train/build.py's place_run)
    apply_allocator(shards=False)
    if world > 1:
        die_with_launcher()
    if world > 1 and not dist.is_initialized():
        gpu = rank_device(local_rank) if device.type == "cuda" else None
        if gpu is not None:
            torch.cuda.set_device(gpu)
            # nccl only notices a dead peer through its watchdog: make it abort the job instead of hanging
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        timeout = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(
            process_group_backend(device, cpu_collectives),
            timeout=timeout,
            store=_restart_store(world, timeout),
            rank=rank,
            world_size=world,
            device_id=gpu,
        )
    return DistContext(rank=rank, world_size=world, local_rank=local_rank, dp_rank=rank, dp_size=world)


def _restart_store(world: int, timeout: datetime.timedelta) -> dist.Store | None:
    """After a torchrun restart, a fresh key space in torchrun's store; None otherwise (the default).

    torchrun keeps one TCP store across restarts; the failed attempt's keys (each rank's address)
    would send the new ranks to connect to dead ones."""
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt == 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    base = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False, timeout=timeout
    )
    return dist.PrefixStore(f"gputrain/attempt_{attempt}", base)


def all_reduce_sum(value: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """`value` summed over every rank (a new tensor; on one process `value` itself)."""
    if not ctx.enabled:
        return value
    value = value.clone()  # all_reduce works in place: never on the caller's tensor
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def all_reduce_mean(value: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """`value` averaged over every rank."""
    return all_reduce_sum(value, ctx) / ctx.world_size if ctx.enabled else value


def all_gather_cat(value: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """Every rank's `value` (same shape on each), concatenated along dim 0 in rank order."""
    if not ctx.enabled:
        return value
    parts = [torch.empty_like(value) for _ in range(ctx.world_size)]
    dist.all_gather(parts, value.contiguous())
    return torch.cat(parts)


def grad_sync(model: torch.nn.Module, enabled: bool) -> contextlib.AbstractContextManager[None]:
    """Skip the gradient all-reduce on non-final micro-batches of an accumulation."""
    if enabled:
        return contextlib.nullcontext()
    no_sync = getattr(model, "no_sync", None)
    if no_sync is not None:  # DDP
        return no_sync()
    setter = getattr(model, "set_requires_gradient_sync", None)
    if setter is not None:  # FSDP2
        return _fsdp_no_sync(setter)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _fsdp_no_sync(set_requires_gradient_sync: Callable[[bool], None]) -> Iterator[None]:
    set_requires_gradient_sync(False)
    try:
        yield
    finally:
        set_requires_gradient_sync(True)


def agree_on_path(path: Path, ctx: DistContext) -> Path:
    """Rank 0's choice of a path, on every rank (default run directories carry a timestamp)."""
    return Path(agree_on_text(str(path), ctx))


def agree_on_text(text: str, ctx: DistContext) -> str:
    """Rank 0's text on every rank (a refusal only rank 0 could see, said by every rank)."""
    if not ctx.enabled:
        return text
    box = [text]
    dist.broadcast_object_list(box, src=0)
    return str(box[0])


def agreed_count(local: int, device: torch.device, group: dist.ProcessGroup | None = None) -> int:
    """Rank 0's count (of the group), on every rank of `group`: how often to run a loop that holds a
    collective. A count each rank decides for itself (from its own clock: a time budget, a warm-up
    until some seconds pass) differs between ranks; the rank that runs more calls then meets its
    peer's next, different collective (gloo aborts on the size mismatch, NCCL hangs)."""
    if not dist.is_initialized() or dist.get_world_size(group) < 2:
        return local
    box = torch.tensor([local], dtype=torch.int64, device=device)
    dist.broadcast(box, src=0 if group is None else dist.get_global_rank(group, 0), group=group)
    return int(box.item())


def shutdown_distributed() -> None:
    """Leave the job. After a clean end the ranks meet in a barrier first, so that none tears its
    process group down while a peer still talks to it: under gloo, a rank that destroyed its group
    and exited while its peer was still finishing (rank 0 writing the summary) left that peer's
    transport threads joinable at exit, and it aborted ("terminate called without an active
    exception", 2 of 12 two-rank runs). Called while an exception propagates (a failed rank), it
    skips the barrier: the peers may be gone, and waiting for them would only hang until the timeout."""
    if not dist.is_initialized():
        return
    if sys.exc_info()[0] is None:
        with contextlib.suppress(RuntimeError):  # a peer that died after the run ended: leave anyway
            dist.barrier()
    dist.destroy_process_group()
