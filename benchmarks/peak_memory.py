"""A real training run's peak of torch's CPU allocator, against which the memory plan is checked
(plan/allocator.py counts; this runs the Trainer, as `gputrain train` builds it, under the count)."""

from __future__ import annotations

from dataclasses import dataclass

from gputrain.config import load_config
from gputrain.data import build_data
from gputrain.models import build_model
from gputrain.plan.allocator import AllocatorPeak
from gputrain.train.state import seed_everything
from gputrain.train.trainer import Trainer


@dataclass(frozen=True, slots=True)
class RunPeak:
    """The CPU allocator's bytes in a real training run, over what it held once the data was built."""

    peak: int
    """The most allocated at once during the measured steps."""
    resident: int
    """Allocated as the measured steps begin: weights, optimizer states, what the loop keeps."""
    step_peaks: tuple[int, ...]
    """Each step's peak (every step run), for the record."""


FIXED = ("log.progress=none", "log.tensorboard=false", "checkpoint.enabled=false", "train.compile=false")
"""What a measured run leaves out: no console, no event files, no checkpoints (evaluation is left out
by building the Trainer without validation data)."""


def measure_training(overrides: list[str], run_dir: str, first: int = 2, last: int = 3) -> RunPeak:
    """Train `last` steps of the config `overrides` give, built as `gputrain train` builds it (the data,
    then the model on meta, materialised by the Trainer), and read the allocator's peak over steps
    `first`..`last` (from step 2 on the optimizer state exists, as the plan assumes). Under torchrun
    each rank measures its own.

    The baseline is what was allocated once the data was built: the peak counts everything the Trainer
    allocates (the model, gradients, optimizer states, activations, the batch, the loop's own tensors),
    and not the data set, which is host memory on any device.
    """
    config = load_config(None, [*overrides, *FIXED, f"train.max_steps={last}"])
    seed_everything(config.train.seed)
    bundle = build_data(config.data, config.train.seed)
    with AllocatorPeak() as tracker:
        model = build_model(config.model, bundle.spec, on_meta=True)
        trainer = Trainer(
            model,
            bundle.train,
            config=config,
            run_dir=run_dir,
            spec=bundle.spec,
            names=(config.model.name, config.data.name),
        )
        tracker.mark()  # 1: built
        trainer.fit(on_step=tracker.mark)  # 1 + k: after step k
    if tracker.marks < last + 2:
        raise RuntimeError(
            f"the run made {tracker.marks - 2} steps of the {last} measured (is {run_dir} a finished run?)"
        )
    base = tracker.live_at(0)
    return RunPeak(
        peak=tracker.peak_between(first, last + 1) - base,
        resident=tracker.live_at(first) - base,
        step_peaks=tuple(tracker.peak_between(k, k + 1) - base for k in range(1, last + 1)),
    )


def measure_training_fresh(overrides: list[str], run_dir: str, first: int = 2, last: int = 3) -> RunPeak:
    """`measure_training` in a new interpreter (spawned): an allocator nothing profiled before."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(measure_training, overrides, run_dir, first, last).result()
