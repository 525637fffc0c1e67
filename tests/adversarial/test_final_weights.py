"""The final weights of a sharded job, written in place by every rank (checkpoint/final_weights.py):
plans from descriptions that do not add up are refused, never written; every block of every layout
lands at its place; a failure on any rank fails the save on every rank and leaves no file behind
(a full disk said as such), the previous model.safetensors untouched; placements that are no
block (partial sums) are gathered one tensor at a time and written right."""

from __future__ import annotations

import errno
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gputrain.checkpoint.final_weights import Block, make_plan, runs
from tests.dist.harness import run_ranks

F32 = torch.float32


def _b(name: str, shape: tuple[int, ...], local: tuple[int, ...], offset: tuple[int, ...], dtype: torch.dtype = F32
       ) -> Block:
    return Block(name, shape, dtype, local, offset, gathered=False)


# (case, every rank's blocks, every rank's tied groups, the error's words or None)
PLANS: list[tuple[str, list[list[Block]], list[list[list[str]]], str | None]] = [
    ("dim-0 halves", [[_b("w", (4, 3), (2, 3), (0, 0))], [_b("w", (4, 3), (2, 3), (2, 0))]], [[], []], None),
    ("uneven, one rank's shard empty", [[_b("w", (1, 3), (1, 3), (0, 0))], [_b("w", (1, 3), (0, 3), (1, 0))]],
     [[], []], None),
    ("column halves", [[_b("w", (4, 3), (4, 2), (0, 0))], [_b("w", (4, 3), (4, 1), (0, 2))]], [[], []], None),
    ("a 2x2 grid on 4 ranks", [[_b("w", (4, 4), (2, 2), (i, j))] for i in (0, 2) for j in (0, 2)], [[]] * 4, None),
    ("a tensor only one rank holds", [[_b("a", (2,), (2,), (0,))], [_b("b", (3,), (3,), (0,))]], [[], []], None),
    ("an empty tensor", [[_b("e", (0, 4), (0, 4), (0, 0))], [_b("e", (0, 4), (0, 4), (0, 0))]], [[], []], None),
    ("a scalar on both ranks", [[_b("s", (), (), ())], [_b("s", (), (), ())]], [[], []], None),
    ("a gap", [[_b("w", (4,), (2,), (0,))], [_b("w", (4,), (1,), (3,))]], [[], []], "do not cover it exactly"),
    ("an overlap with the right total", [[_b("w", (4,), (2,), (0,))], [_b("w", (4,), (2,), (1,))],
                                         [_b("w", (4,), (0,), (4,))]], [[], [], []], "do not cover it exactly"),
    ("a block past the end", [[_b("w", (4,), (2,), (0,))], [_b("w", (4,), (3,), (2,))]], [[], []],
     "do not cover it exactly"),
    ("a grid missing a cell", [[_b("w", (2, 2), (1, 1), (i, j))] for i, j in [(0, 0), (0, 1), (1, 0)]], [[]] * 3,
     "do not cover it exactly"),
    ("a cell twice under two sizes", [[_b("w", (2, 2), (1, 2), (0, 0))], [_b("w", (2, 2), (1, 1), (1, 0))],
                                      [_b("w", (2, 2), (2, 1), (0, 1))]], [[]] * 3, "do not cover it exactly"),
    ("ranks disagree on a shape", [[_b("w", (4,), (4,), (0,))], [_b("w", (5,), (5,), (0,))]], [[], []],
     "different shapes or dtypes"),
    ("ranks disagree on a dtype", [[_b("w", (4,), (4,), (0,))], [_b("w", (4,), (4,), (0,), torch.float16)]],
     [[], []], "different shapes or dtypes"),
    ("tied names of different shapes", [[_b("a", (4,), (4,), (0,)), _b("b", (5,), (5,), (0,))]], [[["a", "b"]]],
     "different shapes or dtypes"),
]


@pytest.mark.parametrize(("blocks", "ties", "error"), [p[1:] for p in PLANS], ids=[p[0] for p in PLANS])
def test_a_plan_is_made_only_of_descriptions_that_add_up(blocks: list[list[Block]], ties: list[list[list[str]]],
                                                         error: str | None) -> None:
    if error is not None:
        with pytest.raises(RuntimeError, match=error):
            make_plan(blocks, ties)
        return
    plan = make_plan(blocks, ties)
    for rank_blocks in blocks:  # every block has one writer, one of the ranks holding it
        for block in rank_blocks:
            writer = plan.writer[(plan.stored[block.name], block.key)]
            assert any(b.key == block.key and plan.stored[b.name] == plan.stored[block.name] for b in blocks[writer])
    names = {b.name for rank_blocks in blocks for b in rank_blocks}
    assert set(plan.layout.starts) == names


# (case, every rank's blocks, tied groups, {stored name: kept}, how many blocks each rank writes)
SHARES: list[tuple[str, list[list[Block]], list[list[list[str]]], dict[str, str], list[int]]] = [
    ("HSDP: 2 replicas of 2 shards, 2 tensors",
     [[_b(n, (4,), (2,), (o,)) for n in "ab"] for o in (0, 2, 0, 2)], [[]] * 4, {}, [1, 1, 1, 1]),
    ("replicated tensors of one size spread over 2 ranks",
     [[_b(n, (8,), (8,), (0,)) for n in "abcd"]] * 2, [[], []], {}, [2, 2]),
    ("a large replicated tensor and three small ones", [[_b("big", (9,), (9,), (0,))] +
     [_b(n, (3,), (3,), (0,)) for n in "xyz"]] * 2, [[], []], {}, [1, 3]),
    ("a pipeline's tied matrix, both names on both end stages",
     [[_b("lm_head.weight", (6, 2), (6, 2), (0, 0)), _b("wte.weight", (6, 2), (6, 2), (0, 0)),
       _b("wpe.weight", (3, 2), (3, 2), (0, 0))],
      [_b("lm_head.weight", (6, 2), (6, 2), (0, 0)), _b("wte.weight", (6, 2), (6, 2), (0, 0)),
       _b("ln_f.weight", (2,), (2,), (0,))]],
     [[["lm_head.weight", "wte.weight"]], [["lm_head.weight", "wte.weight"]]], {"wte.weight": "lm_head.weight"},
     [2, 1]),
    ("tied groups of two ranks sharing a name are one", [[_b("a", (2,), (2,), (0,)), _b("b", (2,), (2,), (0,))],
                                                         [_b("b", (2,), (2,), (0,)), _b("c", (2,), (2,), (0,))]],
     [[["a", "b"]], [["b", "c"]]], {"b": "a", "c": "a"}, [1, 0]),
]


@pytest.mark.parametrize(("blocks", "ties", "aliases", "counts"), [s[1:] for s in SHARES], ids=[s[0] for s in SHARES])
def test_each_block_is_written_once_by_one_of_its_holders_spread_by_size(
        blocks: list[list[Block]], ties: list[list[list[str]]], aliases: dict[str, str], counts: list[int]) -> None:
    plan = make_plan(blocks, ties)
    assert {n: k for n, k in plan.stored.items() if n != k} == aliases
    assert [list(plan.writer.values()).count(r) for r in range(len(blocks))] == counts
    head = plan.layout.header
    assert (b'"__metadata__"' in head) == bool(aliases) and all(f'"{a}":{{'.encode() not in head for a in aliases)


# (shape, block shape, offset): every layout a Shard/Replicate placement can give, and odd sizes
RUNS = [((7,), (3,), (4,)), ((5, 3), (2, 3), (3, 0)), ((5, 3), (5, 1), (0, 2)), ((4, 6, 2), (4, 3, 2), (0, 3, 0)),
        ((4, 6, 2), (2, 3, 2), (2, 0, 0)), ((4, 6, 2), (4, 6, 1), (0, 0, 1)), ((3, 5), (1, 2), (2, 3)), ((), (), ()),
        ((2, 3), (0, 3), (2, 0)), ((6,), (6,), (0,)), ((1, 1, 9), (1, 1, 4), (0, 0, 5))]


@pytest.mark.parametrize(("shape", "local", "offset"), RUNS)
def test_a_blocks_runs_put_every_element_at_its_place(shape: tuple[int, ...], local: tuple[int, ...],
                                                      offset: tuple[int, ...]) -> None:
    whole = np.arange(math.prod(shape)).reshape(shape)
    block = whole[tuple(slice(o, o + n) for o, n in zip(offset, local))].reshape(-1)
    written = np.full(math.prod(shape), -1)
    for at, local_at, count in runs(shape, local, offset):
        written[at : at + count] = block[local_at : local_at + count]
    expected = np.full(shape, -1)
    expected[tuple(slice(o, o + n) for o, n in zip(offset, local))] = whole[
        tuple(slice(o, o + n) for o, n in zip(offset, local))]
    assert (written.reshape(shape) == expected).all()


def _model(mesh: Any) -> torch.nn.Module:
    """Every kind of tensor on 2 ranks: an uneven dim-0 shard, a column shard, a partial sum and a strided
    shard (FSDP over TP's rows; neither a block: gathered), a replicated DTensor, a plain buffer, a tie."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard

    torch.manual_seed(0)
    m = torch.nn.Module()
    m.rows = torch.nn.Parameter(distribute_tensor(torch.randn(5, 3), mesh, [Shard(0)]))
    m.cols = torch.nn.Parameter(distribute_tensor(torch.randn(4, 5), mesh, [Shard(1)]))
    m.summed = torch.nn.Parameter(DTensor.from_local(torch.randn(3, 2) * (mesh.get_rank() + 1), mesh, [Partial()]))
    m.strided = torch.nn.Parameter(distribute_tensor(torch.randn(6, 4), mesh, [_StridedShard(0, split_factor=3)]))
    m.norm = torch.nn.Parameter(distribute_tensor(torch.randn(3), mesh, [Replicate()]))
    m.register_buffer("count", torch.tensor([7, 8], dtype=torch.int64))
    m.alias = m.rows  # tied: stored once, as "alias" (first in sorted order)
    return m


def _expected(m: torch.nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return {n: (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone() for n, t in m.state_dict().items()}


def _failures(rank: int, root: str) -> dict[str, Any]:
    """Each case on this rank (one process group); what each left behind."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from gputrain.checkpoint import final_weights
    from gputrain.distributed.context import DistContext

    dist.init_process_group("gloo")
    ctx = DistContext(rank=rank, world_size=2, local_rank=rank)
    mesh = init_device_mesh("cpu", (2,))
    model = _model(mesh)
    whole = {n: t.numpy() for n, t in _expected(model).items() if n != "rows"}
    out: dict[str, Any] = {"whole": whole}
    real = final_weights._pwrite_all

    def full_disk_on(which: int) -> Any:
        def write(fd: int, data: memoryview, at: int) -> None:
            if rank == which and at > 0:  # rank 0's header goes through; the data does not
                raise OSError(errno.ENOSPC, "No space left on device")
            real(fd, data, at)
        return write

    real_open = final_weights._open_part

    def elsewhere(tmp: Path) -> int:  # rank 1 on another node, the run directory not shared
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(tmp))

    cases = ("ok", "rank 1 disk full", "rank 0 disk full", "target is a folder", "over an older file", "not shared")
    for case in cases:
        folder = Path(root) / case.replace(" ", "-")
        if rank == 0:
            folder.mkdir()
            if case == "target is a folder":
                (folder / "model.safetensors").mkdir()
            if case == "over an older file":
                (folder / "model.safetensors").write_bytes(b"old")
        dist.barrier()
        final_weights._pwrite_all = full_disk_on(1 if case == "rank 1 disk full" else 0) if "disk" in case else real
        final_weights._open_part = elsewhere if case == "not shared" and rank == 1 else real_open
        try:
            final_weights.save_sharded_weights(folder / "model.safetensors", model, ctx)
            out[case] = "ok"
        except Exception as err:  # noqa: BLE001 - the outcome is what each rank raised
            out[case] = f"{type(err).__name__}: {err}"
        finally:
            final_weights._pwrite_all, final_weights._open_part = real, real_open
        dist.barrier()
    return out


@pytest.fixture(scope="module")
def failures(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("failures")
    return root, run_ranks(_failures, str(root), timeout_s=120)


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("case", ["ok", "over an older file"])
def test_every_kind_of_placement_lands_in_the_file(failures: Any, case: str) -> None:
    from safetensors import safe_open

    root, outcomes = failures
    assert [o[case] for o in outcomes] == ["ok", "ok"]
    folder = root / case.replace(" ", "-")
    assert _left(folder) == ["model.safetensors"]
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert f.metadata() == {"rows": "alias"}
        saved = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no iterator
    whole = outcomes[0]["whole"]
    assert saved.keys() == whole.keys()
    for name, array in whole.items():
        assert torch.equal(saved[name], torch.from_numpy(array)), name


# (case, rank 0's error, rank 1's error)
FAILURES = [
    ("rank 1 disk full", r"DiskFull: no space left on the device for the weights \(model.safetensors\)",
     r"OSError: \[Errno 28\] No space left on device"),
    ("rank 0 disk full", r"DiskFull: no space left on the device for the weights \(model.safetensors\)",
     r"RunError: rank 0 could not write its part of .*model.safetensors: \[Errno 28\] No space left on device"),
    ("target is a folder", r"IsADirectoryError: ", r"RunError: rank 0 could not write its part of .*model.safetensors"),
    ("not shared", r"RunError: rank 1 could not write its part of .*model.safetensors: .*\.model\.safetensors\.tmp-\S+ "
     r"is not there: the run directory must be on storage every rank sees",
     r"RunError: .*\.model\.safetensors\.tmp-\S+ is not there: the run directory must be on storage every rank sees"),
]


@pytest.mark.parametrize(("case", "first", "second"), FAILURES, ids=[f[0] for f in FAILURES])
def test_a_failure_on_any_rank_fails_every_rank_and_leaves_nothing(failures: Any, case: str, first: str,
                                                                   second: str) -> None:
    import re

    root, outcomes = failures
    assert re.match(first, outcomes[0][case]), outcomes[0][case]
    assert re.match(second, outcomes[1][case]), outcomes[1][case]
    folder = root / case.replace(" ", "-")
    assert [n for n in _left(folder) if ".tmp-" in n] == []  # no temporary left
    if case == "target is a folder":
        assert (folder / "model.safetensors").is_dir() and not any((folder / "model.safetensors").iterdir())
    else:
        assert _left(folder) == []
