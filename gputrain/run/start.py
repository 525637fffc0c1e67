"""How a training loop starts in its run directory, shared by the Trainer and the RL loop: resume
where a checkpoint says (or keep a complete run as it is), write the run's files, open the metrics,
arm the signals."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gputrain.config import Config
from gputrain.observe.tracker_sink import RunFacts
from gputrain.run.files import write_run_files
from gputrain.run.prior import (
    PriorRun,
    asks_longer,
    check_run_kind,
    continue_run,
    kept_message,
    prior_run,
    saved_config,
)
from gputrain.run.record import RecordedParts, RunEnding
from gputrain.run.signals import StopRequest
from gputrain.run.tokenizer import check_same_tokenizer, store_tokenizer
from gputrain.train.state import LoopState

if TYPE_CHECKING:
    from gputrain.text.tokenizer import Tokenizer

Restore = Callable[[Path, dict[str, Any]], LoopState]
"""(checkpoint path, what it holds) -> the loop's state, once the loop's parts are loaded from it."""
Complete = Callable[["PriorRun | None", LoopState], bool]
"""(the directory's earlier run, the resumed state) -> whether the run was complete there already."""


def start_run(
    ending: RunEnding,
    parts: RecordedParts,
    config: Config,
    stop: StopRequest,
    total: int,
    state: LoopState,
    restore: Restore,
    *,
    longer: str,
    unit: str = "step",
    complete: Complete | None = None,
    kind: str = "train",
    config_note: str | None = None,
    tokenizer: Tokenizer | None = None,
) -> bool:
    """Resume from the checkpoint the config points at (`restore` loads it), write config.toml, open
    the metrics from the resumed state (`state` where there is none) and arm the signals.

    Args:
        total: the steps (or iterations) the run trains to.
        longer: the fields a user raises to train a complete run longer, for the message.
        unit: what the loop counts, for the console.
        complete: after a resume, whether the earlier run was complete at this checkpoint already.
        kind: the kind of run (prior.py's KINDS), recorded in env.json; a directory that holds
            another kind's run is refused.
        config_note: comment lines written at the head of config.toml (files.py's write_run_files).
        tokenizer: the tokenizer the run's ids mean, kept in the run directory (run/tokenizer.py); a
            run continuing one trained with another is refused.

    Returns:
        False where the directory holds a complete run with nothing left to train: its summary is
        kept in `ending`, and nothing is written.
    """
    run_dir, checkpointer, console = parts.run_dir, parts.checkpointer, parts.console
    # armed before anything is read or written here: a signal from now on stops at a step boundary,
    # and whatever ends the run leaves its record (RunRecorder gives the handlers back)
    stop.install()
    path, verified = checkpointer.resume_point()
    prior = prior_run(run_dir)
    # again now the directory is held (lock.py): a run of the other kind may have begun there since
    # the build claimed it
    check_run_kind(run_dir, prior, kind)
    check_same_tokenizer(run_dir, tokenizer, prior is not None and prior.owns)
    longer_asked = asks_longer(saved_config(run_dir), config) if prior is not None and prior.owns else None
    if not continue_run(run_dir, prior, config.checkpoint.resume, path, total, longer_asked):
        return _keep(ending, prior, parts, longer)
    if path is not None:
        state = restore(path, checkpointer.load(path, verified))
        console.info(f"resumed from {path} ({unit} {state.global_step})")
        if complete is not None and complete(prior, state):
            return _keep(ending, prior, parts, longer)
    ending.started = True
    if parts.place.dist.is_main:
        # env.json: the kind, the start's device, precision, ranks
        kept = store_tokenizer(run_dir, tokenizer) if tokenizer is not None else None
        write_run_files(run_dir, config, parts.place, kind, config_note, kept)
    place = parts.place
    parts.metrics.open(
        state,
        resumed=path is not None,
        facts=lambda resume_step: RunFacts(
            config, run_dir, str(place.device), place.precision, place.dist.world_size, resume_step
        ),
    )
    console.start(total, state.global_step)
    return True


def _keep(ending: RunEnding, prior: PriorRun | None, parts: RecordedParts, longer: str) -> bool:
    assert prior is not None and prior.summary is not None  # continue_run and `complete` say so
    ending.kept = ending.summary = prior.summary
    parts.console.notice(kept_message(parts.run_dir, prior, longer))  # also with log.progress=none
    return False
