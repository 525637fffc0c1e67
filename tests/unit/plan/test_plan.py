"""The memory plan on CPU: fake-tensor estimate against a real step, the CLI, bad input, the batch finder."""

from __future__ import annotations

import json

import pytest
import torch

from gputrain.cli import main
from gputrain.config import load_config
from gputrain.models.mlp import MLP
from gputrain.optim import build_optimizer
from gputrain.plan.batch import confirm_by_trials, plan_micro_batch
from gputrain.plan.layouts import layout_bytes, usable_bytes
from gputrain.plan.measure import measure_real, repeat_sample
from gputrain.plan.planner import PlanTarget

TOLERANCE = 0.10  # the goal: within 10% of the measured peak


def _target() -> PlanTarget:
    config = load_config(None, [])
    model = MLP(64, [256, 256], 10, "relu", 0.0)
    return PlanTarget(
        model=model,
        sample=(torch.randn(64), torch.tensor(3)),
        loss_of=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]),
        make_optimizer=lambda ps: build_optimizer(ps, config.optim, 64, torch.device("cpu")),
        device=torch.device("cpu"),
    )


@pytest.mark.parametrize("micro", [16, 256])
def test_fake_estimate_is_within_tolerance_of_a_real_step(micro: int) -> None:
    target = _target()
    planned = target.step(micro)
    assert planned is not None
    batch = repeat_sample(target.sample, micro)
    measured = measure_real(target.model, batch, target.loss_of, target.make_optimizer).peak
    total = layout_bytes(planned, target.shape(), "none", 1).total
    assert abs(total - measured) <= TOLERANCE * measured
    assert planned.weights == 4 * sum(p.numel() for p in target.model.parameters())


def test_sharding_divides_the_states() -> None:
    target = _target()
    step = target.step(16)
    assert step is not None
    one = layout_bytes(step, target.shape(), "none", 1)
    fsdp = layout_bytes(step, target.shape(), "fsdp", 4)
    assert fsdp.weights == one.weights // 4 and fsdp.optimizer == one.optimizer // 4
    offload = layout_bytes(step, target.shape(), "fsdp", 4, offload=True)
    assert offload.weights == 0 and offload.host > 0
    # a CPU job: the host's memory is the device's, and offload frees none of it (measured alike:
    # tests/dist/test_plan_memory.py)
    on_cpu = layout_bytes(step, target.shape(), "fsdp", 4, offload=True, host_is_device=True)
    assert on_cpu.cpu_offload and on_cpu.host == 0 and on_cpu.total == fsdp.total


def test_find_batch_fits_the_budget() -> None:
    target = _target()
    budget = 64 * 2**20
    micro = plan_micro_batch(target, 1, budget, "none")
    assert micro > 16
    assert layout_bytes(target.step(micro), target.shape(), "none", 1).total <= usable_bytes(budget)  # type: ignore[arg-type]


def test_trials_shrink_until_every_rank_agrees() -> None:
    tried: list[int] = []

    def trial(micro: int) -> bool:
        tried.append(micro)
        return micro <= 40

    assert confirm_by_trials(100, trial) == 40 and tried == [100, 80, 64, 51, 40]
    assert confirm_by_trials(100, lambda m: True, agree=lambda ok: False) == 0  # another rank always fails


def test_plan_cli_prints_each_layout_and_auto(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "model.name=mlp", "--nproc-per-node", "2", "--device-memory", "1GiB", "--find-batch"])
    out = capsys.readouterr().out
    assert code == 0
    rows = [line.split()[0] for line in out.splitlines() if line.startswith(" ")]
    assert {"ddp", "fsdp", "tp", "pp", "hybrid"} <= set(rows)
    assert "auto picks: ddp" in out and "largest micro-batch that fits" in out


@pytest.mark.parametrize("ranks", ["2", "4"])
def test_a_one_process_layout_is_no_row_of_several_ranks(ranks: str, capsys: pytest.CaptureFixture[str]) -> None:
    """parallel.strategy=none is refused on more than one rank: listed as a row that "fits", it would
    say a 4-rank job could take it. It is left out, with the reason; on one rank it is the only row."""
    assert main(["plan", "model.name=mlp", "--nproc-per-node", ranks, "--device-memory", "1GiB", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert "none" not in {row["strategy"] for row in plan["rows"]}
    assert any(why.startswith(f"none on {ranks} ranks: trains on one process") for why in plan["left_out"])
    assert main(["plan", "model.name=mlp", "--device-memory", "1GiB", "--json"]) == 0
    assert {row["strategy"] for row in json.loads(capsys.readouterr().out)["rows"]} == {"none"}


def test_the_batch_is_divided_over_the_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    """train.batch_size is the global batch: 64 over 4 data-parallel ranks is 16 per device."""
    assert main(["plan", "model.name=mlp", "train.batch_size=64", "--nproc-per-node", "4"]) == 0
    assert "micro-batch 16 per device, 4 rank(s)" in capsys.readouterr().out


def test_plan_cli_says_what_would_fit(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "model.name=mlp", "model.hidden_sizes=[1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024]", "--device-memory", "32MiB"])
    out = capsys.readouterr().out
    assert code == 1
    assert "DOES NOT FIT" in out and "over the" in out and "devices: --nproc-per-node" in out


@pytest.mark.parametrize("value", ["-3GiB", "lots", "0GiB"])
def test_impossible_device_memory_exits_2_with_one_line(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--device-memory", value])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1 and "--device-memory" in err


def test_batch_size_auto_is_a_config_value() -> None:
    config = load_config(None, ["train.batch_size=auto"])
    assert config.train.batch_size == "auto"
    assert load_config(None, ["train.batch_size=64", "train.micro_batch_size=auto"]).train.micro_batch_size == "auto"
