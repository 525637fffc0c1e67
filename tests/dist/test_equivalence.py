"""N ranks × micro-batch b train exactly like 1 process × batch N·b (fp32, no dropout), whatever the
strategy; and a checkpoint written by one layout resumes on another with the same next losses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from tests.dist.conftest import TWO_RANK_CASES, step_losses


@pytest.mark.parametrize("case", list(TWO_RANK_CASES))
def test_two_ranks_match_one_process(dist_runs: dict[str, Path], case: str) -> None:
    reference = TWO_RANK_CASES[case][1]
    expected, got = step_losses(dist_runs[reference]), step_losses(dist_runs[case])
    resumed = "_from_" in case
    assert sorted(got) == ([3, 4] if resumed else [1, 2, 3, 4])
    torch.testing.assert_close(torch.tensor([got[s] for s in got]), torch.tensor([expected[s] for s in got]),
                               rtol=1e-5, atol=1e-5)
    ref = load_file(str(dist_runs[reference] / "model.safetensors"))
    weights = load_file(str(dist_runs[case] / "model.safetensors"))  # written by the ranks in place
    assert weights.keys() == ref.keys()
    for key in ref:
        torch.testing.assert_close(weights[key], ref[key], rtol=1e-5, atol=1e-5, msg=f"{case}: {key}")
    summary = json.loads((dist_runs[case] / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["global_step"] == 4


def test_a_compiled_ddp_run_checks_its_first_step_on_every_rank(dist_runs: dict[str, Path]) -> None:
    """Each rank compares its own module, unwrapped (no second all-reduce), and the ranks agree."""
    summary = json.loads((dist_runs["ddp_compile"] / "summary.json").read_text())
    assert summary["train"]["compile"] == "compiled (first step's gradients equal eager's)"
    assert json.loads((dist_runs["single"] / "summary.json").read_text())["train"]["compile"] is None


def test_sharded_checkpoint_is_complete_and_resumes_on_one_process(dist_runs: dict[str, Path], tmp_path: Path) -> None:
    from gputrain.checkpoint import verify_checkpoint
    from gputrain.train.trainer import Trainer
    from tests.dist.jobs import BASE

    step2 = dist_runs["fsdp_ckpt"] / "checkpoints" / "step-2"
    verify_checkpoint(step2)
    assert sorted(p.name for p in step2.iterdir()) == [".metadata", "COMMITTED", "__0_0.distcp", "__1_0.distcp",
                                                        "manifest.json", "state.pt"]
    verify_checkpoint(dist_runs["fsdp_async_ckpt"] / "checkpoints" / "step-4")
    Trainer.from_config(None, run_dir=tmp_path / "resumed", overrides=BASE + [
        "parallel.strategy=none", f"checkpoint.resume={step2}"]).fit()
    got, expected = step_losses(tmp_path / "resumed"), step_losses(dist_runs["single"])
    assert sorted(got) == [3, 4]
    torch.testing.assert_close(torch.tensor([got[3], got[4]]), torch.tensor([expected[3], expected[4]]),
                               rtol=1e-5, atol=1e-5)


def test_a_pipeline_checkpoint_resumes_on_one_process(dist_runs: dict[str, Path], tmp_path: Path) -> None:
    """Each pipeline rank's optimizer lists only its stage's parameters; the checkpoint must still
    say which group holds every parameter, or a one-process resume refuses it."""
    from gputrain.train.trainer import Trainer
    from tests.dist.jobs import BASE

    step2 = dist_runs["pp_ckpt"] / "checkpoints" / "step-2"
    Trainer.from_config(None, run_dir=tmp_path / "resumed", overrides=BASE + [
        "parallel.strategy=none", f"checkpoint.resume={step2}"]).fit()
    got, expected = step_losses(tmp_path / "resumed"), step_losses(dist_runs["single"])
    assert sorted(got) == [3, 4]
    torch.testing.assert_close(torch.tensor([got[3], got[4]]), torch.tensor([expected[3], expected[4]]),
                               rtol=1e-5, atol=1e-5)


def test_gpt_tensor_parallel_plan_matches_the_unsharded_model(dist_results: dict[str, Any]) -> None:
    """The GPT plan (sharded MLP/embeddings/head, sequence-parallel norms, tied weights) on a model of
    the expected structure: 3 AdamW steps, same losses as without TP."""
    tp, reference = zip(*dist_results["gpt_tp"])
    torch.testing.assert_close(torch.tensor(tp), torch.tensor(reference), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("plan", ["dict", "function"])
def test_a_user_models_tp_plan_trains_like_one_process(dist_runs: dict[str, Path], plan: str) -> None:
    """Trainer(tp_plan=...) on a model of the user's own (no built-in plan): the plan as a dict and as
    a function of the module and the tp degree; 2 TP ranks give the one-process losses and weights."""
    expected, got = step_losses(dist_runs["user_single"]), step_losses(dist_runs[f"user_tp_{plan}"])
    assert sorted(got) == [1, 2, 3, 4]
    torch.testing.assert_close(torch.tensor([got[s] for s in got]), torch.tensor([expected[s] for s in got]),
                               rtol=1e-5, atol=1e-5)
    ref = load_file(str(dist_runs["user_single"] / "model.safetensors"))
    weights = load_file(str(dist_runs[f"user_tp_{plan}"] / "model.safetensors"))  # written from the shards
    assert weights.keys() == ref.keys() == {"0.weight", "0.bias", "2.weight", "2.bias"}
    for key in ref:
        torch.testing.assert_close(weights[key], ref[key], rtol=1e-5, atol=1e-5, msg=f"{plan}: {key}")
    summary = json.loads((dist_runs[f"user_tp_{plan}"] / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["global_step"] == 4


def test_a_user_models_tp_plan_splits_its_layers_and_without_one_is_a_config_error(
    dist_results: dict[str, Any],
) -> None:
    for rank in dist_results["by_rank"]:
        # column-wise: each rank holds half of the first layer's 32 outputs; row-wise: half of the second's inputs
        assert rank["user_tp"]["shards"] == {"dict": [(16, 16), (10, 16)], "function": [(16, 16), (10, 16)]}
        assert rank["user_tp"]["degrees"] == [2]  # called once, for the whole model, with the tp degree
        error = rank["user_tp"]["error"]
        assert error is not None and "parallel.tp" in error and "tp_plan=" in error, error


@pytest.mark.parametrize("case", ["ddp", "fsdp"])
def test_data_parallel_runs_time_their_gradient_communication(dist_runs: dict[str, Path], case: str) -> None:
    breakdown = json.loads((dist_runs[case] / "summary.json").read_text())["train"]["time_breakdown"]
    assert breakdown["comm"] is not None and breakdown["comm"] > 0, breakdown
    assert sum(breakdown.values()) == pytest.approx(1.0)


def test_tensor_parallel_comm_is_not_reported_as_zero(dist_runs: dict[str, Path]) -> None:
    breakdown = json.loads((dist_runs["tp"] / "summary.json").read_text())["train"]["time_breakdown"]
    assert breakdown["comm"] is None  # inside forward_backward: unmeasured, never a made-up 0
    assert breakdown["forward_backward"] > 0


def test_a_late_all_reduce_is_charged_to_comm_not_backward(dist_results: dict[str, Any]) -> None:
    from tests.dist.jobs import COMM_DELAY_S

    for seconds in (r["comm_split"] for r in dist_results["by_rank"]):
        assert seconds["comm"] >= COMM_DELAY_S * 0.95, seconds
        assert seconds["forward_backward"] < COMM_DELAY_S / 2, seconds


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_one_rank_with_nan_gradients_makes_every_rank_skip(dist_results: dict[str, Any], strategy: str) -> None:
    for result in (r["nonfinite"][strategy] for r in dist_results["by_rank"]):
        assert result == {"nonfinite_steps": 1, "schedule_steps": 5, "finite": True}


def _eval_rows(run_dir: Path) -> dict[str, dict[str, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["split"]: {k: v for k, v in row.items() if k not in ("split", "step", "epoch")}
            for row in rows if "split" in row}


@pytest.mark.parametrize("case", ["ddp", "fsdp", "fsdp_accum", "hybrid_shard", "tp", "pp_gpipe"])
def test_evaluation_on_two_ranks_equals_one_process(dist_runs: dict[str, Path], case: str) -> None:
    """DDP and FSDP ranks each evaluate half of the split and combine (FSDP in lockstep); TP and PP
    ranks, with no data-parallel peer here, evaluate all of it. All must report the metrics of the
    whole split, as one process does."""
    expected, got = _eval_rows(dist_runs["single"]), _eval_rows(dist_runs[case])
    assert set(got) == set(expected) == {"val", "test"}
    for split in expected:
        assert got[split].keys() == expected[split].keys()
        for name, value in expected[split].items():
            assert got[split][name] == pytest.approx(value, rel=1e-5, abs=1e-6), (split, name)
