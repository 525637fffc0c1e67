"""A GPT built on the meta device, split or sharded there, then materialised rank by rank: the
weights are an eager build's, and no rank ever holds the whole model (models/meta.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.dist.harness import run_ranks
from tests.dist.meta_jobs import meta_init_check

LAYOUTS = ["fsdp", "fsdp_ac", "tp"]


@pytest.fixture(scope="module")
def by_rank() -> list[dict[str, dict[str, Any]]]:
    return run_ranks(meta_init_check, timeout_s=180)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_materialised_shards_gather_to_the_eager_weights(by_rank: list[dict[str, dict[str, Any]]], layout: str) -> None:
    for rank, results in enumerate(by_rank):
        assert results[layout]["equal"], f"rank {rank}: {layout} weights differ from the eager build's"
        assert results[layout]["tied"], "the embedding and the head must stay one parameter"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_no_rank_materialises_the_whole_model(by_rank: list[dict[str, dict[str, Any]]], layout: str) -> None:
    largest = max(results[layout]["local_numel"] for results in by_rank)
    whole = by_rank[0][layout]["whole_numel"]
    assert largest < 0.6 * whole, (largest, whole)
    # while materialising: this rank's shards plus one module's full tensors at a time, never the model
    peak = max(results[layout]["peak_bytes"] for results in by_rank)
    assert peak < by_rank[0][layout]["whole_bytes"], (peak, by_rank[0][layout]["whole_bytes"])
