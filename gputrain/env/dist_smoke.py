"""The `doctor --dist` smoke test: start one process per rank, all-reduce, name who failed.

Ranks are plain subprocesses (not torch.multiprocessing) so the parent can always kill them: a
rank stuck in a collective must never hang the doctor or the tests.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Literal

from gputrain.child_python import child_environment
from gputrain.env.facts import DistFacts

__all__ = ["FAIL_RANK_ENV", "choose_backend", "collect_dist_smoke"]

# Test hook: the rank named here raises before the all-reduce, so the failure path is exercised
# for real (the other rank is then stuck in the collective and must be killed by the parent).
FAIL_RANK_ENV = "GPUTRAIN_DOCTOR_DIST_FAIL_RANK"
Backend = Literal["nccl", "gloo"]


def choose_backend(cuda_device_count: int, nccl_available: bool) -> tuple[Backend, int]:
    """NCCL with one rank per visible GPU when there are GPUs, else gloo with two CPU ranks."""
    if cuda_device_count > 0 and nccl_available:
        return "nccl", cuda_device_count
    return "gloo", 2


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


def collect_dist_smoke(backend: Backend, world_size: int, timeout_s: float = 60.0) -> DistFacts:
    """Run the all-reduce across `world_size` local ranks and report the first rank that failed.

    Every child is killed on return, whatever happened, so nothing outlives the call.
    """
    port = _free_port()
    start = time.monotonic()
    ranks: list[_Rank] = []
    # The children import gputrain from wherever this process did, installed or not.
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    python_path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    env = child_environment(dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=python_path))
    try:
        for rank in range(world_size):
            cmd = [
                sys.executable,
                "-m",
                "gputrain.env._dist_worker",
                backend,
                str(rank),
                str(world_size),
                str(port),
                str(timeout_s),
            ]
            ranks.append(_Rank(cmd, env))
        failed_rank, error = _wait(ranks, start, timeout_s)
    finally:
        for r in ranks:
            r.close()
    return DistFacts(
        backend=backend,
        world_size=world_size,
        ok=failed_rank is None and error is None,
        seconds=round(time.monotonic() - start, 3),
        failed_rank=failed_rank,
        error=error,
    )


class _Rank:
    """A rank's process, its output going to files: a pipe that fills up (NCCL_DEBUG=INFO
    logs) would block the child and look like a hang."""

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        # kept open for the child's lifetime; closed by `close`
        self._out = tempfile.TemporaryFile("w+")  # noqa: SIM115
        self._err = tempfile.TemporaryFile("w+")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=self._err, text=True, env=env)

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def poll(self) -> int | None:
        return self.proc.poll()

    def communicate(self) -> tuple[str, str]:
        self.proc.wait()
        self._out.seek(0)
        self._err.seek(0)
        return self._out.read(), self._err.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._out.close()
        self._err.close()


def _outcome(p: _Rank) -> dict[str, object]:
    """A finished rank's report; a rank that died without one (segfault, OOM kill) crashed."""
    out, err = p.communicate()
    try:
        result = json.loads(_last_line(out))
    except json.JSONDecodeError:
        return {
            "ok": False,
            "crashed": True,
            "error": _last_line(err)[:300] or f"exit code {p.returncode} with no report",
        }
    return {
        "ok": bool(result.get("ok")) and p.returncode == 0,
        "crashed": False,
        "error": result.get("error"),
        "in_collective": result.get("in_collective", True),
    }


def _wait(procs: Sequence[_Rank], start: float, timeout_s: float) -> tuple[int | None, str | None]:
    """Poll until all ranks exit, or one fails (then blame it), or the time is up."""
    outcomes: dict[int, dict[str, object]] = {}
    first_failure: float | None = None
    while len(outcomes) < len(procs):
        for rank, p in enumerate(procs):
            if rank not in outcomes and p.poll() is not None:
                outcomes[rank] = _outcome(p)
                if not outcomes[rank]["ok"] and first_failure is None:
                    first_failure = time.monotonic()
        now = time.monotonic()
        # After a failure give the peers a moment to report, then stop waiting on them.
        if first_failure is not None and now > first_failure + _GRACE_S:
            break
        if now > start + timeout_s:
            break
        time.sleep(0.05)
    failed = {r: o for r, o in outcomes.items() if not o["ok"]}
    stuck = [r for r in range(len(procs)) if r not in outcomes]
    if not failed and not stuck:
        return None, None
    # Blame a rank that crashed or failed in its own code before one that failed in a collective
    # (the victim of a dead peer); lowest rank first among equals.
    own = [r for r, o in failed.items() if o["crashed"] or not o.get("in_collective", True)]
    if own:
        return own[0], str(failed[own[0]]["error"])
    if failed:
        rank = min(failed)
        return rank, str(failed[rank]["error"])
    return stuck[0], f"timed out after {timeout_s:g} s (ranks still running: {stuck})"


_GRACE_S = 2.0
