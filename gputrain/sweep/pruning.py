"""Inside a trial's run: the callback that reports the validation metric to the study after each
validation (the eval cadence: eval.every_steps or every_epochs) and stops the run when the pruner
says so (stop_reason "pruned", after a checkpoint, as any early stop).

Rank 0 alone talks to the study; the stop it asks for is agreed by every rank at the next logging
step or validation (the stop agreement of run/signals.py), so no rank is left in a collective.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from gputrain.errors import UsageError, first_line
from gputrain.interrupts import job_rank
from gputrain.train.callbacks import Callback, TrainerView

if TYPE_CHECKING:
    import optuna

STORAGE_ENV = "GPUTRAIN_SWEEP_STORAGE"
"""The study's storage URL, given to a trial's processes in the environment (a password in it stays
out of the process list)."""
PRUNED = "pruned"
"""summary.json's stop_reason of a pruned trial."""
GIVEN_UP = "the sweep gave this trial up (it is no longer running in the study)"


def storage_url() -> str:
    url = os.environ.get(STORAGE_ENV)
    if not url:
        raise UsageError(f"gputrain sweep-trial runs a trial of `gputrain sweep`, which sets {STORAGE_ENV}")
    return url


class ReportToStudy(Callback):
    """Reports the trial's validation metric (rank 0) and asks for a stop when it is pruned."""

    def __init__(self, study_name: str, trial_id: int) -> None:
        self.study_name = study_name
        self.trial_id = trial_id
        self._trial: optuna.Trial | None = None
        self._metric = ""

    def on_fit_start(self, trainer: TrainerView) -> None:
        if job_rank() != 0:
            return
        import optuna

        from gputrain.sweep.study import load_settings, open_storage, pruner

        storage = open_storage(storage_url())
        try:
            study = optuna.load_study(study_name=self.study_name, storage=storage)
        except KeyError:
            raise UsageError(f"--study {self.study_name}: no such study in the storage") from None
        settings = load_settings(study)
        study.pruner = pruner(settings)
        self._metric = settings.metric
        self._trial = optuna.Trial(study, self.trial_id)

    def on_eval_end(self, trainer: TrainerView, split: str, metrics: dict[str, float]) -> None:
        if split != "val" or self._trial is None or self._metric not in metrics:
            return
        from optuna.exceptions import UpdateFinishedTrialError

        step = trainer.state.global_step
        try:
            self._trial.report(float(metrics[self._metric]), step)
            prune = self._trial.should_prune()
        except UpdateFinishedTrialError:
            trainer.request_stop(GIVEN_UP)
            return
        except Exception as err:  # noqa: BLE001 - a storage away for a moment does not stop training
            trainer.parts.console.notice(f"sweep: could not report step {step} to the study: {first_line(err)}")
            return
        if prune:
            trainer.request_stop(PRUNED)
