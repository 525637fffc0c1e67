"""Two nodes for real, on one machine: two torchrun launchers (`--nnodes 2 --node-rank 0/1`, c10d
rendezvous on localhost, one rank each), and two processes started the way srun starts the tasks
of a 2-node step (SLURM_* variables only). Each trains a short `gputrain train`, and its losses
equal one process's with the same global batch."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.dist.harness import ROOT, free_port
from tests.dist.test_launch import step_losses

ARGS = ["model.name=mlp", "data.name=synthetic", "data.shape=[16]", "data.num_samples=400",
        "model.hidden_sizes=[32,32]", "train.batch_size=32", "train.epochs=1", "train.max_steps=4",
        "log.every_steps=1", "log.tensorboard=false", "log.progress=none", 'eval.metrics=["loss"]',
        "optim.name=adamw", "optim.lr=0.01", "train.device=cpu", "parallel.timeout_s=60"]
HOSTS = "localhost,node02"  # a 2-node job's node list; rank 0 runs on the first
# what the probe prints before training: how this process placed itself in the job
PROBE = ("import json, os, sys; from gputrain.distributed.context import env_world; "
         "print('PLACE ' + json.dumps([*env_world(), os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'], "
         "os.environ.get('LOCAL_WORLD_SIZE')]), flush=True); "
         "from gputrain.cli import main; sys.exit(main(sys.argv[1:]))")
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
               "GROUP_RANK", "TORCHELASTIC_RUN_ID")


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and not k.startswith("SLURM")}
    return {**env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **extra}


def _run_all(commands: list[list[str]], envs: list[dict[str, str]], timeout_s: float = 240) -> list[tuple[int, str]]:
    """Start every command at once, wait for all; kill the ones started here if any outlives the limit."""
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) for cmd, env in zip(commands, envs)]
    results = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=timeout_s)
            results.append((proc.returncode, out))
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    return results


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    from gputrain.train.trainer import Trainer

    run_dir = tmp_path_factory.mktemp("one_process") / "run"
    Trainer.from_config(None, run_dir=run_dir, overrides=[*ARGS, "parallel.strategy=none",
                                                         "checkpoint.enabled=false"]).fit()
    return step_losses(run_dir)


def _check_run(run_dir: Path, expected: list[float], results: list[tuple[int, str]]) -> None:
    for code, out in results:
        assert code == 0, out[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2 and summary["global_step"] == 4
    torch.testing.assert_close(torch.tensor(step_losses(run_dir)), torch.tensor(expected), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_two_launchers_with_c10d_rendezvous_train_like_one_process(tmp_path: Path, one_process: list[float]) -> None:
    """FSDP across the two 'nodes', with sharded checkpoints and evaluation."""
    run_dir, port = tmp_path / "run", free_port()
    commands = [[sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
                 "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}",
                 "--rdzv-id", "two-nodes", "-m", "gputrain", "train", "--run-dir", str(run_dir), *ARGS,
                 "parallel.strategy=fsdp", "checkpoint.every_steps=2"] for node in (0, 1)]
    results = _run_all(commands, [_env({}), _env({})])
    _check_run(run_dir, one_process, results)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-2", "step-4"]
    from gputrain.checkpoint import verify_checkpoint

    verify_checkpoint(run_dir / "checkpoints" / "step-4")


def _job_id_with_free_port() -> int:
    """A Slurm job id whose derived port (29500 + id % 10000) is free here."""
    for _ in range(200):
        job = random.randrange(1, 10_000_000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", 29500 + job % 10000))
            except OSError:
                continue
        return job
    raise RuntimeError("no free port in 29500-39499")


@pytest.mark.slow
def test_tasks_started_as_srun_starts_a_2_node_step_find_each_other_and_train(
    tmp_path: Path, one_process: list[float]
) -> None:
    """No torchrun variable is set: rank, world size, local rank, the address of rank 0 (the step's
    first node, not the host srun ran on) and the port (from the job id) all come from Slurm's."""
    run_dir, job = tmp_path / "run", _job_id_with_free_port()
    common = {"SLURM_JOB_ID": str(job), "SLURM_NTASKS": "2", "SLURM_NPROCS": "2", "SLURM_STEP_NUM_TASKS": "2",
              "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2", "SLURM_STEP_NUM_NODES": "2",
              "SLURM_JOB_NODELIST": HOSTS, "SLURM_NODELIST": HOSTS, "SLURM_STEP_NODELIST": HOSTS,
              "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_STEP_ID": "0",
              "SLURM_LAUNCH_NODE_IPADDR": "192.0.2.1"}  # where srun ran (a login node): not rank 0's host
    envs = [_env({**common, "SLURM_PROCID": str(task), "SLURM_NODEID": str(task), "SLURM_LOCALID": "0",
                  "SLURMD_NODENAME": HOSTS.split(",")[task]}) for task in (0, 1)]
    command = [sys.executable, "-c", PROBE, "train", "--run-dir", str(run_dir), *ARGS, "parallel.strategy=ddp",
               "checkpoint.enabled=false"]
    results = _run_all([command, command], envs)
    places = [json.loads(next(line for line in out.splitlines() if line.startswith("PLACE "))[6:])
              for _, out in results]
    port = str(29500 + job % 10000)
    assert places == [[0, 2, 0, "localhost", port, "1"], [1, 2, 0, "localhost", port, "1"]]
    _check_run(run_dir, one_process, results)
