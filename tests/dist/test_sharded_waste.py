"""FSDP without N× waste, on 2 real gloo ranks: each rank evaluates its own share of a split (in
lockstep, padded so nobody waits forever) and the gathered figures equal one process's, as do those
of 2 ranks each holding the whole model (`gputrain evaluate`'s layout), every layout decided by
`eval_layout` as build.py and use/evaluate.py decide it; at a save
each rank hashes its own shards and rank 0 commits with their digests; at resume the ranks verify
together, each hashing its share of the files, and skip a damaged checkpoint alike."""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from tests.dist.harness import run_ranks

METRICS = ["accuracy", "precision", "recall", "f1", "auroc", "loss"]
N = 101  # odd, and not a multiple of the batch: the shares differ by one sample, one rank pads a step
SKIP_BAD = frozenset({4, 9, 50})


class Samples(Dataset):
    """Read sample by sample (the Subset path of `shard_for_eval`); the indices in `bad` are unreadable."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, bad: frozenset[int] = frozenset()) -> None:
        self.x, self.y, self.bad = x, y, bad

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if i in self.bad:
            raise OSError(f"cannot read sample {i}")
        return self.x[i], self.y[i]


def _evaluations(rank: int) -> dict[str, Any]:
    """The same splits evaluated by one process (a plain copy) and by the 2 FSDP ranks."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from gputrain.data.guard import BadSample
    from gputrain.data.tensors import TensorData
    from gputrain.distributed.context import DistContext
    from gputrain.distributed.parallel_dims import ParallelDims
    from gputrain.evaluate.evaluator import EvalSpec, Evaluator
    from gputrain.evaluate.layout import eval_layout
    from gputrain.train.tasks import Task

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(N, 8, generator=g), torch.randint(0, 3, (N,), generator=g)
    splits = {"tensors": TensorData(x, y), "samples": Samples(x, y), "skip": Samples(x, y, SKIP_BAD)}
    task = Task("classification", F.cross_entropy, num_classes=3)
    cpu = torch.device("cpu")

    spec = EvalSpec(task, METRICS, contextlib.nullcontext)

    def evaluator(m: nn.Module, ctx: DistContext, on_error: str = "fail", dims: ParallelDims | None = None) -> Evaluator:
        layout = eval_layout(ctx, cpu, 16, dims)
        out.setdefault("layouts", []).append(layout.sharing)
        return Evaluator(m, m, spec, layout, on_error=on_error)

    fsdp = ParallelDims(dp_shard=2, world_size=2)

    reference = copy.deepcopy(model)
    fully_shard(model, mesh=init_device_mesh("cpu", (2,)))
    rows = [0]
    model[0].register_forward_pre_hook(lambda _m, args: rows.__setitem__(0, rows[0] + len(args[0])))
    ctx = DistContext(rank=rank, world_size=2, local_rank=rank, dp_rank=rank, dp_size=2)
    out: dict[str, Any] = {}
    for name, data in splits.items():
        on_error = "skip" if name == "skip" else "fail"
        one, two = evaluator(reference, DistContext(), on_error), evaluator(model, ctx, on_error, fsdp)
        whole = evaluator(reference, ctx, on_error)  # each rank holds the whole model: its share, no lockstep
        rows[0] = 0
        first, second = one.evaluate(data, "test", keep_scores=True), two.evaluate(data, "test", keep_scores=True)
        out[name] = {"one": first.metrics, "two": second.metrics, "rows": rows[0],
                     "skipped": (first.skipped, second.skipped),
                     "scores": [(s.scores, s.targets, s.total) for s in (first.scores, second.scores)],
                     "replicated": whole.evaluate(data, "test").metrics}
    # rank 1's first sample (index 1) is unreadable: it has no batch at all, gets rank 0's as its pad,
    # and both ranks raise instead of waiting in each other's collectives
    try:
        evaluator(model, ctx, dims=fsdp).evaluate(Samples(x, y, frozenset({1})), "val")
        out["first_unreadable"] = "no error"
    except BadSample as err:
        out["first_unreadable"] = str(err)
    return out


def _checkpoints(rank: int, root: Path) -> dict[str, Any]:
    """Sharded saves (sync and async) and resumes of an FSDP model, recording which files this rank
    hashed in each phase."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import gputrain.checkpoint.io as io
    from gputrain.checkpoint.by_rank import find_resumable_together
    from gputrain.checkpoint.sharded import ShardedSaver
    from gputrain.distributed.context import DistContext

    hashed: list[str] = []
    real_sha256 = io.sha256_of

    def recording_sha256(path: Path) -> str:
        hashed.append(path.name)
        return real_sha256(path)

    io.sha256_of = recording_sha256  # type: ignore[assignment]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 3))
    fully_shard(model, mesh=init_device_mesh("cpu", (2,)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    ctx = DistContext(rank=rank, world_size=2, local_rank=rank, dp_rank=rank, dp_size=2)
    out: dict[str, Any] = {}

    def phase(name: str, run: Any) -> Any:
        dist.barrier()
        hashed.clear()
        result = run()
        out[name] = sorted(hashed)
        dist.barrier()
        return result

    phase("save", lambda: ShardedSaver(ctx).save(root, 2, model, optimizer, {"rng": rank, "step": 2}))
    background = ShardedSaver(ctx, async_save=True)
    phase("async_save", lambda: (background.save(root, 4, model, optimizer, {"rng": rank, "step": 4}),
                                 background.wait()))
    out["verified"] = []
    if rank == 0:  # every byte, the one-process way: the digests the ranks reported are the files'
        for step in (2, 4):
            io.verify_checkpoint(root / f"step-{step}")
            out["verified"].append(step)
    out["resume"] = phase("resume_hashed", lambda: find_resumable_together(root, ctx)).name
    if rank == 0:  # rank 1's shard of the newest checkpoint is damaged, its size unchanged
        shard = root / "step-4" / "__1_0.distcp"
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    out["resume_damaged"] = phase("damaged_hashed", lambda: find_resumable_together(root, ctx)).name
    io.sha256_of = real_sha256  # type: ignore[assignment]
    return out


def _job(rank: int, root: str) -> dict[str, Any]:
    return {"eval": _evaluations(rank), "ckpt": _checkpoints(rank, Path(root) / "checkpoints")}


@pytest.fixture(scope="module")
def by_rank(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_ranks(_job, str(tmp_path_factory.mktemp("sharded_waste")), timeout_s=180)


@pytest.fixture(scope="module")
def evaluations(by_rank: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r["eval"] for r in by_rank]


@pytest.mark.parametrize("split", ["tensors", "samples", "skip"])
def test_fsdp_ranks_evaluate_their_own_shares_and_match_one_process(evaluations: list[dict[str, Any]],
                                                                  split: str) -> None:
    for rank, result in enumerate(evaluations):
        got = result[split]
        one, two = got["one"], got["two"]
        assert one.keys() == two.keys() == set(METRICS)
        for name in ("accuracy", "precision", "recall", "f1", "auroc"):  # counts and ranks: exact
            assert two[name] == one[name], (split, name)
        assert two["loss"] == pytest.approx(one["loss"], rel=1e-6)  # sums of batch means: rounding only
        skipped = 3 if split == "skip" else 0
        assert got["skipped"] == (skipped, skipped)
        # its own share (51 or 50 samples, 4 batches of 8 then the rest) plus one pad batch at most,
        # not the 101 of the whole split
        share = len([i for i in range(rank, N, 2) if split != "skip" or i not in SKIP_BAD])
        assert share <= got["rows"] <= share + 8, got["rows"]
        (s1, t1, n1), (s2, t2, n2) = got["scores"]
        assert n1 == n2 == N - skipped and len(s2) == len(s1)
        if split == "skip":  # shares with holes: complete, concatenated share by share
            order = np.lexsort((t2, s2[:, 0]))
            s2, t2 = s2[order], t2[order]
            order = np.lexsort((t1, s1[:, 0]))
            s1, t1 = s1[order], t1[order]
        np.testing.assert_array_equal(t2, t1)  # the split's order, as one process keeps it
        np.testing.assert_allclose(s2, s1, rtol=1e-5, atol=1e-6)
        replicated = got["replicated"]  # 2 ranks each holding the whole model, as `gputrain evaluate` runs
        assert replicated.keys() == one.keys()
        for name in ("accuracy", "precision", "recall", "f1", "auroc"):
            assert replicated[name] == one[name], (split, name)
        assert replicated["loss"] == pytest.approx(one["loss"], rel=1e-6)


def test_the_layout_each_evaluator_was_given(evaluations: list[dict[str, Any]]) -> None:
    """One process evaluates the whole split; FSDP ranks in lockstep; ranks holding the whole model
    each their share with the plain module."""
    for result in evaluations:
        assert result["layouts"][:3] == ["whole", "lockstep", "replicated"]


def test_a_rank_whose_share_cannot_be_read_at_all_stops_every_rank(evaluations: list[dict[str, Any]]) -> None:
    assert evaluations[0]["first_unreadable"] == (
        "val split: another rank could not read a sample of its share (its error log names it)")
    assert "cannot read sample 1" in evaluations[1]["first_unreadable"], evaluations[1]["first_unreadable"]


def test_each_rank_hashes_its_own_shards_at_a_save_and_rank_0_commits(by_rank: list[dict[str, Any]]) -> None:
    first, second = (r["ckpt"] for r in by_rank)
    for phase in ("save", "async_save"):
        # rank 0: its own shard, and what it writes itself (state.pt, .metadata, the manifest for the
        # marker); never rank 1's shard
        assert first[phase] == [".metadata", "__0_0.distcp", "manifest.json", "state.pt"], phase
        assert second[phase] == ["__1_0.distcp"], phase
    assert first["verified"] == [2, 4]  # the manifests built from the ranks' digests check out byte for byte


def test_ranks_verify_a_checkpoint_together_at_resume(by_rank: list[dict[str, Any]]) -> None:
    first, second = (r["ckpt"] for r in by_rank)
    assert first["resume"] == second["resume"] == "step-4"
    shards = [name for r in (first, second) for name in r["resume_hashed"] if name.endswith(".distcp")]
    assert sorted(shards) == ["__0_0.distcp", "__1_0.distcp"]  # each shard read once, by its writer
    assert "state.pt" in first["resume_hashed"] and "state.pt" not in second["resume_hashed"]
    # rank 1 finds its shard damaged: both ranks skip step-4 and resume from step-2
    assert first["resume_damaged"] == second["resume_damaged"] == "step-2"
    assert "__1_0.distcp" not in first["damaged_hashed"]


LAYOUTS = {"hybrid_2x2": {"parallel.dp_replicate": 2, "parallel.dp_shard": 2},
           "fsdp_2_x_tp_2": {"parallel.dp_shard": 2, "parallel.tp": 2}}


def _layouts(rank: int) -> dict[str, Any]:
    """On 4 ranks, the zoo's MLP laid out by gputrain's own parallelize (hybrid replicate × shard,
    and FSDP × TP, whose TP peers must read the same share): evaluated by the Evaluator build.py
    makes, and by one process."""
    import torch.distributed as dist

    from gputrain.config import load_config
    from gputrain.data.spec import DataSpec
    from gputrain.data.tensors import TensorData
    from gputrain.distributed.auto import StrategyChoice
    from gputrain.distributed.context import DistContext
    from gputrain.distributed.parallelize import parallelize, setup_parallel
    from gputrain.models import build_model
    from gputrain.models.plans import tp_plan_for
    from gputrain.evaluate.evaluator import EvalSpec, Evaluator
    from gputrain.evaluate.layout import eval_layout
    from gputrain.train.tasks import Task

    dist.init_process_group("gloo")
    cpu = torch.device("cpu")
    g = torch.Generator().manual_seed(1)
    data = TensorData(torch.randn(N, 8, generator=g), torch.randint(0, 3, (N,), generator=g))
    task = Task("classification", F.cross_entropy, num_classes=3)
    out: dict[str, Any] = {}
    for name, degrees in LAYOUTS.items():
        config = load_config(None, {"model.name": "mlp", "model.hidden_sizes": [32, 32], "parallel.strategy": "hybrid",
                                    **degrees})
        torch.manual_seed(0)
        model = build_model(config.model, DataSpec(task="classification", input_shape=(8,), num_classes=3))
        reference = copy.deepcopy(model)
        ctx = DistContext(rank=rank, world_size=4, local_rank=rank, dp_rank=rank, dp_size=4)
        choice = StrategyChoice("hybrid", "none")
        ctx, dims = setup_parallel(ctx, choice, config, cpu)
        par = parallelize(model, ctx, config, cpu, choice, tp_plan=tp_plan_for(model))
        rows = [0]
        par.model.register_forward_pre_hook(lambda _m, args: rows.__setitem__(0, rows[0] + len(args[0])))
        spec = EvalSpec(task, METRICS, contextlib.nullcontext)
        two = Evaluator(par.step_model, par.model, spec, eval_layout(ctx, cpu, 16, dims))
        one = Evaluator(reference, reference, spec, eval_layout(DistContext(), cpu, 16))
        first, second = one.evaluate(data, "test", keep_scores=True), two.evaluate(data, "test", keep_scores=True)
        assert first.scores is not None and second.scores is not None
        out[name] = {"one": first.metrics, "two": second.metrics, "rows": rows[0], "dp": ctx.dp_rank,
                     "dp_size": ctx.dp_size, "targets": (first.scores.targets, second.scores.targets)}
    return out


@pytest.mark.slow
def test_hybrid_and_tp_layouts_shard_evaluation_over_data_parallel_ranks_only() -> None:
    for rank, result in enumerate(run_ranks(_layouts, world=4, timeout_s=240)):
        for name, got in result.items():
            one, two = got["one"], got["two"]
            for metric in ("accuracy", "precision", "recall", "f1", "auroc"):
                assert two[metric] == one[metric], (rank, name, metric)
            assert two["loss"] == pytest.approx(one["loss"], rel=1e-6), (rank, name)
            np.testing.assert_array_equal(got["targets"][1], got["targets"][0])
            # hybrid: 4 data-parallel ranks; FSDP × TP: 2, each share read by both TP peers
            assert got["dp_size"] == (4 if name == "hybrid_2x2" else 2), (rank, name)
            share = len(range(got["dp"], N, got["dp_size"]))
            assert share <= got["rows"] <= share + 16 // got["dp_size"], (rank, name, got["rows"])
