"""The study a sweep shares with other sweep processes: its storage, its settings, its trial budget,
and the trials whose process died.

Several `gputrain sweep` processes (on one machine or several) run one study when they name the same
storage and study: Optuna's RDB storage hands each `ask` a distinct trial. The budget (--trials N)
is the study's, not a process's: a process takes a trial, then looks at the trials numbered up to
its own; where they pass N it gives the trial back (marked over budget, never run) and stops, so two
processes asking at once never run more than N between them.

A trial whose sweep process died stays RUNNING in the storage. It is failed and queued again (a
copy with its parameters, its intermediate values and its run directory, which the copy resumes):
at once where the dead process ran on this machine (its pid is gone), else once its heartbeat is
older than the grace period (Optuna's heartbeat, for processes on other machines); the copy runs
whatever the budget says, as it stands in for a trial the budget counted already. The failed
original and over-budget trials are bookkeeping: `finished` and the report leave them out.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from gputrain.errors import UsageError, first_line
from gputrain.sweep.space import Param, Space

if TYPE_CHECKING:
    import optuna
    from optuna.distributions import BaseDistribution
    from optuna.storages import RDBStorage
    from optuna.trial import FrozenTrial

SETTINGS_ATTR = "gputrain"
"""The study's user attribute holding its Settings: every process joining it must agree."""
OVER_BUDGET = "over_budget"
"""A trial's user attribute: taken past the budget, never run."""
HOST, PID, PID_STARTED, RUN_DIR = "host", "pid", "pid_started", "run_dir"
"""A trial's user attributes: the sweep process running it (to find it dead), its run directory."""
HEARTBEAT_S = 60
"""Seconds between heartbeats of a running trial; its grace period is three of them."""


@dataclass(frozen=True, slots=True)
class Settings:
    """What every process of one study must agree on (stored in the study)."""

    metric: str
    """The validation metric, as metrics.jsonl's val rows name it (loss, accuracy, ...)."""
    direction: Literal["minimize", "maximize"]
    objective: Literal["final", "best"]
    """final: the metric of the run's last validation; best: its best validation."""
    pruner: Literal["median", "none"]
    prune_startup: int
    """Trials finished before any is pruned."""
    prune_warmup: int
    """Optimizer steps of a trial before it may be pruned."""
    space: dict[str, Any]
    fixed: list[str]
    """The fixed overrides (the space's base, then the command line's), as section.key=value."""
    config: str | None
    """The --config file's absolute path, or None."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def redacted(url: str) -> str:
    """A storage URL without its password (it goes into messages, sweep.json and the report)."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy reads: opening it says so
        return url.split("@")[-1] if "@" in url else url


def open_storage(url: str, heartbeat_s: int = HEARTBEAT_S) -> RDBStorage:
    """Optuna's RDB storage at `url` (any SQLAlchemy URL), with heartbeats for trials whose process
    dies on another machine.

    Raises:
        UsageError: it cannot be opened (a driver missing, a server not answering, a bad path).
    """
    import optuna
    from optuna.storages import RDBStorage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # the heartbeat is Optuna's "experimental" feature, and meant for Study.optimize, which a sweep
    # does not call (it keeps the budget across processes itself): said once per process otherwise
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    # SQLite serialises writers: several sweep processes wait for the file rather than fail at once
    engine = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    try:
        return RDBStorage(
            url,
            engine_kwargs=engine,
            heartbeat_interval=heartbeat_s,
            grace_period=3 * heartbeat_s,
            heartbeat_stale_trial_callback=requeue,
        )
    except Exception as err:  # noqa: BLE001 - SQLAlchemy's and the drivers' errors have no common base
        raise UsageError(f"--storage {redacted(url)} cannot be opened: {first_line(err)}") from None


def pruner(settings: Settings) -> optuna.pruners.BasePruner:
    import optuna

    if settings.pruner == "none":
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(n_startup_trials=settings.prune_startup, n_warmup_steps=settings.prune_warmup)


def sampler(name: str, space: Space, seed: int | None) -> optuna.samplers.BaseSampler:
    """The sampler `name` (tpe, random, grid) over `space`.

    Raises:
        UsageError: grid over a continuous range (a grid needs values: give choice or int).
    """
    import optuna

    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        grid: dict[str, list[Any]] = {}
        for p in space.params:
            if p.kind == "choice":
                grid[p.key] = list(p.values)
            elif p.kind == "int":
                grid[p.key] = list(range(p.values[0], p.values[1] + 1))
            else:
                raise UsageError(f"--sampler grid: {p.key} is a {p.kind} range: a grid takes choice or int")
        return optuna.samplers.GridSampler(grid, seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def distributions(space: Space) -> dict[str, BaseDistribution]:
    return {p.key: _distribution(p) for p in space.params}


def _distribution(p: Param) -> BaseDistribution:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if p.kind == "choice":
        return CategoricalDistribution(list(p.values))
    if p.kind == "int":
        return IntDistribution(p.values[0], p.values[1])
    return FloatDistribution(float(p.values[0]), float(p.values[1]), log=p.kind == "log_uniform")


def open_study(
    storage: RDBStorage, name: str, settings: Settings, chosen_sampler: optuna.samplers.BaseSampler
) -> optuna.Study:
    """Create the study, or join it where another process created it with the same settings.

    Raises:
        UsageError: the study exists with another direction, metric, objective or space.
    """
    import optuna

    try:
        study = optuna.create_study(
            storage=storage,
            study_name=name,
            direction=settings.direction,
            sampler=chosen_sampler,
            pruner=pruner(settings),
            load_if_exists=True,
        )
    except ValueError as err:  # its direction differs
        raise UsageError(f"--study {name}: {first_line(err)}") from None
    mine = settings.as_dict()
    theirs = study.user_attrs.get(SETTINGS_ATTR)
    if theirs is None:
        study.set_user_attr(SETTINGS_ATTR, mine)
        return study
    differ = sorted(k for k in mine if theirs.get(k) != mine[k])
    if differ:
        key = differ[0]
        raise UsageError(
            f"--study {name}: the study in this storage has {key} = {theirs.get(key)!r}, this sweep "
            f"{mine[key]!r}: join it with the same space and options, or give another --study"
        )
    return study


def load_settings(study: optuna.Study) -> Settings:
    """The settings the study was created with (a trial process reads them)."""
    return Settings(**study.user_attrs[SETTINGS_ATTR])


# ----------------------------------------------------------------- the budget
def _retried(trials: list[FrozenTrial]) -> set[int]:
    """Numbers of the failed trials a copy repeats (RetryHeartbeatStaleTrialCallback's `retry_history`)."""
    return {n for t in trials for n in t.system_attrs.get("retry_history", ())}


def counted(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The study's trials that are the sweep's (run, running or queued), less its bookkeeping: the
    failed originals of trials retried, and those given back over the budget."""
    from optuna.trial import TrialState

    retried = _retried(trials)
    return [
        t
        for t in trials
        if not t.user_attrs.get(OVER_BUDGET) and not (t.state == TrialState.FAIL and t.number in retried)
    ]


def finished(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The sweep's trials that ended: COMPLETE, PRUNED, and FAIL (a run that failed)."""
    return [t for t in counted(trials) if t.state.is_finished()]


def within_budget(study: optuna.Study, trial: optuna.Trial, budget: int) -> bool:
    """Whether `trial`, just taken, is one of the study's first `budget` (by number)."""
    trials = study.get_trials(deepcopy=False)
    return sum(t.number <= trial.number for t in counted(trials)) <= budget


def is_retry(study: optuna.Study, trial: optuna.Trial) -> bool:
    """Whether `trial` is a queued copy of a trial whose process died (`requeue`)."""
    return bool(study._storage.get_trial(trial._trial_id).system_attrs.get("retry_history"))


def give_back(study: optuna.Study, trial: optuna.Trial) -> None:
    """End a trial taken past the budget, unrun (it is bookkeeping: left out of every count)."""
    from optuna.trial import TrialState

    trial.set_user_attr(OVER_BUDGET, True)
    study.tell(trial, state=TrialState.FAIL)


# ----------------------------------------------------------------- trials whose process died
def _started(pid: int) -> str | None:
    """The process's start time (Linux's /proc), to tell it from a later process with its pid."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def owner_attrs() -> dict[str, Any]:
    pid = os.getpid()
    return {HOST: socket.gethostname(), PID: pid, PID_STARTED: _started(pid)}


def _dead_here(trial: FrozenTrial) -> bool:
    """A RUNNING trial whose sweep process ran on this machine and is gone."""
    attrs = trial.user_attrs
    if attrs.get(HOST) != socket.gethostname() or not isinstance(attrs.get(PID), int):
        return False  # another machine's (its heartbeat tells), or a trial still being set up
    pid = attrs[PID]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, another user's
    return attrs.get(PID_STARTED) is not None and _started(pid) != attrs.get(PID_STARTED)


def requeue(study: optuna.Study, trial: FrozenTrial) -> None:
    """Queue a copy of a failed `trial` (its parameters, intermediate values and run directory)."""
    from optuna.storages import RetryHeartbeatStaleTrialCallback

    RetryHeartbeatStaleTrialCallback(max_retry=None, inherit_intermediate_values=True)(study, trial)


def recover_dead(study: optuna.Study) -> list[int]:
    """Fail and queue again the RUNNING trials whose process died: this machine's at once, other
    machines' once their heartbeat is stale. Returns the numbers of those this process requeued."""
    import optuna
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    storage = study._storage
    requeued = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not _dead_here(trial):
            continue
        try:
            changed = storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
        except UpdateFinishedTrialError:
            continue  # another process failed it first: that one requeues it
        if changed:
            requeue(study, storage.get_trial(trial._trial_id))
            requeued.append(trial.number)
    optuna.storages.fail_stale_trials(study)  # other machines': the heartbeat's callback requeues
    return requeued


@contextlib.contextmanager
def heartbeat(study: optuna.Study, trial: optuna.Trial, every_s: float) -> Iterator[None]:
    """Beat for `trial` while its process runs (a thread: the wait for the process blocks)."""
    record = getattr(study._storage, "record_heartbeat", None)  # RDB storages beat; others have none
    stop = threading.Event()

    def beat() -> None:
        while record is not None:
            with contextlib.suppress(Exception):  # a storage briefly away: the next beat tries again
                record(trial._trial_id)
            if stop.wait(every_s):
                return

    thread = threading.Thread(target=beat, name="sweep-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
