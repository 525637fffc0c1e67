"""`gputrain sweep` against the real Optuna, in real processes: 8 trials over optim.lr and
train.batch_size on digits, two sweep processes sharing one SQLite study, one of them killed with
SIGKILL in the middle of a trial and started again.

The order is made certain without timing: a first sweep (seeded sampler) completes two good trials,
so the pruner has a median; the second process's seeded sampler draws a hopeless lr first, which the
pruner stops; the killed process's trial holds itself (GPUTRAIN_TEST_FAULT's `stop`) after its first
checkpoint, so the kill lands mid-trial, and the trial it leaves RUNNING is retried and resumes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.waiting import wait_until

optuna = pytest.importorskip("optuna", reason="gputrain sweep needs the optuna extra (pip install gputrain[optuna])")

ROOT = Path(__file__).resolve().parents[3]
MAX_STEPS = 15
SPACE = f"""
optim.lr = {{choice = [1e-6, 1e-2]}}
train.batch_size = {{choice = [32, 64]}}

[base]
model.name = "mlp"
data.name = "digits"
train.epochs = 100
train.max_steps = {MAX_STEPS}
eval.every_steps = 5
eval.every_epochs = 0
checkpoint.every_steps = 5
log.tensorboard = false
"""
# pruned at step 10 at the earliest: the held trial (forward 8) is past its step-5 checkpoint first
OPTIONS = ["--trials", "8", "--sampler", "random", "--prune-startup", "1", "--prune-warmup", "6"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "GPUTRAIN_TEST_FAULT"}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def sweep(cwd: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gputrain", "sweep", "space.toml", *args],
        cwd=cwd,
        env=_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> str:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    return out


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the held trial through Linux's /proc")
def test_two_sweeps_share_a_study_survive_a_kill_and_the_best_config_reproduces(tmp_path: Path) -> None:
    (tmp_path / "space.toml").write_text(SPACE)
    sweep_dir = tmp_path / "runs" / "sweep-space"
    # two good trials first (seed 0 draws lr 1e-2 twice): the pruner's median
    finish(sweep(tmp_path, *OPTIONS[:1], "2", *OPTIONS[2:], "--seed", "0"))

    marker = tmp_path / "held"
    killed = sweep(tmp_path, *OPTIONS, "--seed", "3", GPUTRAIN_TEST_FAULT=f"rank=0,forward=8,action=stop,once={marker}")
    other = sweep(tmp_path, *OPTIONS, "--seed", "2")  # draws lr 1e-6 first: pruned
    wait_until(marker.exists, what="the first sweep's trial to reach step 8")
    (trial_pid,) = _children(killed.pid)
    wait_until(lambda: _state(trial_pid) == "T", what="the trial to hold itself")
    killed.send_signal(signal.SIGKILL)
    killed.communicate()
    os.kill(trial_pid, signal.SIGCONT)  # it takes the SIGTERM its parent's death sent: a checkpoint, then exit
    restarted = sweep(tmp_path, *OPTIONS, "--seed", "4")
    finish(other)
    out = finish(restarted)

    study = optuna.load_study(study_name="space", storage=f"sqlite:///{sweep_dir / 'study.db'}")
    trials = study.get_trials()
    from gputrain.sweep.study import RUN_DIR, finished

    done = finished(trials)
    states = sorted(t.state.name for t in done)
    assert len(done) == 8 and "FAIL" not in states, states  # 8 trials, none lost to the kill
    numbers = [t.number for t in done]
    run_dirs = [t.user_attrs[RUN_DIR] for t in done]
    assert len(set(numbers)) == 8 and len(set(run_dirs)) == 8  # none run twice
    assert sorted(run_dirs) == sorted(str(p) for p in sweep_dir.glob("trial-*") if p.is_dir())

    # the killed trial: failed, and its copy resumed its run directory from a checkpoint
    retried = [t for t in trials if t.system_attrs.get("retry_history")]
    assert len(retried) == 1 and retried[0] in done, out
    again = Path(retried[0].user_attrs[RUN_DIR])
    assert "resumed from" in (sweep_dir / f"{again.name}.log").read_text()

    # pruned trials stopped early: fewer steps in their metrics.jsonl than a complete trial's
    def last_step(run_dir: str) -> int:
        rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
        return max(r["step"] for r in rows if "step" in r)

    pruned = [t for t in done if t.state.name == "PRUNED"]
    complete = [t for t in done if t.state.name == "COMPLETE"]
    assert pruned and complete
    assert all(last_step(t.user_attrs[RUN_DIR]) < MAX_STEPS for t in pruned)
    assert all(last_step(t.user_attrs[RUN_DIR]) == MAX_STEPS for t in complete)

    # best.toml trains again to its trial's value exactly (same seed, CPU)
    best = min(complete, key=lambda t: (t.value, t.number))
    assert f"best: trial {best.number} ({best.user_attrs[RUN_DIR]})," in out
    again_dir = tmp_path / "again"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "gputrain",
            "train",
            "--config",
            str(sweep_dir / "best.toml"),
            "--run-dir",
            str(again_dir),
        ],
        cwd=tmp_path,
        env=_env(),
        check=True,
        capture_output=True,
    )
    from gputrain.sweep.study import Settings
    from gputrain.sweep.trial import result

    settings = Settings(**study.user_attrs["gputrain"])
    assert result(again_dir, settings, 0, again_dir) == best.value
