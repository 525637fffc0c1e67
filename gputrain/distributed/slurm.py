"""Slurm's launch variables, read as torchrun's: `srun gputrain train ...` with one task per GPU, on
one node or many."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

_DEFAULT_PORT = 29500


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: "gpu[003-004,007],cpu01" → "gpu003",
    "rack[1-2]-n[01-04]" → "rack1-n01"."""
    first, depth = "", 0
    for ch in nodelist.strip():  # the first entry: up to a comma outside brackets
        if ch == "," and depth == 0:
            break
        depth += {"[": 1, "]": -1}.get(ch, 0)
        first += ch
    # each bracketed range set stands for its first value
    return re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[-,]", m.group(1))[0], first)


def slurm_world(env: Mapping[str, str]) -> tuple[int, int, int, str, str] | None:
    """(rank, world_size, local_rank, master_addr, master_port) from Slurm's variables, or None
    outside a multi-task Slurm step. MASTER_ADDR/MASTER_PORT already set win.

    The world is the step's tasks (SLURM_STEP_NUM_TASKS, which srun sets; SLURM_NTASKS otherwise).
    Rank 0 runs on the first node of the step, so that node's name is the address: not
    SLURM_LAUNCH_NODE_IPADDR, which is where srun was typed (a login node, under salloc)."""
    world = int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or "1")
    if "SLURM_PROCID" not in env or world <= 1:
        return None
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    addr = (
        env.get("MASTER_ADDR")
        or (first_host(nodelist) if nodelist else None)
        or env.get("SLURM_LAUNCH_NODE_IPADDR")
        or "127.0.0.1"
    )
    # every task of the job derives the same port from the job id, so no file or broadcast is needed
    port = env.get("MASTER_PORT") or str(_DEFAULT_PORT + int(env.get("SLURM_JOB_ID", "0")) % 10000)
    return (int(env["SLURM_PROCID"]), world, int(env.get("SLURM_LOCALID", "0")), addr, port)


def tasks_on_this_node(env: Mapping[str, str]) -> int | None:
    """Tasks of the step on this node (torchrun's LOCAL_WORLD_SIZE), from SLURM_STEP_TASKS_PER_NODE
    ("8(x2),4": 8 on each of the first two nodes, 4 on the third) and SLURM_NODEID; None where unknown."""
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    node = env.get("SLURM_NODEID", "")
    if not spec or not node.isdigit():
        return None
    counts: list[int] = []
    for part in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            return None
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts[int(node)] if int(node) < len(counts) else None


def export_slurm_env() -> bool:
    """Set RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/MASTER_ADDR/MASTER_PORT from Slurm's when
    torchrun's are absent."""
    if "WORLD_SIZE" in os.environ:
        return False
    found = slurm_world(os.environ)
    if found is None:
        return False
    rank, world, local, addr, port = found
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local), MASTER_ADDR=addr, MASTER_PORT=port)
    local_world = tasks_on_this_node(os.environ)
    if local_world is not None:  # thread and loader-worker shares, memory per rank, are per node
        os.environ.setdefault("LOCAL_WORLD_SIZE", str(local_world))
    return True
