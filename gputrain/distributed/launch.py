"""`gputrain train --nproc-per-node N ...`: start torchrun ourselves, with `-m gputrain train ...`.

The launcher process only validates the config (bad input fails here, before any rank starts),
fixes the run directory (every rank, and every restart, must use the same one so that
checkpoint.resume=auto finds the checkpoints), and hands the rest to torchrun's agent, which
restarts all ranks up to --max-restarts times when one fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gputrain.distributed.allocator import check_launch_setting
from gputrain.distributed.endpoint import DEFAULT_WAIT_S, RendezvousFailed, check_rendezvous, check_wait, parse_endpoint
from gputrain.distributed.orphans import LAUNCHER_ENV
from gputrain.distributed.rank_failure import collective_errors, error_logs, judge, last_error_line, record_failure
from gputrain.errors import Interrupted, RunError, UsageError

LAUNCHER_SHARE_ENV = "GPUTRAIN_LAUNCHER_OMP_NUM_THREADS"
"""Set by `launch` to the OMP_NUM_THREADS it chose for the ranks: a default, not the user's, so each
rank still chooses its thread count (env/threads.py)."""


RANK_START_BYTES = 512 << 20
"""What one rank takes before it holds any model: the interpreter, torch and its libraries (about
300-500 MiB resident on CPU builds). A launch of more ranks than the node's available memory holds
at this size cannot start them all: it would thrash the machine (1,000 ranks of a mistyped
--nproc-per-node did), so it is refused before any process starts."""


def _available_bytes() -> int:
    """Memory the node can still give (Linux's MemAvailable; else free pages), or 0 where unknown."""
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return 0


def ranks_this_node_holds() -> int | None:
    """The most ranks this node's available memory can start (at least 1), or None where unknown."""
    available = _available_bytes()
    return max(1, available // RANK_START_BYTES) if available > 0 else None


def check_ranks_per_node(count: int) -> None:
    """`count` ranks fit this node's available memory (RANK_START_BYTES each).

    Raises:
        UsageError: naming --nproc-per-node, the most the node holds, and why.
    """
    most = ranks_this_node_holds()
    if most is not None and count > most:
        raise UsageError(
            f"--nproc-per-node {count}: this node holds at most {most} processes (each needs about "
            f"{RANK_START_BYTES >> 20} MiB of memory just to start, and {_available_bytes() >> 20} MiB are "
            "available); one process per GPU, or a few on a CPU"
        )


@dataclass(slots=True)
class LaunchOptions:
    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    max_restarts: int = 0
    rdzv_timeout_s: float = DEFAULT_WAIT_S

    def check(self) -> None:
        if self.nproc_per_node < 1:
            raise UsageError(f"--nproc-per-node must be >= 1, not {self.nproc_per_node}")
        check_ranks_per_node(self.nproc_per_node)
        if self.nnodes < 1:
            raise UsageError(f"--nnodes must be >= 1, not {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise UsageError(f"--node-rank must be in 0..{self.nnodes - 1}, not {self.node_rank}")
        if self.nnodes > 1 and self.rdzv_endpoint is None:
            raise UsageError(
                "--nnodes > 1 needs --rdzv-endpoint host:port (the same on every node: node 0's "
                "address and a free port)"
            )
        if self.rdzv_endpoint is not None:
            parse_endpoint(self.rdzv_endpoint)
        check_wait(self.rdzv_timeout_s)
        if self.max_restarts < 0:
            raise UsageError(f"--max-restarts must be >= 0, not {self.max_restarts}")
        check_launch_setting(os.environ)  # GPUTRAIN_ALLOCATOR, as the ranks will read it

    def check_rendezvous(self) -> None:
        """The endpoint resolves and can serve the rendezvous, within --rdzv-timeout (distributed/endpoint.py).

        Raises:
            RendezvousFailed: one line naming the endpoint and what to check.
        """
        if self.rdzv_endpoint is not None:
            check_rendezvous(self.rdzv_endpoint, node_rank=self.node_rank, wait_s=self.rdzv_timeout_s)


def torchrun_args(opts: LaunchOptions, child_argv: list[str], signals: str | None = None) -> list[str]:
    """Arguments for torch.distributed.run: the launch topology, the signals its agent passes on to
    the ranks (`signals`, comma-separated names; torch's default where None), then `-m gputrain <child_argv>`."""
    args = [f"--nproc-per-node={opts.nproc_per_node}", f"--max-restarts={opts.max_restarts}"]
    if signals is not None:
        args.append(f"--signals-to-handle={signals}")
    if opts.nnodes == 1 and opts.rdzv_endpoint is None:
        args.append("--standalone")  # a free local port, no endpoint to agree on
    else:
        # no --node-rank: c10d's rendezvous assigns the node ranks (torchrun ignores it there, with a warning)
        args += [
            f"--nnodes={opts.nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={opts.rdzv_endpoint}",
        ]
    return [*args, "-m", "gputrain", *child_argv]


def first_failed_rank(run_dir: Path | None, since: float) -> int | None:
    """The rank whose error log appeared first in this launch. A rank that raises writes its log
    before its connections close, so a peer that fails because of it always writes later; exit
    order is no guide (the first to raise spends time writing, its peers exit at once). A log that
    only says a collective broke (a peer went away: rank_failure.py) points at no one: the rank that
    left may have left no log at all (killed, or exited outright)."""
    found = []
    for rank, path in error_logs(run_dir, since).items():
        if collective_errors({rank: last_error_line(path)}):
            continue
        with contextlib.suppress(OSError):
            found.append((path.stat().st_mtime_ns, rank))
    return min(found)[1] if found else None


def culprit(failures: Mapping[int, tuple[int, float]], logged: int | None, echoes: frozenset[int] = frozenset()) -> int:
    """The rank that failed first, from torchrun's failures (rank -> (exit code, when seen)) and the
    rank whose error log appeared first (`first_failed_rank`).

    A rank killed by a signal (SIGKILL from the OOM killer or a user, SIGSEGV, ...) writes no error
    log, while its peers, whose collectives it breaks, do: so such a rank, seen in the first round
    of failures, is the one that failed first, whatever the logs say. SIGTERM is what torchrun itself
    sends the survivors, so it points at no one while another reason exists; nor do ranks seen later,
    once torchrun had started stopping the rest. `echoes`: ranks whose only error was a broken
    collective (they lost a peer); among ranks that exited, one that is not an echo left first."""
    first_seen = min(when for _, when in failures.values())
    early = {rank: code for rank, (code, when) in failures.items() if when <= first_seen + 1}
    killed = sorted(rank for rank, code in early.items() if code < 0 and -code != signal.SIGTERM)
    if killed:
        return killed[0]
    if logged is not None and logged in failures:
        return logged
    exited = sorted(rank for rank, code in early.items() if code > 0 and code != 130)
    # a rank whose only error was a broken collective lost a peer: the one that left is the culprit
    leavers = [rank for rank in exited if rank not in echoes]
    return leavers[0] if leavers else exited[0] if exited else min(early)


def launch(opts: LaunchOptions, child_argv: list[str], run_dir: Path | None = None) -> int:
    """Run torchrun's agent in this process; return 0, or raise RunError naming the failed rank(s)."""
    import torch
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import get_args_parser, run

    from gputrain.child_python import check_not_shadowed, child_environment
    from gputrain.distributed.allocator import rank_environment
    from gputrain.interrupts import QUIT, handled, leave_130_on_further_signals

    opts.check()
    # CPU threads per rank: share the cores (torchrun would set 1 and print a warning banner). A share
    # set here is marked as gputrain's, so each rank still chooses from its cores and their load
    # (env/threads.py); an OMP_NUM_THREADS of the user's wins there.
    if "OMP_NUM_THREADS" not in os.environ:
        share = str(max(1, (os.cpu_count() or 1) // opts.nproc_per_node))
        os.environ["OMP_NUM_THREADS"] = os.environ[LAUNCHER_SHARE_ENV] = share
    # the C allocator of the ranks (distributed/allocator.py): GPUTRAIN_ALLOCATOR=glibc's tunables or a
    # preload, in force from each rank's first allocation; torchrun passes this environment on to them
    os.environ.update(rank_environment(os.environ, torch.version.cuda is not None))
    # torchrun's agent takes SIGTERM, SIGINT, SIGHUP and SIGQUIT by default (even a SIGHUP that nohup
    # or GPUTRAIN_ON_SIGHUP=ignore left ignored) and passes each on to the ranks; it takes every signal
    # a run stops for instead, and only those: a SIGUSR1/USR2/ALRM to the launcher ended it at once
    # before, and its ranks with it (distributed/orphans.py), with no checkpoint and no record
    passed_on = ",".join(signal.Signals(sig).name for sig in handled(with_quit=True))
    args = get_args_parser().parse_args(torchrun_args(opts, child_argv, passed_on))
    os.environ[LAUNCHER_ENV] = str(os.getpid())  # the ranks die with this process (distributed/orphans.py)
    # the ranks run `python -m gputrain` here: this gputrain, not a folder of that name in the working directory
    check_not_shadowed()
    os.environ.update(child_environment(os.environ))
    started = time.time() - 1.0  # file-system timestamps may be coarse
    resume_hint = f"run the same command again{f' (--run-dir {run_dir})' if run_dir else ''} to resume"
    try:
        run(args)
    except RendezvousError as err:  # past the checks: node 0 answered, then the rendezvous itself failed
        raise RendezvousFailed(
            f"--rdzv-endpoint {opts.rdzv_endpoint}: the rendezvous failed: {type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else 'no detail'} (check that every node started with "
            "this endpoint and the same --nnodes)"
        ) from None
    except SignalException as err:  # the agent passed the signal on to the ranks, which checkpointed
        name = signal.Signals(err.sigval).name
        leave_130_on_further_signals()  # not torchrun's handlers, nor the defaults (143) while this exits
        what = "quit at once (the last checkpoint stands)" if err.sigval == QUIT else "saved a checkpoint"
        raise Interrupted(f"stopped by {name}: the ranks {what}; {resume_hint}") from None
    except ChildFailedError as err:
        if all(failure.exitcode == 130 for failure in err.failures.values()):
            leave_130_on_further_signals()
            raise Interrupted(f"stopped by a signal: the ranks saved a checkpoint; {resume_hint}") from None
        seen = {rank: (failure.exitcode, float(failure.timestamp)) for rank, failure in err.failures.items()}
        lines = {r: last_error_line(path) for r, path in error_logs(run_dir, started).items()}
        rank = culprit(seen, first_failed_rank(run_dir, started), frozenset(collective_errors(lines)))
        code = err.failures[rank].exitcode
        retries = f" after {opts.max_restarts} restart(s)" if opts.max_restarts else ""
        # the peers' broken collectives (kept quiet on those ranks) fold into one line (rank_failure.py)
        codes = {r: failure.exitcode for r, failure in err.failures.items()}
        verdict = judge(codes, rank, run_dir, started, opts.nnodes > 1, retries)
        message = verdict.line
        record_failure(run_dir, started, message, verdict.rank, verdict.how, opts.nproc_per_node * opts.nnodes)
        # every rank refused the input (a checkpoint not this run's), or was stopped by torchrun while it
        # started (SIGTERM; 130 where gputrain's start-up handler caught it) before meeting it too
        stopped = (code, 130, -signal.SIGTERM)
        if code == UsageError.exit_code and all(f.exitcode in stopped for f in err.failures.values()):
            raise UsageError(message) from None
        raise RunError(message) from None
    sys.stdout.flush()
    return 0
