"""`gputrain rl` from the command line: the run directory of any gputrain run, the metrics rows
practitioners compare PPO runs by, and bad input as one line with exit 2."""

from __future__ import annotations

import html
import io
import json
import re
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from gputrain.cli import main
from gputrain.config import load_config
from gputrain.report.build import write_report
from tests.unit.rl.test_resume import BASE

ROOT = Path(__file__).resolve().parents[3]
ROW_KEYS = {"step", "env_steps", "episodic_return", "episodic_length", "episodes", "return_last_100", "lr",
            "policy_loss", "value_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac", "explained_variance",
            "loss", "grad_norm", "env_steps_per_s"}


def _run(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(args)
    return code, out.getvalue(), err.getvalue()


def test_a_run_leaves_the_run_directory_of_any_gputrain_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    code, out, _ = _run(["rl", "--run-dir", str(run_dir), *BASE, "log.progress=plain"])
    assert code == 0
    for name in ("config.toml", "env.json", "metrics.jsonl", "summary.json", "model.safetensors"):
        assert (run_dir / name).is_file(), name
    assert (run_dir / "checkpoints" / "step-6" / "COMMITTED").is_file()
    assert load_config(run_dir / "config.toml").rl.num_envs == 8  # the resolved config reloads
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3, 4, 5, 6] and all(set(row) == ROW_KEYS for row in rows)
    assert rows[-1]["env_steps"] == 768 and rows[-1]["episodes"] > 0 and rows[-1]["env_steps_per_s"] > 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["global_step"] == 6
    assert summary["rl"]["env_steps"] == 768 and summary["train"]["samples_per_s"] > 0
    assert "iteration 6/6" in out and "rl: PPO (categorical policy" in out
    # the report draws what an RL run is judged by
    write_report([run_dir], tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text()
    titles = [html.unescape(t) for t in re.findall(r"<figcaption>([^<]*)</figcaption>", page)]
    for title in ("episodic return", "environment steps/s", "approximate KL", "clip fraction", "policy entropy"):
        assert title in titles, titles


def test_the_progress_bar_runs(tmp_path: Path) -> None:
    code, out, _ = _run(["rl", "--run-dir", str(tmp_path / "run"), *BASE, "log.progress=bar"])
    assert code == 0 and "6/6" in out


@pytest.mark.parametrize("overrides, words", [
    (["rl.env=CartPol-v1"], ["rl.env", "unknown environment", "did you mean 'CartPole-v1'?"]),
    (["rl.env=pendulum"], ["rl.env", "did you mean 'Pendulum-v1'?"]),
    (["rl.num_minibatches=3"], ["rl.num_minibatches = 3", "rl.num_envs × rl.num_steps = 4 × 128 = 512"]),
    (["rl.num_envs=6", "rl.num_steps=10", "rl.num_minibatches=7"], ["rl.num_minibatches", "6 × 10 = 60"]),
    (["rl.env=Pendulum-v1", "rl.policy=categorical"], ["rl.policy", "continuous actions", "use rl.policy=gaussian"]),
    (["rl.env=Acrobot-v1", "rl.policy=gaussian"], ["rl.policy", "discrete actions", "use rl.policy=categorical"]),
    (["rl.gamma=1.5"], ["rl.gamma = 1.5", "in [0, 1]"]),
    (["parallel.strategy=fsdp"], ["parallel.strategy", "data-parallel"]),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, overrides: list[str], words: list[str]) -> None:
    run_dir = tmp_path / "run"
    code, _, err = _run(["rl", "--run-dir", str(run_dir), *overrides])
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    for word in words:
        assert word in err, (word, err)
    assert not run_dir.exists()


def test_environments_that_do_not_divide_over_the_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    code, _, err = _run(["rl", "--run-dir", str(tmp_path / "run"), "rl.num_envs=8", "rl.num_minibatches=2"])
    assert code == 2 and "rl.num_envs = 8: must divide evenly over the 3 ranks" in err


def test_the_launching_command_refuses_them_before_any_rank_starts(tmp_path: Path) -> None:
    probe = ("import sys, runpy; sys.argv = ['gputrain', 'rl', '--nproc-per-node', '2', '--run-dir', sys.argv[1],"
             " 'rl.num_envs=3'];\n"
             "try:\n    runpy.run_module('gputrain', run_name='__main__')\n"
             "except SystemExit as e:\n    print('torch' in sys.modules, e.code)")
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "run")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.split() == ["False", "2"], done.stdout + done.stderr
    assert done.stderr.strip() == ("gputrain rl: config error: rl.num_envs = 3: must divide evenly over the 2 ranks "
                                   "(each steps num_envs / ranks environments); use a multiple of 2")


def test_a_real_process_answers_bad_input_before_importing_torch(tmp_path: Path) -> None:
    probe = ("import sys, runpy; sys.argv = ['gputrain', 'rl', 'rl.env=Cartpole'];\n"
             "try:\n    runpy.run_module('gputrain', run_name='__main__')\n"
             "except SystemExit as e:\n    print('torch' in sys.modules, e.code)")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["False", "2"], done.stdout + done.stderr
    assert "did you mean 'CartPole-v1'?" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_one_cpu_thread_unless_the_user_asks_for_more(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from gputrain.rl.trainer import PPOTrainer

    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    torch.set_num_threads(2)  # the autouse fixture restores the count afterwards
    PPOTrainer(None, run_dir=tmp_path / "auto", overrides=BASE)
    assert torch.get_num_threads() == 1
    PPOTrainer(None, run_dir=tmp_path / "asked", overrides=[*BASE, "train.num_threads=2"])
    assert torch.get_num_threads() == 2
