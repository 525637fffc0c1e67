"""One rank of the `doctor --dist` smoke test (run as `python -m gputrain.env._dist_worker`).

Prints one JSON line `{"rank", "ok", "error", "in_collective"}`; the parent reads it. Arguments:
backend rank world_size port timeout_s.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def main(argv: list[str]) -> int:
    backend, rank, world_size, port, timeout_s = argv[0], int(argv[1]), int(argv[2]), int(argv[3]), float(argv[4])
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    # A rank that fails inside a collective is usually the victim of a peer that died first; the
    # parent uses this flag to blame the rank whose own code failed.
    in_collective = True
    try:
        if backend == "nccl":
            torch.cuda.set_device(device)
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        in_collective = False
        if os.environ.get("GPUTRAIN_DOCTOR_DIST_FAIL_RANK") == str(rank):
            raise RuntimeError(f"injected failure on rank {rank}")
        # Distinct values per rank, so a collective that silently drops a rank gives a wrong sum.
        tensor = torch.full((1 << 16,), float(rank + 1), device=device)
        in_collective = True
        dist.all_reduce(tensor)
        in_collective = False
        expected = world_size * (world_size + 1) / 2
        ok = bool(torch.all(tensor == expected).item())
        error = None if ok else f"all-reduce gave {tensor[0].item()}, expected {expected}"
    except Exception as err:  # noqa: BLE001 - reported to the parent as data, not a traceback
        ok, error = False, f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}"
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    print(json.dumps({"rank": rank, "ok": ok, "error": error, "in_collective": in_collective}), flush=True)
    return 0 if ok else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
