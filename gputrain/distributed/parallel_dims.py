"""How the ranks of a job are divided between the parallelisms, and the named meshes for them.

The mesh is laid out as (pp, dp_replicate, dp_shard, tp), outermost first, as torchtitan does:
tensor parallelism, the most communication-hungry, gets neighbouring ranks (the same node), and
pipeline stages, which only pass activations, get the farthest ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from gputrain.errors import ConfigError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from gputrain.config.schema import ParallelConfig

Strategy = Literal["none", "ddp", "fsdp", "tp", "pp", "hybrid"]
DIM_NAMES = ("pp", "dp_replicate", "dp_shard", "tp")
_FIELDS = "parallel.dp_replicate × parallel.dp_shard × parallel.tp × parallel.pp"


@dataclass(slots=True)
class ParallelDims:
    """Degrees of each parallelism; their product is the world size. -1 means "the remaining ranks"."""

    dp_replicate: int = 1
    """Data-parallel replicas (DDP, or the replicate dimension of hybrid-sharded FSDP)."""
    dp_shard: int = 1
    """Data-parallel shards (FSDP)."""
    tp: int = 1
    """Tensor-parallel degree."""
    pp: int = 1
    """Pipeline-parallel degree (number of stages)."""
    world_size: int = 1

    def __post_init__(self) -> None:
        degrees = {"dp_replicate": self.dp_replicate, "dp_shard": self.dp_shard, "tp": self.tp, "pp": self.pp}
        for name, value in degrees.items():
            if value == 0 or value < -1:
                raise ConfigError(f"parallel.{name}", "must be >= 1, or -1 for the remaining ranks", value)
        fill = [name for name, value in degrees.items() if value == -1]
        if len(fill) > 1:
            raise ConfigError(
                f"parallel.{fill[0]}",
                "only one degree may be -1 (the remaining ranks); -1 is also set "
                "for " + ", ".join(f"parallel.{n}" for n in fill[1:]),
                -1,
            )
        known = math.prod(v for v in degrees.values() if v != -1)
        if fill:
            rest, rem = divmod(self.world_size, known)
            if rem or rest < 1:
                raise ConfigError(
                    _FIELDS,
                    f"the fixed degrees multiply to {known}, which does not divide the world size {self.world_size}",
                    degrees,
                )
            setattr(self, fill[0], rest)
        elif known != self.world_size:
            raise ConfigError(
                _FIELDS,
                f"must multiply to the world size {self.world_size}, not {known}",
                degrees,
                hint="set one degree to -1 to take the remaining ranks",
            )

    # ------------------------------------------------------------------ what is enabled
    @property
    def dp_size(self) -> int:
        """Ranks that read different data (replicas × shards): the global batch is split over these."""
        return self.dp_replicate * self.dp_shard

    @property
    def fsdp_enabled(self) -> bool:
        """FSDP shards parameters over dp_shard; it also replicates when TP/PP is on (DDP cannot hold DTensors)."""
        return self.dp_shard > 1 or (self.dp_replicate > 1 and (self.tp > 1 or self.pp > 1))

    @property
    def ddp_enabled(self) -> bool:
        return self.dp_replicate > 1 and not self.fsdp_enabled

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.pp, self.dp_replicate, self.dp_shard, self.tp)

    def coordinates(self, rank: int) -> dict[str, int]:
        """This rank's index along each mesh dimension (row-major over DIM_NAMES), without a process group."""
        coords: dict[str, int] = {}
        for name, size in reversed(list(zip(DIM_NAMES, self.shape))):
            rank, coords[name] = divmod(rank, size)
        return {name: coords[name] for name in DIM_NAMES}

    def dp_rank(self, rank: int) -> int:
        """Which slice of every global batch this rank reads (TP and PP peers read the same one)."""
        c = self.coordinates(rank)
        return c["dp_replicate"] * self.dp_shard + c["dp_shard"]

    def build_mesh(self, device_type: str) -> DeviceMesh:
        """The world mesh with dimensions named pp, dp_replicate, dp_shard, tp, plus a flattened "dp"."""
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device_type, self.shape, mesh_dim_names=DIM_NAMES)
        mesh["dp_replicate", "dp_shard"]._flatten("dp")
        return mesh

    def describe(self) -> str:
        parts = [f"{name}={size}" for name, size in zip(DIM_NAMES, self.shape) if size > 1]
        return " × ".join(parts) if parts else "one process"


def dims_for_strategy(strategy: Strategy, cfg: ParallelConfig, world_size: int) -> ParallelDims:
    """The degrees a strategy implies; `hybrid` takes them from the config as given.

    Raises:
        ConfigError: naming the parallel.* fields when the degrees do not fit the world size.
    """
    if strategy == "none":
        if world_size > 1:
            raise ConfigError(
                "parallel.strategy",
                f"'none' trains on one process, but {world_size} ranks were launched",
                strategy,
                hint="use ddp, fsdp or auto, or launch one process",
            )
        return ParallelDims(world_size=1)
    if strategy == "ddp":
        return ParallelDims(dp_replicate=-1, world_size=world_size)
    if strategy == "fsdp":  # dp_replicate > 1 gives hybrid-sharded FSDP (shard inside, replicate across)
        return ParallelDims(dp_replicate=cfg.dp_replicate, dp_shard=-1, world_size=world_size)
    if strategy == "tp":
        return ParallelDims(tp=cfg.tp if cfg.tp > 1 else world_size, dp_shard=-1, world_size=world_size)
    if strategy == "pp":
        return ParallelDims(pp=cfg.pp if cfg.pp > 1 else world_size, dp_shard=-1, world_size=world_size)
    return ParallelDims(
        dp_replicate=cfg.dp_replicate, dp_shard=cfg.dp_shard, tp=cfg.tp, pp=cfg.pp, world_size=world_size
    )
