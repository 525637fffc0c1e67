import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gputrain import Trainer
from tests.digits_sizes import digits_train_size
from tests.unit.train.helpers import TINY, losses, make_trainer, step_rows

SUMMARY_KEYS = {"status", "device", "precision", "world_size", "global_step", "epochs_completed", "wall_s", "train",
                "val", "test"}
TRAIN_KEYS = {"loss", "samples_per_s", "tokens_per_s", "flops_per_step", "achieved_flops", "mfu", "mfu_peak_source",
              "peak_memory_bytes", "time_breakdown"}


def _blobs(n=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    x = torch.randn(n, 5, generator=g) + 3 * F.one_hot(y, 5).float()
    return x, y


def test_python_api_with_any_module_and_dataset(tmp_path):
    x, y = _blobs()
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))
    trainer = Trainer(model, TensorDataset(x, y), loss_fn=F.cross_entropy, val_data=TensorDataset(x[:64], y[:64]),
                      test_data=TensorDataset(x[64:128], y[64:128]),
                      config={**TINY, "train.epochs": 5, "train.batch_size": 32, "optim.lr": 1e-2},
                      run_dir=tmp_path / "api")
    summary = trainer.fit()
    assert SUMMARY_KEYS <= set(summary) and TRAIN_KEYS <= set(summary["train"])
    assert summary["status"] == "completed" and summary["global_step"] == 5 * (256 // 32)
    assert summary["test"]["accuracy"] > 0.9 and set(summary["test"]) == {"accuracy", "precision", "recall", "f1",
                                                                          "auroc", "loss"}
    assert json.loads((tmp_path / "api" / "summary.json").read_text())["global_step"] == summary["global_step"]


def test_dataloader_batches_are_micro_batches_and_task_is_inferred(tmp_path):
    x, y = _blobs()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Linear(5, 3)
    trainer = Trainer(model, loader, val_data=DataLoader(TensorDataset(x, y), batch_size=64),
                      config={**TINY, "train.epochs": 2, "train.grad_accum": 2}, run_dir=tmp_path / "dl")
    summary = trainer.fit()
    assert summary["global_step"] == 2 * (256 // 16 // 2) and trainer.parts.global_batch == 32
    assert trainer.parts.task.kind == "classification" and "accuracy" in summary["val"]


def test_step_fn_for_any_batch_structure(tmp_path):
    x, y = _blobs()
    data = [{"features": x[i], "label": y[i]} for i in range(len(x))]
    model = nn.Linear(5, 3)

    def step_fn(model, batch):
        return F.cross_entropy(model(batch["features"]), batch["label"])

    summary = Trainer(model, data, step_fn=step_fn, config={**TINY, "train.epochs": 1, "train.batch_size": 32},
                      run_dir=tmp_path / "sf").fit()
    assert summary["global_step"] == 8 and summary["train"]["loss"] is not None


def test_regression_metrics(tmp_path):
    x = torch.randn(200, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [0.0]])
    summary = Trainer(nn.Linear(4, 1), TensorDataset(x, y), val_data=TensorDataset(x[:50], y[:50]),
                      config={**TINY, "train.epochs": 30, "train.batch_size": 20, "optim.lr": 0.05},
                      run_dir=tmp_path / "reg").fit()
    assert set(summary["val"]) == {"mse", "mae", "loss"} and summary["val"]["mse"] < 0.01


def test_config_from_toml_path(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[train]\nepochs = 1\nbatch_size = 32\n[log]\nprogress = "none"\ntensorboard = false\n')
    x, y = _blobs(64)
    trainer = Trainer(nn.Linear(5, 3), TensorDataset(x, y), loss_fn=F.cross_entropy, config=str(path),
                      run_dir=tmp_path / "t")
    assert trainer.config.train.batch_size == 32 and trainer.fit()["global_step"] == 2


def test_early_stopping_on_a_monitored_metric(tmp_path):
    trainer = make_trainer(tmp_path / "es", **{"train.epochs": 50, "optim.lr": 1e-7, "eval.early_stop_metric":
                                                 "accuracy", "eval.patience": 2})
    summary = trainer.fit()
    assert summary["status"] == "stopped_early" and summary["epochs_completed"] < 50


def test_checkpoints_keep_last_k_and_the_best(tmp_path):
    run_dir = tmp_path / "ck"
    trainer = make_trainer(run_dir, **{"train.epochs": 4, "checkpoint.keep_last": 1, "checkpoint.every_epochs": 1})
    trainer.fit()
    kept = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    best = f"step-{trainer.state.best_step}"
    assert f"step-{trainer.state.global_step}" in kept and best in kept and len(kept) <= 2
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")]


def test_batch_larger_than_the_data_is_a_config_error(tmp_path):
    from gputrain.errors import ConfigError

    n_train = digits_train_size()
    with pytest.raises(ConfigError, match=f"train.batch_size.*larger than the {n_train} training samples"):
        make_trainer(tmp_path / "b", **{"train.batch_size": n_train + 1}).setup()


def test_bf16_autocast_trains_on_cpu(tmp_path):
    """bf16 learns, and step for step it tracks the same run in fp32 (same seed, same batches)."""
    steps = {"train.max_steps": 40}
    fp32 = make_trainer(tmp_path / "fp", **{"train.precision": "fp32", **steps}).fit()
    summary = make_trainer(tmp_path / "bf", **{"train.precision": "bf16", **steps}).fit()
    assert fp32["precision"] == "fp32" and summary["precision"] == "bf16"
    ref, got = losses(tmp_path / "fp"), losses(tmp_path / "bf")
    assert [s for s, _ in got] == [s for s, _ in ref] and len(got) == 40
    ref_loss = torch.tensor([v for _, v in ref])
    bf16_loss = torch.tensor([v for _, v in got])
    # Learning, not noise: from ln 10 ~ 2.30 the last few steps average well under half of it.
    assert bf16_loss[-5:].mean() < 0.5 * bf16_loss[0], bf16_loss.tolist()
    # bf16 keeps ~3 significant digits: per-step losses stay within a few percent of fp32 over 40 steps,
    # yet autocast is really on (the losses are not bit-identical).
    torch.testing.assert_close(bf16_loss, ref_loss, rtol=0.05, atol=0.05)
    assert not torch.equal(bf16_loss, ref_loss)


def test_fp16_on_cpu_is_refused(tmp_path):
    from gputrain.errors import ConfigError

    with pytest.raises(ConfigError, match="train.precision.*GPU mode"):
        make_trainer(tmp_path / "f", **{"train.precision": "fp16"})


def test_grad_norm_is_logged_and_lr_follows_the_schedule(tmp_path):
    make_trainer(tmp_path / "g", **{"train.max_steps": 20, "optim.schedule": "linear"}).fit()
    rows = step_rows(tmp_path / "g")
    assert all(r["grad_norm"] > 0 for r in rows)
    assert rows[0]["lr"] > rows[10]["lr"] > rows[-1]["lr"]


def test_epochs_are_numbered_from_1_alike_in_rows_and_console_and_a_partial_one_is_said_so(tmp_path, capsys):
    # 64 samples, batch 16: 4 steps per epoch; max_steps=10 stops in epoch 3
    x, y = _blobs(64)
    trainer = Trainer(nn.Linear(5, 3), TensorDataset(x, y), val_data=TensorDataset(x, y),
                      config={**TINY, "train.epochs": 5, "train.max_steps": 10, "train.batch_size": 16,
                              "log.progress": "plain"}, run_dir=tmp_path / "ep")
    trainer.fit()
    rows = [json.loads(line) for line in (tmp_path / "ep" / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"]: r["epoch"] for r in rows if "split" not in r}
    assert steps == {1: 1, 2: 1, 3: 1, 4: 1, 5: 2, 6: 2, 7: 2, 8: 2, 9: 3, 10: 3}
    assert [(r["step"], r["epoch"]) for r in rows if r.get("split") == "val"] == [(4, 1), (8, 2), (10, 3)]
    out = capsys.readouterr().out
    assert "step 9/10 epoch 3 " in out
    vals = [line.split(":")[0] for line in out.splitlines() if line.startswith("val epoch")]
    assert vals == ["val epoch 1", "val epoch 2", "val epoch 3 (partial, at step 10)"]
