"""The study's bookkeeping (sweep/study.py) on a real SQLite storage: the budget counts the sweep's
trials and not its bookkeeping, and a trial whose sweep process died is failed and queued again
once, with its run directory."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna", reason="gputrain sweep needs the optuna extra (pip install gputrain[optuna])")

from optuna.distributions import FloatDistribution  # noqa: E402
from optuna.trial import TrialState  # noqa: E402

from gputrain.sweep.study import (  # noqa: E402
    HOST,
    PID,
    PID_STARTED,
    RUN_DIR,
    counted,
    finished,
    give_back,
    is_retry,
    open_storage,
    owner_attrs,
    recover_dead,
    within_budget,
)

SHAPE = {"optim.lr": FloatDistribution(1e-4, 1e-1, log=True)}


def _study(tmp_path: Path) -> optuna.Study:
    return optuna.create_study(study_name="s", storage=open_storage(f"sqlite:///{tmp_path / 'study.db'}"))


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_budget_counts_the_sweeps_trials_and_gives_back_the_one_past_it(tmp_path: Path) -> None:
    study = _study(tmp_path)
    for _ in range(3):
        study.tell(study.ask(SHAPE), 1.0)
    fourth = study.ask(SHAPE)
    assert within_budget(study, fourth, 4)
    fifth = study.ask(SHAPE)  # another process took it at the same time
    assert not within_budget(study, fifth, 4)
    give_back(study, fifth)
    trials = study.get_trials()
    assert [t.number for t in counted(trials)] == [0, 1, 2, 3]  # the given-back one is bookkeeping
    assert len(finished(trials)) == 3  # the fourth still runs


def test_a_trial_whose_process_died_here_is_failed_and_queued_once_with_its_run_dir(tmp_path: Path) -> None:
    study = _study(tmp_path)
    dead, alive, elsewhere = study.ask(SHAPE), study.ask(SHAPE), study.ask(SHAPE)
    for trial, attrs in (
        (dead, {HOST: socket.gethostname(), PID: _dead_pid(), PID_STARTED: "1"}),
        (alive, owner_attrs()),
        (elsewhere, {HOST: "another-machine", PID: _dead_pid(), PID_STARTED: "1"}),
    ):
        for key, value in {**attrs, RUN_DIR: f"/sweep/trial-{trial.number:04d}"}.items():
            trial.set_user_attr(key, value)
    dead.report(2.0, 5)  # its validation at step 5, which the copy keeps for the pruner

    assert recover_dead(study) == [dead.number]
    assert recover_dead(study) == []  # a second look (another process's) queues nothing more
    trials = study.get_trials()
    states = {t.number: t.state for t in trials}
    assert states[dead.number] == TrialState.FAIL
    assert states[alive.number] == states[elsewhere.number] == TrialState.RUNNING  # elsewhere: its heartbeat tells
    (copy,) = [t for t in trials if t.state == TrialState.WAITING]
    assert copy.params == study.get_trials()[dead.number].params
    assert copy.user_attrs[RUN_DIR] == "/sweep/trial-0000" and copy.intermediate_values == {5: 2.0}
    assert dead.number not in [t.number for t in counted(trials)]  # the failed original is bookkeeping
    taken = study.ask(SHAPE)  # the next ask takes the copy
    assert taken.number == copy.number and taken.params == copy.params
    assert is_retry(study, taken) and not is_retry(study, study.ask(SHAPE))  # a copy runs whatever the budget


def test_a_pid_reused_by_another_process_is_dead_to_the_sweep(tmp_path: Path) -> None:
    study = _study(tmp_path)
    trial = study.ask(SHAPE)
    for key, value in {**owner_attrs(), PID_STARTED: "started at another time"}.items():
        trial.set_user_attr(key, value)
    assert recover_dead(study) == [trial.number]


def test_two_processes_finding_one_dead_trial_queue_one_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    study = _study(tmp_path)
    trial = study.ask(SHAPE)
    for key, value in {HOST: socket.gethostname(), PID: _dead_pid(), PID_STARTED: "1"}.items():
        trial.set_user_attr(key, value)
    seen = study.get_trials(states=(TrialState.RUNNING,))  # what the other process read before this one failed it
    assert recover_dead(study) == [trial.number]
    monkeypatch.setattr(study, "get_trials", lambda *args, **kwargs: seen)
    assert recover_dead(study) == []  # the storage refuses to fail it again: no second copy
    monkeypatch.undo()
    assert sum(t.state == TrialState.WAITING for t in study.get_trials()) == 1


def test_another_machines_trial_is_failed_and_queued_once_its_heartbeat_is_stale(tmp_path: Path) -> None:
    import sqlite3

    study = _study(tmp_path)
    trial = study.ask(SHAPE)
    for key, value in {HOST: "another-machine", PID: 1, PID_STARTED: "1", RUN_DIR: "/sweep/trial-0000"}.items():
        trial.set_user_attr(key, value)
    study._storage.record_heartbeat(trial._trial_id)
    assert recover_dead(study) == [] and study.get_trials()[0].state == TrialState.RUNNING  # beating: alive
    with sqlite3.connect(tmp_path / "study.db") as db:  # its last beat long ago: that machine's sweep is gone
        db.execute("update trial_heartbeats set heartbeat = '2000-01-01 00:00:00'")
    recover_dead(study)
    trials = study.get_trials()
    assert trials[0].state == TrialState.FAIL
    (copy,) = [t for t in trials if t.state == TrialState.WAITING]
    assert copy.user_attrs[RUN_DIR] == "/sweep/trial-0000" and copy.params == trials[0].params
