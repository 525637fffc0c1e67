"""A pp row is measured on the stages that can need the most (plan/pipeline.py's
`stages_to_measure`): for a stack of identical blocks the row is the same as measuring every stage,
at a cost that does not grow with the number of stages."""

from __future__ import annotations

from dataclasses import replace

import pytest

import gputrain.plan.measure as measure
import gputrain.plan.pipeline as pipeline
from gputrain.cli.plan import build_plan_target, parse_size
from gputrain.config import load_config
from gputrain.plan.layouts import layout_bytes
from gputrain.plan.measure import measure_fake

GPT = ["model.name=gpt", "model.preset=tiny", "data.name=synthetic", "data.task=lm", "data.num_samples=64"]


@pytest.mark.parametrize(
    ("layers", "stages", "schedule", "ac", "picked"),
    [
        (7, 4, "1f1b", "none", [0, 1, 3]),  # blocks per stage 2, 2, 2, 1
        (11, 5, "1f1b", "full", [0, 1, 4]),  # 3, 2, 2, 2, 2
        (11, 5, "gpipe", "none", [0, 1, 4]),
        (12, 6, "1f1b", "selective", [0, 1, 5]),  # 2 each
    ],
)
def test_the_picked_stages_give_the_row_of_every_stage(
    layers: int, stages: int, schedule: str, ac: str, picked: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_config(
        None, [*GPT, f"model.n_layer={layers}", f"train.grad_accum={stages}", f"train.batch_size={4 * stages}"]
    )
    target, micro, _ = build_plan_target(config, stages)
    assert pipeline.stages_to_measure(target.model, stages) == picked

    def row(measured: list[object]) -> int:
        assert measured is not None
        return layout_bytes(measured[0], target.shape(), "pp", stages, stages=measured).total  # type: ignore[arg-type]

    args = (target.model, target.sample, micro, target.loss_of, target.make_optimizer, target.device, stages, stages)
    few = pipeline.measure_pipeline(*args, schedule, ac)
    monkeypatch.setattr(pipeline, "stages_to_measure", lambda model, n: list(range(n)))
    every = pipeline.measure_pipeline(*args, schedule, ac)
    assert few is not None and every is not None and (len(few), len(every)) == (len(picked), stages)
    assert row(few) == row(every)


def test_a_block_stack_measures_at_most_four_stages_however_deep() -> None:
    config = load_config(None, [*GPT, "model.n_layer=1024"])
    target, _, _ = build_plan_target(config, 1)
    for stages in (2, 3, 48, 1000, 1024):
        picked = pipeline.stages_to_measure(target.model, stages)
        assert picked[0] == 0 and picked[-1] == stages - 1 and len(picked) <= 4


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1MiB", 2**20),
        ("80GiB", 80 * 2**30),
        ("24GB", 24 * 10**9),
        ("1PiB", 2**50),
        ("0.5 TiB", 2**39),
        ("1048576", 2**20),
        ("1000TB", 10**15),
    ],
)
def test_device_memory_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("model", [["model.name=mlp"], GPT], ids=["mlp", "gpt"])
@pytest.mark.parametrize("ac", ["none", "full"])
def test_two_micro_batches_reach_the_peak_of_eight(model: list[str], ac: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """measure.py runs MEASURED_MICRO_BATCHES of a step's micro-batches: the rest repeat the second."""
    target, _, _ = build_plan_target(load_config(None, model), 1)

    def step(accum: int) -> object:
        memory = measure_fake(
            target.model,
            target.sample,
            4,
            target.loss_of,
            target.make_optimizer,
            target.device,
            ac,
            target.autocast,
            accum,
        )
        assert memory is not None and memory.accum == accum
        return replace(memory, accum=0)

    capped = step(8)
    monkeypatch.setattr(measure, "MEASURED_MICRO_BATCHES", 8)
    assert capped == step(8) == step(2) != step(1)
