"""Slurm's launch variables, read as torchrun's: `srun gputrain train ...` with one task per GPU."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

_DEFAULT_PORT = 29500


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: "gpu[003-004,007],cpu01" → "gpu003"."""
    match = re.match(r"([^,\[]+)(\[([^\]]+)\])?", nodelist.strip())
    if match is None:
        return nodelist
    prefix, _, ranges = match.groups()
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def slurm_world(env: Mapping[str, str]) -> tuple[int, int, int, str, str] | None:
    """(rank, world_size, local_rank, master_addr, master_port) from Slurm's variables, or None
    outside a multi-task Slurm step. MASTER_ADDR/MASTER_PORT already set win."""
    if "SLURM_PROCID" not in env or int(env.get("SLURM_NTASKS", "1")) <= 1:
        return None
    addr = (
        env.get("MASTER_ADDR")
        or env.get("SLURM_LAUNCH_NODE_IPADDR")
        or first_host(env.get("SLURM_JOB_NODELIST", env.get("SLURM_NODELIST", "127.0.0.1")))
    )
    # every task of the job derives the same port from the job id, so no file or broadcast is needed
    port = env.get("MASTER_PORT") or str(_DEFAULT_PORT + int(env.get("SLURM_JOB_ID", "0")) % 10000)
    return (int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", "0")), addr, port)


def export_slurm_env() -> bool:
    """Set RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT from Slurm's when torchrun's are absent."""
    if "WORLD_SIZE" in os.environ:
        return False
    found = slurm_world(os.environ)
    if found is None:
        return False
    rank, world, local, addr, port = found
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local), MASTER_ADDR=addr, MASTER_PORT=port)
    return True
