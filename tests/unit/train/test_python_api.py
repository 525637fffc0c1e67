"""The Python API with the models and data people already have: nothing silently dropped, and
messages in the API's own terms."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from gputrain import Trainer
from gputrain.errors import Interrupted, UsageError

QUIET = {"train.device": "cpu", "log.progress": "none", "log.tensorboard": False, "train.batch_size": 16,
         "checkpoint.enabled": False}


def _blobs(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (n,), generator=g)
    return torch.randn(n, 5, generator=g) + 3 * F.one_hot(y, 5).float(), y


class Records(Dataset):
    """Samples as dicts: what step_fn users have."""

    def __init__(self, n: int = 64) -> None:
        self.x, self.y = _blobs(n)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"features": self.x[i], "label": self.y[i]}


def _step(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch["features"]), batch["label"])


def test_step_fn_runs_are_validated_with_the_same_function(tmp_path: Path) -> None:
    model = nn.Linear(5, 3)
    summary = Trainer(model, Records(), step_fn=_step, val_data=Records(32), test_data=Records(32),
                      config={**QUIET, "train.epochs": 3}, run_dir=tmp_path).fit()
    assert set(summary["val"]) == {"loss"} and set(summary["test"]) == {"loss"}
    # the loss of the whole split, evaluated without gradients in eval mode
    val = Records(32)
    with torch.no_grad():
        expected = F.cross_entropy(model(val.x), val.y).item()
    assert summary["val"]["loss"] == pytest.approx(expected, rel=1e-5)


def test_an_eval_fn_replaces_step_fn_for_evaluation(tmp_path: Path) -> None:
    def eval_fn(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.tensor(7.0)

    summary = Trainer(nn.Linear(5, 3), Records(), step_fn=_step, eval_fn=eval_fn, val_data=Records(32),
                      config={**QUIET, "train.epochs": 1}, run_dir=tmp_path).fit()
    assert summary["val"] == {"loss": pytest.approx(7.0)}


def _tiny_gpt2() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=32)
    return transformers.GPT2LMHeadModel(config)


def _tokens(n: int = 64, t: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 50, (n, t + 1), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def test_a_hugging_face_causal_lm_trains_on_input_target_batches_with_no_step_fn(tmp_path: Path) -> None:
    x, y = _tokens()
    trainer = Trainer(_tiny_gpt2(), TensorDataset(x, y), val_data=TensorDataset(x[:16], y[:16]),
                      config={**QUIET, "train.epochs": 2, "optim.lr": 1e-2}, run_dir=tmp_path)
    assert trainer.task.kind == "lm" and trainer.task.tokens_per_sample == 12  # read through .logits
    summary = trainer.fit()
    assert set(summary["val"]) == {"loss", "perplexity"} and summary["train"]["loss"] < 3.9  # ln 50 = 3.91


class HFRecords(Dataset):
    """Dict samples with labels: what a Hugging Face data collator gives."""

    def __init__(self) -> None:
        self.x, _ = _tokens()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


def test_dict_batches_go_to_the_model_and_its_loss_is_used(tmp_path: Path) -> None:
    trainer = Trainer(_tiny_gpt2(), HFRecords(), val_data=HFRecords(), config={**QUIET, "train.epochs": 2,
                                                                                "optim.lr": 1e-2},
                      run_dir=tmp_path)
    assert trainer.task.dict_batches
    summary = trainer.fit()
    assert set(summary["val"]) == {"loss"} and summary["val"]["loss"] < 3.9


def test_an_unknown_task_names_both_ways_out_before_training(tmp_path: Path) -> None:
    class Odd(nn.Module):  # [B, 4] -> [B, 4, 2] against integer labels [B]: no task we know
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x * self.scale).unsqueeze(-1).expand(-1, -1, 2)

    x = torch.randn(32, 4)
    with pytest.raises(UsageError, match=r"cannot tell the task from outputs \(2, 4, 2\) and targets \(2,\): "
                                         r"pass loss_fn=\(outputs, targets\) -> loss, or step_fn="):
        Trainer(Odd(), TensorDataset(x, torch.randint(0, 3, (32,))), config=QUIET, run_dir=tmp_path)


def test_an_interrupted_fit_says_how_to_resume_in_python(tmp_path: Path) -> None:
    trainers: list[Trainer] = []

    def stop_now(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        trainers[0].stop.requested = "SIGINT"
        return F.cross_entropy(outputs, targets)

    x, y = _blobs()
    trainers.append(Trainer(nn.Linear(5, 3), TensorDataset(x, y), loss_fn=stop_now,
                            config={**QUIET, "checkpoint.enabled": True}, run_dir=tmp_path / "r"))
    with pytest.raises(Interrupted) as err:
        trainers[0].fit()
    assert str(err.value).endswith(f"call fit() again on a Trainer with run_dir={str(tmp_path / 'r')!r} to resume")
    assert "--run-dir" not in str(err.value)


class Rows(Dataset):
    """The same samples as a TensorDataset, through the generic (DataLoader) path."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def _losses(run_dir: Path) -> list[float]:
    import json

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "split" not in r]


@pytest.mark.parametrize("wrap", ["tensor_dataset", "subset"])
def test_a_tensor_dataset_takes_the_in_memory_path_and_trains_the_same(tmp_path: Path, wrap: str) -> None:
    from torch.utils.data import Subset

    x, y = _blobs(96)
    config = {**QUIET, "train.epochs": 2, "log.every_steps": 1, "data.num_workers": "auto"}
    fast_data: Dataset = TensorDataset(x, y) if wrap == "tensor_dataset" else Subset(TensorDataset(x, y), range(96))
    torch.manual_seed(0)
    fast = Trainer(nn.Linear(5, 3), fast_data, config=config, run_dir=tmp_path / "fast")
    assert fast.feed.tensors is not None and fast.feed.loader is None  # batch indexing: no workers, no collate
    fast.fit()
    torch.manual_seed(0)
    slow = Trainer(nn.Linear(5, 3), Rows(x, y), config={**config, "data.num_workers": 0}, run_dir=tmp_path / "slow")
    assert slow.feed.loader is not None
    slow.fit()
    assert _losses(tmp_path / "fast") == _losses(tmp_path / "slow")  # the same batches in the same order
