"""`gputrain train` end to end, as a user runs it."""

import dataclasses
import json
import re

import pytest

from gputrain.config import load_config
from tests.digits_sizes import digits_train_size

FAST = ["log.tensorboard=true", "train.epochs=2"]


def test_tiny_run_writes_the_run_directory(cli, tmp_path):
    result = cli("train", "--run-dir", "run", *FAST, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    # the choice and why: on this machine, without a GPU, no advice to install anything
    assert "device: cpu (auto: no GPU on this machine; training on the CPU)" in " ".join(out.split())
    assert "CUDA build" not in out
    assert "val epoch 1:" in out and "val epoch 2:" in out and "test accuracy" in out and "samples/s" in out
    run = tmp_path / "run"
    assert load_config(run / "config.toml").train.epochs == 2  # the resolved config reloads as is
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["epochs_completed"] == 2
    assert summary["global_step"] == 2 * (digits_train_size() // 64) and summary["world_size"] == 1
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows if r.get("split") == "val"] == [1, 2]
    assert [r for r in rows if r.get("split") == "test"]
    assert {"step", "epoch", "loss", "lr", "grad_norm", "samples_per_s"} <= set(rows[0])
    assert (run / "model.safetensors").stat().st_size > 100_000
    assert json.loads((run / "env.json").read_text())
    assert (run / "checkpoints" / f"step-{summary['global_step']}" / "COMMITTED").is_file()
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))


def test_default_job_reaches_97_percent(cli, tmp_path):
    result = cli("train", "--run-dir", "run", "log.tensorboard=false", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["test"]["accuracy"] >= 0.97


def test_csv_mlp_end_to_end(cli, tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 4))
    labels = np.where(x[:, 0] + x[:, 1] > 0, "yes", "no")
    lines = ["a,b,c,d,answer"] + [",".join(f"{v:.4f}" for v in row) + f",{lab}" for row, lab in zip(x, labels)]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    result = cli("train", "--run-dir", "run", "data.name=csv", "data.path=t.csv", "model.name=mlp", "train.epochs=15",
                 "train.batch_size=32", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["test"]["accuracy"] > 0.9


def test_config_show_and_train_help_list_every_field(cli, tmp_path):
    shown = cli("config", "show", "train.epochs=3", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    for key in ("model.activation", "train.batch_size", "optim.schedule", "checkpoint.resume", "parallel.strategy"):
        assert key in shown.stdout
    assert "GLOBAL samples per optimizer step" in " ".join(shown.stdout.split())
    toml_out = cli("config", "show", "--toml", "train.epochs=3", cwd=tmp_path)
    assert "[train]" in toml_out.stdout and "epochs = 3" in toml_out.stdout
    helped = cli("train", "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "train.grad_accum" in helped.stdout and "default 1" in helped.stdout


def test_unknown_command_and_no_command(cli, tmp_path):
    assert cli("trian", cwd=tmp_path).returncode == 2
    assert cli(cwd=tmp_path).returncode == 2


@pytest.mark.parametrize("command", ["train", "lr-find", "plan", "profile", "rl"])
def test_help_lists_the_keys_its_command_reads(command, capsys):
    """train, lr-find, plan and profile do not read [rl]: their help leaves its keys out and says
    where they are; rl's help lists them all."""
    from gputrain.cli import main
    from gputrain.config.schema import SECTIONS

    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    listed = set(re.findall(r"^    (rl\.\w+) ", out, flags=re.M))
    rl_keys = {f"rl.{f.name}" for f in dataclasses.fields(SECTIONS["rl"])}
    if command == "rl":
        assert listed == rl_keys
    else:
        assert listed == set() and "gputrain rl --help lists them" in out
        assert "    train.batch_size " in out
