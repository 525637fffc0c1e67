"""The best trial of a study: shown, and written as best.toml, the trial run's own resolved config
(its config.toml: the trial's values, seed included), which `gputrain train --config best.toml`
trains again to the same metric."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gputrain.run.layout import CONFIG
from gputrain.sweep.layout import BEST
from gputrain.sweep.study import RUN_DIR, finished
from gputrain.sweep.trial import describe

if TYPE_CHECKING:
    import optuna


@dataclass(frozen=True, slots=True)
class Best:
    number: int
    value: float
    params: dict[str, Any]
    run_dir: Path | None


def best_trial(study: optuna.Study) -> Best | None:
    """The complete trial with the best value (the study's direction), or None before any."""
    from optuna.study import StudyDirection
    from optuna.trial import TrialState

    done = [t for t in finished(study.get_trials(deepcopy=False)) if t.state == TrialState.COMPLETE]
    if not done:
        return None
    sign = 1.0 if study.direction == StudyDirection.MINIMIZE else -1.0
    trial = min(done, key=lambda t: (sign * float(t.value or 0.0), t.number))  # a tie: the first trial
    run_dir = trial.user_attrs.get(RUN_DIR)
    return Best(trial.number, float(trial.value or 0.0), dict(trial.params), Path(run_dir) if run_dir else None)


def write_best(sweep_dir: Path, best: Best, metric: str) -> Path | None:
    """best.toml beside the trials: the best run's config.toml under a comment naming the trial.
    None where the run's config cannot be read (its directory was removed)."""
    from gputrain.run.files import write_text
    from gputrain.run.reader import read_text

    if best.run_dir is None:
        return None
    try:
        text = read_text(best.run_dir, CONFIG)
    except Exception:  # noqa: BLE001 - a damaged run: nothing to write, said by the caller
        return None
    if text is None:
        return None
    header = (
        f"# gputrain sweep: the best trial, {best.number} ({metric} {best.value:.6g}), run {best.run_dir}\n"
        f"# {describe(best.params)}\n"
        "# train it again: gputrain train --config best.toml\n\n"
    )
    path = sweep_dir / BEST
    write_text(path, header + text)
    return path
