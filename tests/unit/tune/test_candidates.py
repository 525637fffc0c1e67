"""Which candidates `gputrain tune` measures, and which the plan rules out, with why (tune/candidates.py)."""

from __future__ import annotations

from gputrain.tune.candidates import AUTO, Candidate, Space, generate, micro_batches


def _space(**kw) -> Space:
    base = {"batch_size": 64, "max_ranks": 2, "cores": 2, "device_type": "cpu", "fits": lambda *a: None}
    base.update(kw)
    return Space(**base)


def test_the_global_batch_is_the_configs_for_every_candidate():
    candidates, _ = generate(_space(batch_size=48, max_ranks=2, micro_batches=4))
    assert candidates
    for c in candidates:
        assert c.micro_batch * c.grad_accum * c.ranks == 48
        assert "train.grad_accum=auto" in c.overrides()
        assert f"train.micro_batch_size={c.micro_batch}" in c.overrides()


def test_micro_batches_are_the_largest_powers_of_two_dividing_the_share_and_the_share():
    assert micro_batches(64, 3) == [16, 32, 64]
    assert micro_batches(48, 3) == [8, 16, 48]
    assert micro_batches(7, 3) == [1, 7]
    assert micro_batches(1, 3) == [1]


def test_cpu_ranks_times_threads_never_exceed_the_cores_and_strategies_by_rank_count():
    candidates, _ = generate(_space(cores=4, max_ranks=3, batch_size=12))
    assert {c.ranks for c in candidates} == {1, 2, 3}
    for c in candidates:
        assert c.ranks * c.threads <= 4
        assert c.strategy == ("none" if c.ranks == 1 else c.strategy)
        assert c.strategy in (("none",) if c.ranks == 1 else ("ddp", "fsdp"))
        assert not c.cuda_graphs  # a CPU has none
    assert {c.threads for c in candidates if c.ranks == 1} == {4, 2}


def test_ranks_the_batch_does_not_divide_over_or_beyond_the_cores_are_pruned_with_why():
    candidates, pruned = generate(_space(batch_size=10, max_ranks=3, cores=2))
    assert {c.ranks for c in candidates} == {1, 2}
    assert [p.candidate.ranks for p in pruned] == [3]
    assert "does not divide over 3 ranks" in pruned[0].reason
    _, pruned = generate(_space(batch_size=12, max_ranks=3, cores=2))
    assert "3 ranks on 2 cores" in pruned[0].reason


def test_the_plan_prunes_what_does_not_fit_and_checkpointing_only_where_it_is_needed():
    def fits(ranks, strategy, ac, micro, accum):
        if micro >= 64:
            return "9 GiB planned per rank, 1 GiB usable"
        if micro == 32 and ac == "none":
            return "too big without recompute"
        return None

    candidates, pruned = generate(_space(max_ranks=1, fits=fits, compile=(False,)))
    by_micro = {c.micro_batch: c.activation_checkpointing for c in candidates}
    assert by_micro == {16: "none", 32: "selective"}
    assert len(pruned) == 1 and pruned[0].candidate.micro_batch == 64
    assert "does not fit even with full checkpointing" in pruned[0].reason and "9 GiB" in pruned[0].reason


def test_a_strategy_the_model_cannot_take_is_left_out_with_the_plans_why():
    candidates, pruned = generate(
        _space(left_out=lambda ranks, s: "no blocks to shard" if s == "fsdp" else None, compile=(False,))
    )
    assert not [c for c in candidates if c.strategy == "fsdp"]
    assert any(p.candidate.strategy == "fsdp" and "no blocks to shard" in p.reason for p in pruned)


def test_compile_cuda_graphs_and_loader_workers_are_crossed_where_they_apply():
    candidates, _ = generate(_space(device_type="cuda", max_ranks=2, loader_fed=True, cores=8))
    assert {c.compile for c in candidates} == {False, True}
    graphs = {c.strategy for c in candidates if c.cuda_graphs}
    assert graphs == {"none", "ddp"}  # CUDA graphs: one device or DDP, never FSDP
    assert {c.threads for c in candidates} == {None}  # on a GPU the threads are the config's
    assert {c.num_workers for c in candidates} == {0, 4}
    cpu, _ = generate(_space(loader_fed=False))
    assert {c.num_workers for c in cpu} == {None}


def test_order_no_compile_first_then_fewer_ranks_and_micro_batch_ascending_within_a_layout():
    candidates, _ = generate(_space())
    compiled = [c.compile for c in candidates]
    assert compiled == sorted(compiled)
    families: dict = {}
    for c in candidates:
        families.setdefault(c.family(), []).append(c.micro_batch)
    assert all(m == sorted(m) for m in families.values())


def test_overrides_and_labels_say_the_layout():
    c = Candidate(2, "ddp", 16, 2, "selective", 1, True, False, 2)
    assert c.overrides() == [
        "parallel.strategy=ddp",
        "parallel.activation_checkpointing=selective",
        "train.micro_batch_size=16",
        "train.grad_accum=auto",
        "train.compile=true",
        "train.cuda_graphs=false",
        "train.num_threads=1",
        "data.num_workers=2",
    ]
    assert c.label() == "ddp ×2 1t mb16×2 ac=selective w2 compile"
    assert Candidate(1, AUTO).overrides() == ["parallel.strategy=auto"]


def test_the_threads_auto_gives_now_are_tried_and_first_for_each_rank_count():
    busy = _space(cores=8, max_ranks=2, batch_size=16, compile=(False,), auto_threads=lambda ranks: 3 // ranks)
    candidates, _ = generate(busy)
    assert {c.threads for c in candidates if c.ranks == 1} == {8, 4, 3}
    assert {c.threads for c in candidates if c.ranks == 2} == {4, 2, 1}
    for ranks, auto in ((1, 3), (2, 1)):
        assert next(c for c in candidates if c.ranks == ranks).threads == auto
