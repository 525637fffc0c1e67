"""Degrees and meshes, Slurm's variables, the torchrun command line, pipeline cuts: no process groups."""

from __future__ import annotations

import pytest
from torch import nn

from gputrain.config.schema import ParallelConfig
from gputrain.distributed.launch import LaunchOptions, torchrun_args
from gputrain.distributed.parallel_dims import ParallelDims, dims_for_strategy
from gputrain.distributed.pp import layer_units, split_units
from gputrain.distributed.slurm import first_host, slurm_world
from gputrain.errors import ConfigError, UsageError


def test_minus_one_takes_the_remaining_ranks_and_coordinates_are_row_major() -> None:
    dims = ParallelDims(dp_replicate=2, dp_shard=-1, tp=2, world_size=8)
    assert (dims.dp_shard, dims.dp_size, dims.fsdp_enabled, dims.ddp_enabled) == (2, 4, True, False)
    # mesh (pp, dp_replicate, dp_shard, tp) = (1, 2, 2, 2): rank 5 = replica 1, shard 0, tp 1
    assert dims.coordinates(5) == {"pp": 0, "dp_replicate": 1, "dp_shard": 0, "tp": 1}
    assert [dims.dp_rank(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]  # TP peers read the same data


def test_degrees_that_do_not_fit_the_world_name_the_fields() -> None:
    with pytest.raises(ConfigError, match=r"parallel.dp_replicate × parallel.dp_shard × parallel.tp × parallel.pp "
                                          r".*must multiply to the world size 4, not 3"):
        ParallelDims(dp_replicate=3, world_size=4)
    with pytest.raises(ConfigError, match="does not divide the world size 4"):
        ParallelDims(tp=3, dp_shard=-1, world_size=4)
    with pytest.raises(ConfigError, match="only one degree may be -1.*parallel.tp"):
        ParallelDims(dp_shard=-1, tp=-1, world_size=4)
    with pytest.raises(ConfigError, match="parallel.strategy = 'none': 'none' trains on one process, but 2 ranks"):
        dims_for_strategy("none", ParallelConfig(), 2)


def test_strategies_map_to_degrees() -> None:
    cfg = ParallelConfig()
    assert dims_for_strategy("ddp", cfg, 4).shape == (1, 4, 1, 1)
    assert dims_for_strategy("fsdp", cfg, 4).shape == (1, 1, 4, 1)
    assert dims_for_strategy("tp", cfg, 4).shape == (1, 1, 1, 4)
    assert dims_for_strategy("tp", ParallelConfig(tp=2), 4).shape == (1, 1, 2, 2)  # TP inside, FSDP across
    assert dims_for_strategy("pp", cfg, 2).shape == (2, 1, 1, 1)
    hybrid = dims_for_strategy("hybrid", ParallelConfig(dp_replicate=2, dp_shard=-1, tp=2), 8)
    assert hybrid.shape == (1, 2, 2, 2) and hybrid.describe() == "dp_replicate=2 × dp_shard=2 × tp=2"


def test_slurm_variables_become_torchrun_ones() -> None:
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "123456",
           "SLURM_JOB_NODELIST": "gpu[003-004,007],cpu01"}
    assert slurm_world(env) == (5, 8, 1, "gpu003", str(29500 + 3456))
    # where srun was typed (a login node under salloc) is not where rank 0 runs: the step's first node is
    assert slurm_world({**env, "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.7"})[3] == "gpu003"  # type: ignore[index]
    assert slurm_world({**env, "SLURM_STEP_NODELIST": "gpu[007-008]"})[3] == "gpu007"  # type: ignore[index]
    assert slurm_world({**env, "SLURM_STEP_NUM_TASKS": "2"})[1] == 2  # type: ignore[index]
    assert slurm_world({**env, "SLURM_NTASKS": "1"}) is None  # one task: not distributed
    assert first_host("node17") == "node17"


def test_torchrun_command_line() -> None:
    child = ["train", "--run-dir", "runs/x", "train.epochs=1"]
    assert torchrun_args(LaunchOptions(nproc_per_node=2), child) == [
        "--nproc-per-node=2", "--max-restarts=0", "--standalone", "-m", "gputrain", *child]
    multi = torchrun_args(LaunchOptions(nproc_per_node=8, nnodes=2, node_rank=1, rdzv_endpoint="n0:29400",
                                        max_restarts=3), child)
    assert multi[:5] == ["--nproc-per-node=8", "--max-restarts=3", "--nnodes=2",  # c10d assigns the node ranks
                         "--rdzv-backend=c10d", "--rdzv-endpoint=n0:29400"]
    with pytest.raises(UsageError, match="--nnodes > 1 needs --rdzv-endpoint"):
        LaunchOptions(nproc_per_node=8, nnodes=2).check()


def test_pipeline_cuts_between_layers_with_parameters() -> None:
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    assert layer_units(model) == [[0, 1, 2], [3, 4], [5]]
    assert split_units(3, 2) == [range(0, 2), range(2, 3)]
    assert split_units(8, 4) == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
