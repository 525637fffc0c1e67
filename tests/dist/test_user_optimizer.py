"""A user's optimizer under 2-rank FSDP (issue 29 §1): a factory gets the sharded parameters by the
model's names and trains, with its parameter groups and a OneCycleLR; a third-party class with two
groups resumes bit for bit through the sharded checkpoint; an instance over the unsharded model is
refused in one line that says to pass a factory, before the run directory is made (under DDP, which
keeps the parameters, an instance trains)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from tests.dist.harness import run_ranks
from tests.dist.user_optim_jobs import user_optimizer_check

NAMES = ("adamw", "lion", "lion_resumed", "ddp_instance", "instance", "fused_sgd")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("user_optim")
    return root, run_ranks(user_optimizer_check, {n: str(root / n) for n in NAMES}, timeout_s=240)


def test_a_factory_gets_the_sharded_parameters_and_trains(runs: tuple[Path, list[dict[str, Any]]]) -> None:
    _, by_rank = runs
    for result in by_rank:
        assert result["seen"]["sharded"], "the factory must get FSDP's parameters, not the model's as built"
        assert result["seen"]["names"] == ["0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias"]
        assert result["adamw"]["status"] == "completed"
        assert result["lrs"][2] > result["lrs"][0]  # the head's group kept its own LR through the cycle
    record = by_rank[0]["adamw"]["optimizer"]
    assert [g["params"] for g in record["param_groups"]] == [1, 3, 2]  # the matrix; biases and the norm; the head
    assert record["scheduler"] == "OneCycleLR" and record["nonfinite_guard"] == "host"


def test_a_third_party_class_resumes_bit_for_bit_through_the_sharded_checkpoint(
    runs: tuple[Path, list[dict[str, Any]]],
) -> None:
    root, by_rank = runs
    assert all("stopped by SIGTERM at step 3" in (result["stopped"] or "") for result in by_rank)
    assert all(result["lion_resumed"] == "completed" for result in by_rank)

    def rows(name: str) -> list[tuple[int, float, float]]:
        lines = (root / name / "metrics.jsonl").read_text().splitlines()
        return [(r["step"], r["loss"], r["lr"]) for r in map(json.loads, lines) if "split" not in r]

    assert rows("lion") == rows("lion_resumed") and len(rows("lion")) == 6
    a, b = load_file(root / "lion" / "model.safetensors"), load_file(root / "lion_resumed" / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def test_an_instance_is_refused_in_one_line_before_the_run_directory(runs: tuple[Path, list[dict[str, Any]]]) -> None:
    root, by_rank = runs
    for result in by_rank:
        message = result["instance"]
        assert message is not None and "\n" not in message
        assert message.startswith("optimizer= is an instance over parameters the training step does not update "
                                  "(FSDP shards them): pass a factory")
        assert "functools.partial(torch.optim.AdamW, lr=1e-3)" in message
    assert not (root / "instance").exists()
    assert all(result["ddp_instance"] == "completed" for result in by_rank)  # DDP keeps the parameters


def test_a_fused_kernel_without_a_sharding_rule_is_refused(runs: tuple[Path, list[dict[str, Any]]]) -> None:
    """fused=True SGD over FSDP's DTensors: torch would raise at the first step; refused when made."""
    for result in runs[1]:
        assert result["fused_sgd"] == ("optimizer= is a SGD with fused=True, whose fused kernel cannot step these "
                                       "(sharded) parameters: leave fused unset (torch then uses foreach)")
