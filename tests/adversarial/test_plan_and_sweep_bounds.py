"""Work without bounds (issue 34): `gputrain plan` and `gputrain lr-find` asked for more than they
can do, or for a layout that cannot be. Every such input is refused before the work starts, in one
line naming the option or field and the limit (exit 2), or answered with work bounded by count:
the plan measures a fixed number of fake steps and pipeline stages whatever the number of ranks,
and a layout the model cannot take on those ranks is left out with the reason, never a silent exit.

The work is counted (fake steps measured, pipeline stages measured), not timed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import gputrain.cli.plan as plan_cli
import gputrain.plan.pipeline as pipeline
import gputrain.plan.planner as planner
from gputrain.cli import main
from gputrain.config.limits import RANKS_MAX

GPT = ["model.name=gpt", "model.preset=tiny", "data.name=synthetic", "data.task=lm", "data.num_samples=64"]
"""A GPT of 2 blocks and 2 heads."""
MLP = ["model.name=mlp", "data.name=synthetic", "data.num_samples=64"]
CNN = ["model.name=cnn", "data.name=synthetic", "data.num_samples=64", "data.shape=[1, 8, 8]"]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """(exit code, stderr, stdout) of the command in this process (argparse's refusals exit)."""
    try:
        code = main(list(argv))
    except SystemExit as exit_info:
        code = int(exit_info.code or 0)
    captured = capsys.readouterr()
    return code, captured.err, captured.out


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], words: list[str]) -> str:
    code, err, _ = _run(capsys, *argv)
    line = err.strip()
    assert code == 2, (code, err)
    assert "Traceback" not in err and len(line.splitlines()) == 1, err
    for word in words:
        assert word in line, (word, line)
    return line


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """How many times the plan built its target (the data and the model on meta), and how many fake
    steps (whole model), pipeline stages and micro-batches (forward passes) it measured."""
    counts = {"built": 0, "steps": 0, "stages": 0, "micro_batches": 0}
    real_build, real_step, real_stage = plan_cli.build_plan_target, planner.measure_fake, pipeline._measure_stage

    def build(*args: Any, **kwargs: Any) -> Any:
        counts["built"] += 1
        target, micro, device = real_build(*args, **kwargs)
        real_loss = target.loss_of

        def loss_of(*args: Any) -> Any:  # one micro-batch's forward pass, measured
            counts["micro_batches"] += 1
            return real_loss(*args)

        target.loss_of = loss_of
        return target, micro, device

    def step(*args: Any, **kwargs: Any) -> Any:
        counts["steps"] += 1
        return real_step(*args, **kwargs)

    def stage(*args: Any, **kwargs: Any) -> Any:
        counts["stages"] += 1
        return real_stage(*args, **kwargs)

    monkeypatch.setattr(plan_cli, "build_plan_target", build)
    monkeypatch.setattr(planner, "measure_fake", step)
    monkeypatch.setattr(pipeline, "_measure_stage", stage)
    yield counts


# ----------------------------------------------------------------------------- layouts that cannot be
LAYOUTS: list[tuple[str, list[str], list[str]]] = [
    (
        "pp-deeper-than-blocks",
        [*GPT, "--nproc-per-node", "8", "parallel.strategy=pp", "parallel.pp=8", "train.grad_accum=8"],
        ["parallel.pp", "2 blocks", "8 pipeline stages"],
    ),
    (
        "pp-all-ranks-deeper",
        [*GPT, "--nproc-per-node", "4", "parallel.strategy=pp", "train.grad_accum=4"],
        ["parallel.pp", "2 blocks", "4 pipeline stages"],
    ),
    (
        "pp-interleaved-doubles-stages",
        [
            *GPT,
            "--nproc-per-node",
            "2",
            "parallel.strategy=pp",
            "parallel.pp_schedule=interleaved_1f1b",
            "train.grad_accum=2",
        ],
        ["parallel.pp", "4 pipeline stages", "interleaved_1f1b"],
    ),
    (
        "pp-mlp-more-stages-than-layers",
        [*MLP, "model.hidden_sizes=[8]", "--nproc-per-node", "4", "parallel.strategy=pp", "train.grad_accum=4"],
        ["parallel.pp", "2 layers with parameters", "4 pipeline stages"],
    ),
    (
        "pp-too-few-micro-batches",
        [*GPT, "--nproc-per-node", "2", "parallel.strategy=pp"],
        ["train.grad_accum", "1f1b", "at least parallel.pp=2"],
    ),
    (
        "pp-interleaved-not-a-multiple",
        [
            *MLP,
            "model.hidden_sizes=[8, 8, 8, 8]",
            "--nproc-per-node",
            "2",
            "parallel.strategy=pp",
            "parallel.pp_schedule=interleaved_1f1b",
            "train.grad_accum=3",
            "train.batch_size=66",
        ],
        ["train.grad_accum", "multiple of parallel.pp=2"],
    ),
    (
        "pp-model-that-cannot-be-cut",
        [*CNN, "--nproc-per-node", "2", "parallel.strategy=pp", "train.grad_accum=2"],
        ["parallel.pp", "nn.Sequential", "CNN"],
    ),
    (
        "tp-not-dividing-heads",
        [*GPT, "--nproc-per-node", "8", "parallel.strategy=tp", "parallel.tp=8"],
        ["parallel.tp", "attention heads (2)"],
    ),
    (
        "tp-all-ranks-not-dividing-heads",
        [*GPT, "--nproc-per-node", "3", "parallel.strategy=tp"],
        ["parallel.tp", "attention heads (2)"],
    ),
    (
        "tp-model-without-a-plan",
        [*CNN, "--nproc-per-node", "2", "parallel.strategy=tp"],
        ["parallel.tp", "no plan for CNN"],
    ),
    (
        "hybrid-not-multiplying",
        [
            *GPT,
            "--nproc-per-node",
            "8",
            "parallel.strategy=hybrid",
            "parallel.tp=2",
            "parallel.pp=2",
            "parallel.dp_shard=3",
        ],
        ["must multiply to the world size 8, not 12"],
    ),
    (
        "hybrid-fill-not-dividing",
        [*GPT, "--nproc-per-node", "6", "parallel.strategy=hybrid", "parallel.tp=4", "parallel.dp_shard=-1"],
        ["does not divide the world size 6"],
    ),
    (
        "hybrid-two-fills",
        [*GPT, "--nproc-per-node", "4", "parallel.strategy=hybrid", "parallel.dp_replicate=-1", "parallel.dp_shard=-1"],
        ["only one degree may be -1"],
    ),
    (
        "hybrid-over-nodes",
        [*GPT, "--nproc-per-node", "4", "--nnodes", "3", "parallel.strategy=hybrid", "parallel.dp_shard=8"],
        ["world size 12, not 8"],
    ),
    (
        "tp-over-nodes-deeper-than-heads",
        [*GPT, "--nproc-per-node", "2", "--nnodes", "2", "parallel.strategy=tp", "parallel.tp=4"],
        ["parallel.tp", "attention heads (2)"],
    ),
    (
        "fsdp-replicas-not-dividing",
        [*GPT, "--nproc-per-node", "6", "parallel.strategy=fsdp", "parallel.dp_replicate=4"],
        ["does not divide the world size 6"],
    ),
    (
        "none-on-several-ranks",
        [*GPT, "--nproc-per-node", "8", "parallel.strategy=none"],
        ["parallel.strategy", "one process", "8 ranks"],
    ),
    ("tp-zero", [*GPT, "parallel.tp=0"], ["parallel.tp", "1..1048576"]),
    ("pp-minus-two", [*GPT, "parallel.pp=-2"], ["parallel.pp", "1..1048576"]),
    ("tp-over-the-limit", [*GPT, "parallel.tp=2000000"], ["parallel.tp", "1..1048576"]),
    ("dp-shard-nan", [*GPT, "parallel.dp_shard=nan"], ["parallel.dp_shard"]),
]


BEFORE_BUILD = {
    "hybrid-not-multiplying",
    "hybrid-fill-not-dividing",
    "hybrid-two-fills",
    "hybrid-over-nodes",
    "fsdp-replicas-not-dividing",
    "none-on-several-ranks",
    "tp-zero",
    "pp-minus-two",
    "tp-over-the-limit",
    "dp-shard-nan",
}
"""Refused by the config's numbers alone: before the data is read or the model built."""


@pytest.mark.parametrize(("name", "argv", "words"), LAYOUTS, ids=[c[0] for c in LAYOUTS])
def test_a_layout_that_cannot_be_is_one_line_before_anything_is_measured(
    name: str, argv: list[str], words: list[str], capsys: pytest.CaptureFixture[str], counted: dict[str, int]
) -> None:
    _refused(capsys, ["plan", *argv], words)
    # refused before any fake step; by the degrees alone, before the target is built
    assert counted == {"built": 0 if name in BEFORE_BUILD else 1, "steps": 0, "stages": 0, "micro_batches": 0}


# ----------------------------------------------------------------------------- the world size
WORLDS: list[tuple[str, list[str], list[str]]] = [
    ("nproc-zero", ["--nproc-per-node", "0"], ["--nproc-per-node 0", "1..1048576"]),
    ("nproc-negative", ["--nproc-per-node", "-3"], ["--nproc-per-node -3", "1..1048576"]),
    ("nproc-huge", ["--nproc-per-node", "9" * 30], ["--nproc-per-node", "1..1048576"]),
    ("nproc-over-the-limit", ["--nproc-per-node", str(RANKS_MAX + 1)], ["--nproc-per-node", "1..1048576"]),
    ("nnodes-zero", ["--nnodes", "0"], ["--nnodes 0", "1..1048576", "nodes"]),
    ("nnodes-negative", ["--nnodes", "-1"], ["--nnodes -1"]),
    ("nnodes-huge", ["--nnodes", "1" + "0" * 25], ["--nnodes"]),
    (
        "product-over-the-limit",
        ["--nproc-per-node", "1024", "--nnodes", "1025"],
        ["1024 × --nnodes 1025 = 1049600 ranks", "at most 1048576"],
    ),
    ("nproc-not-a-number", ["--nproc-per-node", "8.5"], ["--nproc-per-node"]),
    ("nnodes-not-a-number", ["--nnodes", "two"], ["--nnodes"]),
]


@pytest.mark.parametrize(("argv", "words"), [c[1:] for c in WORLDS], ids=[c[0] for c in WORLDS])
def test_a_world_size_out_of_bounds_is_one_line(
    argv: list[str], words: list[str], capsys: pytest.CaptureFixture[str], counted: dict[str, int]
) -> None:
    _refused(capsys, ["plan", *GPT, *argv], words)
    assert counted == {"built": 0, "steps": 0, "stages": 0, "micro_batches": 0}


# ----------------------------------------------------------------------------- device memory
MEMORIES = [
    "1B",
    "0",
    "0GiB",
    "1023KiB",
    "1048575",
    "2PiB",
    "1.0001PiB",
    "1" + "0" * 400 + "GiB",
    "1" + "0" * 400,
    "nan",
    "inf",
    "-1GiB",
    "1e3GiB",
    "1e400GiB",
    "80 XB",
    "",
    "GiB",
    "80GiBs",
    "1 000 GiB",
]


@pytest.mark.parametrize("value", MEMORIES)
def test_a_device_memory_out_of_range_is_one_line(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = _refused(capsys, ["plan", f"--device-memory={value}"], ["--device-memory"])
    assert "memory size" in line or "between 1MiB and 1PiB" in line


# ----------------------------------------------------------------------------- answers bounded by count
def _plan(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, err, out = _run(capsys, "plan", "--json", *argv)
    assert code in (0, 1) and "Traceback" not in err, err
    return json.loads(out)


@pytest.mark.parametrize(
    "ranks",
    [
        ["--nproc-per-node", "1000"],
        ["--nproc-per-node", "8", "--nnodes", "125"],
        ["--nproc-per-node", str(RANKS_MAX)],
        ["--nproc-per-node", "1024", "--nnodes", "1024"],
    ],
    ids=["1000", "8x125", "max", "1024x1024"],
)
def test_any_number_of_ranks_costs_the_same_fake_steps(
    ranks: list[str], capsys: pytest.CaptureFixture[str], counted: dict[str, int]
) -> None:
    plan = _plan(capsys, *GPT, *ranks)
    world = plan["world"]
    assert world in (1000, RANKS_MAX)
    # none is one process's layout, and tp and pp cannot split 2 heads or 2 blocks that many ways: left
    # out, and said why
    assert [note.split(" on ")[0] for note in plan["left_out"]] == ["none", "tp", "pp"]
    assert f"parallel.pp={world}: the model has 2 blocks" in plan["left_out"][2]
    assert {row["strategy"] for row in plan["rows"]} == {"ddp", "fsdp", "hybrid"}
    # a fake step per checkpointing mode, whatever the world
    assert (counted["built"], counted["steps"], counted["stages"]) == (1, 3, 0)


def test_the_left_out_rows_are_said_in_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, err, out = _run(capsys, "plan", *GPT, "--nproc-per-node", "8")
    assert code == 0, err
    assert "left out: tp on 8 ranks: parallel.tp=8: must divide the number of attention heads (2)" in out
    assert "left out: pp on 8 ranks: parallel.pp=8: the model has 2 blocks, fewer than the 8 pipeline stages" in out


def test_a_deep_pipeline_measures_a_bounded_number_of_stages(
    capsys: pytest.CaptureFixture[str], counted: dict[str, int]
) -> None:
    # 16 identical blocks on 16 ranks: the first, the last and the earliest middle stage decide
    plan = _plan(capsys, *GPT, "model.n_layer=16", "model.n_head=16", "--nproc-per-node", "16")
    assert "pp" in {row["strategy"] for row in plan["rows"]}
    assert counted["stages"] == 3 * 3  # 3 stages × 3 checkpointing modes (was 16 × 3)


def test_a_pipeline_of_many_different_layers_is_modelled_not_measured(
    capsys: pytest.CaptureFixture[str], counted: dict[str, int]
) -> None:
    stages = pipeline.MEASURED_STAGES_MAX + 2
    hidden = ", ".join(["8"] * stages)
    plan = _plan(capsys, *MLP, f"model.hidden_sizes=[{hidden}]", "--nproc-per-node", str(stages))
    assert "pp" in {row["strategy"] for row in plan["rows"]}
    assert counted["stages"] == 0


@pytest.mark.parametrize("accum", [100, 1_000_000, 8_388_608])
def test_any_number_of_micro_batches_costs_the_same_forward_passes(
    accum: int, capsys: pytest.CaptureFixture[str], counted: dict[str, int]
) -> None:
    plan = _plan(capsys, *MLP, f"train.grad_accum={accum}", f"train.batch_size={2 * accum}", "--nproc-per-node", "2")
    assert plan["micro_batch"] == 1 and "pp" in {row["strategy"] for row in plan["rows"]}
    # 3 checkpointing modes × 2 steps × 2 micro-batches; the pp row modelled (its schedule would run each)
    assert (counted["steps"], counted["stages"], counted["micro_batches"]) == (3, 0, 12)


def test_a_pipeline_of_a_few_micro_batches_is_measured(
    capsys: pytest.CaptureFixture[str], counted: dict[str, int]
) -> None:
    _plan(capsys, *MLP, "train.grad_accum=8", "--nproc-per-node", "2")
    assert counted["stages"] == 2 * 3  # both stages, each checkpointing mode


@pytest.mark.parametrize("memory", ["1PiB", "1024TiB", "1000TB"])
def test_find_batch_on_a_huge_device_is_capped(
    memory: str, capsys: pytest.CaptureFixture[str], counted: dict[str, int]
) -> None:
    from gputrain.plan.batch import MAX_MICRO_BATCH

    plan = _plan(capsys, *MLP, "--device-memory", memory, "--find-batch")
    assert plan["largest_micro_batch"] == MAX_MICRO_BATCH
    assert counted["steps"] <= 3 + 3  # the table's three, then 1, 2 and the cap


@pytest.mark.parametrize("memory", ["1MiB", "1048576"])
def test_find_batch_on_the_smallest_device_says_none_fits(memory: str, capsys: pytest.CaptureFixture[str]) -> None:
    plan = _plan(capsys, *MLP, "--device-memory", memory, "--find-batch")
    assert plan["largest_micro_batch"] == 0 and plan["auto"] is None


# ----------------------------------------------------------------------------- lr-find's sweep
SWEEPS: list[tuple[str, list[str], list[str]]] = [
    ("steps-two-billion", ["--steps", "2000000000"], ["--steps must be at most 10000"]),
    ("steps-just-over", ["--steps", "10001"], ["--steps must be at most 10000"]),
    ("steps-four", ["--steps", "4"], ["--steps must be at least 5"]),
    ("steps-zero", ["--steps", "0"], ["--steps must be at least 5"]),
    ("steps-negative", ["--steps", "-7"], ["--steps must be at least 5"]),
    ("steps-float", ["--steps", "1e9"], ["--steps"]),
    ("start-zero", ["--start-lr", "0"], ["--start-lr must be a number > 0"]),
    ("start-negative", ["--start-lr", "-1"], ["--start-lr must be a number > 0"]),
    ("start-nan", ["--start-lr", "nan"], ["--start-lr must be a number > 0"]),
    ("start-denormal", ["--start-lr", "5e-324"], ["--start-lr must be in [1e-12, 1000]"]),
    ("start-tiny", ["--start-lr", "1e-300"], ["--start-lr must be in [1e-12, 1000]"]),
    ("end-inf", ["--end-lr", "inf"], ["--end-lr must be a number > 0"]),
    ("end-huge", ["--end-lr", "1e300"], ["--end-lr must be in [1e-12, 1000]"]),
    ("end-over-lr-max", ["--end-lr", "1001"], ["--end-lr must be in [1e-12, 1000]"]),
    ("end-below-start", ["--start-lr", "1", "--end-lr", "0.1"], ["must be larger than --start-lr"]),
    ("end-equal-start", ["--start-lr", "0.5", "--end-lr", "0.5"], ["must be larger than --start-lr"]),
]


@pytest.mark.parametrize(("argv", "words"), [c[1:] for c in SWEEPS], ids=[c[0] for c in SWEEPS])
def test_a_sweep_out_of_bounds_is_one_line(
    argv: list[str], words: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _refused(capsys, ["lr-find", "--run-dir", str(tmp_path / "sweep"), *argv, *MLP], words)
    assert not (tmp_path / "sweep").exists()


def _under_a_file(tmp: Path) -> str:
    (tmp / "file").write_text("x")
    return str(tmp / "file" / "sweep")


def _inside_a_run(tmp: Path) -> str:
    (tmp / "run" / "checkpoints").mkdir(parents=True)
    (tmp / "run" / "config.toml").write_text("")
    return str(tmp / "run" / "checkpoints" / "sweep")


RUN_DIRS = [
    ("under-a-file", _under_a_file, ["Not a directory"]),
    ("in-proc", lambda tmp: "/proc/gputrain-sweep", ["cannot be written"]),
    ("in-proc-self", lambda tmp: "/proc/self/sweep", ["cannot be written"]),
    ("name-over-255", lambda tmp: str(tmp / ("a" * 300)), ["File name too long"]),
    ("path-over-4096", lambda tmp: str(tmp / "/".join(["b" * 200] * 25)), ["cannot be written"]),
    ("empty", lambda tmp: "", ["empty"]),
    ("inside-a-runs-checkpoints", _inside_a_run, ["is inside the run directory"]),
]


@pytest.mark.parametrize(("where", "words"), [c[1:] for c in RUN_DIRS], ids=[c[0] for c in RUN_DIRS])
def test_a_sweep_run_dir_that_cannot_be_is_one_line(
    where: Any, words: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _refused(capsys, ["lr-find", "--steps", "5", "--run-dir", where(tmp_path), *MLP], ["--run-dir", *words])
