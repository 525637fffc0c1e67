"""A rank that dies takes its peers' collectives with it: the launcher says once which rank died and how.

When a rank is SIGKILLed (the OOM killer, a user) or exits, every peer's next collective fails with
the transport's own words ("gloo ... Connection reset by peer", an NCCL error, a timeout). Those
peers are not the failure, only its echo: a rank started by gputrain's launcher keeps such an error
to itself (its error log and summary.json still hold it), and the launcher, which sees every rank's
exit, writes one line naming the rank that died and how, the peers' broken collectives folded into
it, and puts the same into summary.json (`error`, `failed_rank`, `failed_how`).

Across nodes each launcher sees its own ranks only. The one whose rank a signal killed (no traceback
of its own) writes that rank's error log itself, one `RankDied:` line; a launcher whose ranks all
failed in broken collectives waits a moment for such a line from another node (the run directory is
shared, as the ranks' checkpoints need) and names that rank, or says that a rank elsewhere failed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gputrain.distributed.orphans import LAUNCHER_ENV
from gputrain.run.layout import METRICS, SUMMARY, error_log_name

DIED = "RankDied"
"""The first word of the line a launcher writes as the error log of a rank that a signal killed."""
_DIED_LINE = re.compile(rf"^{DIED}: rank (\d+) (?:was killed by|exited with) (.+?)(?: \(|$)")
OTHER_NODE_WAIT_S = 10.0
"""How long a launcher whose ranks only met broken collectives waits for another node's launcher to
name the rank that died there (it sees the death first: its agent polls its ranks every 0.1 s)."""

_PEER_LOST = re.compile(
    r"connection (reset|closed) by peer|broken pipe|\bgloo\b.*(read|write) error|nccl.*(remote|abort|unhandled "
    r"system error)|socket timeout|connection refused|timed out|timeout",
    re.IGNORECASE,
)
_SHORT = re.compile(
    r"connection (reset|closed) by peer|broken pipe|socket timeout|connection refused|timed? ?out", re.IGNORECASE
)


def peer_lost(exc: BaseException) -> bool:
    """Whether `exc` is a collective that broke because a peer went away (torch.distributed's own
    errors, or a transport's RuntimeError saying so)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & {"DistBackendError", "DistNetworkError", "DistStoreError"}:
        return True
    return isinstance(exc, RuntimeError) and bool(_PEER_LOST.search(str(exc)))


def under_gputrain_launcher() -> bool:
    """Whether this process is a rank that gputrain's own launcher started (it names failures itself)."""
    launcher = os.environ.get(LAUNCHER_ENV, "")
    return launcher.isdigit() and os.getppid() == int(launcher)


def leaves_it_to_the_launcher(exc: BaseException, distributed: bool) -> bool:
    """A rank's failure that the launcher folds into its line: said nowhere else."""
    return distributed and peer_lost(exc) and under_gputrain_launcher()


def collective_errors(logs: dict[int, str]) -> dict[int, str]:
    """Of each rank's error (the last line of its error log), those that are a broken collective,
    as a few words ("Connection reset by peer")."""
    found = {}
    for rank, line in logs.items():
        if _PEER_LOST.search(line):
            short = _SHORT.search(line)
            found[rank] = short[0] if short else line[:120]
    return found


def last_error_line(path: Path) -> str:
    """The exception line of a traceback file (its last non-empty line), or ''."""
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""


def failure_line(
    rank: int,
    how: str,
    step: int | None,
    others: list[int],
    broken: dict[int, str],
    own_message: bool,
    retries: str = "",
) -> str:
    """The launcher's one line: which rank failed first and how, at which step, and the others."""
    at = f" after step {step}" if step is not None else ""
    line = f"rank {rank} failed first: it {how}{at}{retries}"
    if rank in broken:  # its own error was a broken collective, kept quiet there: say it here
        line += f" (its collective broke: {broken[rank]})"
    elif own_message:
        line += " (its message is above)"
    elif how.startswith("was killed"):
        line += " (no message: a signal ends a process at once)"
    else:  # os._exit, a library's exit(): no traceback to point at
        line += " (no message: it exited without an error of its own)"
    if others:
        folded = sorted({broken[r] for r in others if r in broken})
        why = f": their collectives with it broke ({'; '.join(folded)})" if folded else ""
        line += f"; ranks {others} stopped too{why}"
    return line


def recorded_step(run_dir: Path | None, since: float) -> int | None:
    """The last step in summary.json, where rank 0 wrote one in this launch; else (rank 0 died) the
    last step in metrics.jsonl written in this launch; else None."""
    summary = _summary(run_dir, since)
    step = summary.get("global_step") if summary else None
    if isinstance(step, int):
        return step
    return _last_logged_step(run_dir, since) if run_dir is not None else None


def record_failure(run_dir: Path | None, since: float, line: str, rank: int | None, how: str, world_size: int) -> None:
    """Put the launcher's line into summary.json: `error` becomes the line, `failed_rank` and
    `failed_how` say who and how. Rank 0 wrote it in this launch (`failed`), or, where rank 0 is the
    rank that died, nobody did: then the launcher writes it, at the last logged step, once the run
    had begun (metrics.jsonl written in this launch; else the directory is left as it was)."""
    if run_dir is None:
        return
    summary = _summary(run_dir, since)
    if summary is None:
        step = _last_logged_step(run_dir, since)
        if step is None:
            return
        from gputrain.run.summary import start_up_summary

        summary = start_up_summary(line, time.time() - since, world_size)
        summary["global_step"] = step
    elif summary.get("status") != "failed":
        return
    from gputrain.run.files import write_json

    summary.update(error=line, failed_rank=rank, failed_how=how)
    with contextlib.suppress(OSError):
        write_json(run_dir / SUMMARY, summary)


def _last_logged_step(run_dir: Path, since: float) -> int | None:
    """The last training step in metrics.jsonl, where this launch wrote it (a torn last line skipped)."""
    path = run_dir / METRICS
    try:
        if path.stat().st_mtime < since:
            return None
        lines = path.read_bytes().splitlines()[-200:]
    except OSError:
        return None
    for raw in reversed(lines):
        with contextlib.suppress(ValueError):
            record = json.loads(raw)
            if isinstance(record, dict) and "split" not in record and isinstance(record.get("step"), int):
                return int(record["step"])
    return 0


def _summary(run_dir: Path | None, since: float) -> dict[str, Any] | None:
    if run_dir is None:
        return None
    path = run_dir / SUMMARY
    try:
        if path.stat().st_mtime < since:
            return None
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the launcher says of a failed launch: the line, the rank that failed first and how
    (a signal's name or "exit code N"), the rank None where it died on another node unnamed."""

    line: str
    rank: int | None
    how: str


def judge(
    failures: dict[int, int],
    first: int,
    run_dir: Path | None,
    since: float,
    several_nodes: bool,
    retries: str = "",
) -> Verdict:
    """The launcher's verdict on its ranks' `failures` (global rank -> exit code, negative: killed
    by that signal), `first` being the rank that failed first among them (launch.culprit). A rank a
    signal killed gets its error log written here (`RankDied:`), for the other nodes' launchers."""
    code = failures[first]
    how = _signal_name(-code) if code < 0 else f"exit code {code}"
    if code < 0 and run_dir is not None and first not in error_logs(run_dir, since):
        _write_died(run_dir, first, how)
    lines = {r: last_error_line(path) for r, path in error_logs(run_dir, since).items()}
    broken = collective_errors({r: line for r, line in lines.items() if r in failures})
    others = sorted(r for r in failures if r != first)
    step = recorded_step(run_dir, since)
    if several_nodes and code > 0 and set(failures) <= set(broken):
        # every rank here only lost a peer: the rank that died is on another node
        elsewhere = _died_elsewhere(run_dir, since, set(failures))
        folded = "; ".join(sorted(set(broken.values())))
        here = sorted(failures)
        at = f" after step {step}" if step is not None else ""
        if elsewhere is not None:
            rank, died = elsewhere
            verb = "was killed by" if not died.startswith("code") else "exited with"
            line = (
                f"rank {rank} (on another node) failed first: it {verb} {died}{at}{retries}; ranks {here} here "
                f"stopped too: their collectives with it broke ({folded})"
            )
            return Verdict(line, rank, died if not died.startswith("code") else f"exit {died}")
        line = (
            f"ranks {here} stopped{at}{retries}: their collectives broke ({folded}); a rank on another node "
            "failed first (that node's launcher names it)"
        )
        return Verdict(line, None, "a rank on another node")
    verb = f"was killed by {how}" if code < 0 else f"exited with code {code}"
    # a rank that raised wrote its error log (and printed its line); one that exited outright did not
    own_message = code > 0 and first in lines
    return Verdict(failure_line(first, verb, step, others, broken, own_message, retries=retries), first, how)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def error_logs(run_dir: Path | None, since: float) -> dict[int, Path]:
    """Each rank's error log written in this launch (error.log is rank 0's, error-rank<N>.log rank N's)."""
    if run_dir is None or not run_dir.is_dir():
        return {}
    found = {}
    for path in run_dir.glob("error*.log"):
        stem = path.stem.removeprefix("error").removeprefix("-rank")
        rank = 0 if stem == "" else int(stem) if stem.isdigit() else None
        with contextlib.suppress(OSError):
            if rank is not None and path.stat().st_mtime >= since:
                found[rank] = path
    return found


def _write_died(run_dir: Path, rank: int, how: str) -> None:
    verb = "was killed by" if not how.startswith("exit code") else "exited with"
    text = f"{DIED}: rank {rank} {verb} {how} (said by its launcher, pid {os.getpid()}: a signal leaves no traceback)\n"
    from gputrain.run.files import write_text

    with contextlib.suppress(OSError):
        write_text(run_dir / error_log_name(rank), text)


def _died_elsewhere(run_dir: Path | None, since: float, here: set[int]) -> tuple[int, str] | None:
    """A rank of another node that its launcher said died (`RankDied:`), waited for up to OTHER_NODE_WAIT_S."""
    deadline = time.monotonic() + OTHER_NODE_WAIT_S
    while True:
        for rank, path in sorted(error_logs(run_dir, since).items()):
            match = _DIED_LINE.match(last_error_line(path))
            if rank not in here and match:
                return int(match[1]), match[2]
        if run_dir is None or time.monotonic() >= deadline:
            return None
        time.sleep(0.1)
