"""Each rank's peak memory where the ranks end apart (a failure, a second signal, a peer that died):
no collective can run there (observe/rank_memory.py), so each rank other than 0 leaves its peak in
the run directory as it records its ending, and rank 0 takes what is there when it writes
summary.json, in place of the older figure its last logging step gathered.

Under torchrun a failing rank records its ending before it exits, and its peers learn of the failure
only from that exit (a collective that fails, then the launcher's signal), so its file is there when
rank 0 writes the summary. Where rank 0 ends first, it does not wait for a file that may never come
(a rank killed outright writes none): that rank's figure is the gathered one, at its step.

A file belongs to one attempt of the job (`attempt`: torchrun's run id, restart count and
rendezvous address, the same on every rank of it): one left by an earlier attempt of a resumed run
is not taken. Rank 0 removes each file it took.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from gputrain.observe.rank_memory import RankMemory
from gputrain.run.files import write_json
from gputrain.run.layout import memory_name
from gputrain.run.reader import RunFileError, read_json
from gputrain.run.shapes import LEFT_MEMORY


def attempt_id() -> str:
    """This attempt of the job, the same on each of its ranks and different on a restart or relaunch."""
    env = os.environ
    return "/".join(
        env.get(k, "") for k in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT")
    )


def leave(run_dir: Path, memory: RankMemory, step: int) -> None:
    """This rank's peak now, for rank 0's summary; nothing where it cannot be written (a full disk:
    the summary then has the gathered figure)."""
    record = {"rank": memory.rank, "peak_memory_bytes": memory.own(), "step": step, "attempt": attempt_id()}
    with contextlib.suppress(OSError):
        write_json(run_dir / memory_name(memory.rank), record)


def take(run_dir: Path, memory: RankMemory) -> None:
    """Into `memory`, every other rank's figure left in `run_dir` by this attempt where it is no older
    than the one gathered; each file taken is removed. A file that is not what a rank writes (edited,
    another attempt's, another rank's name, not a regular file inside the run directory) is left as
    it is; none is waited for."""
    attempt = attempt_id()
    for rank in range(memory.world_size):
        if rank == memory.rank:
            continue
        name = memory_name(rank)
        try:
            record = read_json(run_dir, name, LEFT_MEMORY)
        except (RunFileError, OSError):
            continue
        if record is None or record["rank"] != rank or record["attempt"] != attempt:
            continue
        if memory.take(rank, int(record["peak_memory_bytes"]), record["step"]):
            with contextlib.suppress(OSError):
                (run_dir / name).unlink()
