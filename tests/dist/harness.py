"""Run a function on N real processes joined by a gloo process group, with a hard time limit.

Each process gets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT), runs
`fn(rank, *args)`, and always destroys its process group. A process still alive at the deadline
is killed (only the ones started here, by pid) and the test fails instead of hanging.
"""

from __future__ import annotations

import os
import socket
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, fn: Callable[..., Any], args: tuple[Any, ...], queue: Any) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # two processes on a small machine: no oversubscription
    try:
        result = fn(rank, *args)
        queue.put((rank, "ok", result))
    except BaseException:  # noqa: BLE001 — report anything, then tear down
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], *args: Any, world: int = 2, timeout_s: float = 120.0) -> list[Any]:
    """fn(rank, *args) on `world` processes; returns the results by rank, raises on any error or timeout."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    procs = [ctx.Process(target=_worker, args=(r, world, port, fn, args, queue), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: list[str] = []
    import queue as queue_mod
    import time

    deadline = time.monotonic() + timeout_s
    try:
        while len(results) + len(errors) < world:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"ranks did not finish within {timeout_s:.0f} s; got {sorted(results)}")
            try:
                rank, status, value = queue.get(timeout=min(remaining, 1.0))
            except queue_mod.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead and len(results) + len(errors) < world and not any(p.is_alive() for p in procs):
                    raise RuntimeError(f"ranks exited without reporting: exit codes {[p.exitcode for p in procs]}"
                                       + "".join(f"\n{e}" for e in errors))
                continue
            if status == "ok":
                results[rank] = value
            else:
                errors.append(f"rank {rank}:\n{value}")
    finally:
        for p in procs:
            p.join(timeout=max(0.1, min(10.0, deadline - time.monotonic())))
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise AssertionError("\n".join(errors))
    return [results[r] for r in range(world)]
