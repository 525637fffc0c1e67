"""train.batch_size=auto on 2 real gloo ranks: an out-of-memory error injected on one rank only makes
both ranks shrink the micro-batch, and they end on the same one."""

from __future__ import annotations

from tests.dist.harness import run_ranks


def _find(rank: int) -> tuple[int, list[int]]:
    import torch
    import torch.distributed as dist

    from gputrain.plan.batch import confirm_by_trials, oom_trial

    dist.init_process_group("gloo")
    tried: list[int] = []

    def step(micro: int) -> None:
        tried.append(micro)
        if rank == 1 and micro > 40:  # only rank 1's device is too small above 40
            raise torch.OutOfMemoryError("injected")

    return confirm_by_trials(100, oom_trial(step)), tried


def test_an_oom_on_one_rank_counts_for_all() -> None:
    results = run_ranks(_find, timeout_s=60)
    assert results[0] == results[1] == (40, [100, 80, 64, 51, 40])
