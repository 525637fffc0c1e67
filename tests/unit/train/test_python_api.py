"""The Python API with the models and data people already have: nothing silently dropped, and
messages in the API's own terms."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import ConcatDataset, Dataset, Subset, TensorDataset

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
    assert trainer.parts.task.kind == "lm" and trainer.parts.task.tokens_per_sample == 12  # read through .logits
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


class TokenRecords(HFRecords):
    def __init__(self, keys: list[str]) -> None:
        super().__init__()
        self.keys = keys

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v for k, v in super().__getitem__(i).items() if k in self.keys}


def test_dict_batches_go_to_the_model_and_its_loss_is_used(tmp_path: Path) -> None:
    trainer = Trainer(_tiny_gpt2(), HFRecords(), val_data=HFRecords(), config={**QUIET, "train.epochs": 2,
                                                                                "optim.lr": 1e-2},
                      run_dir=tmp_path)
    assert trainer.parts.task.dict_batches and trainer.parts.task.kind == "lm" and trainer.parts.task.tokens_per_sample == 12
    summary = trainer.fit()
    assert set(summary["val"]) == {"loss", "perplexity"} and summary["val"]["loss"] < 3.9
    assert summary["train"]["tokens_per_s"] == pytest.approx(12 * summary["train"]["samples_per_s"])


def test_an_eval_fn_alone_reports_its_loss_and_nothing_it_cannot_give(tmp_path: Path) -> None:
    def eval_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return torch.tensor(7.0)

    x, y = _blobs()
    data = TensorDataset(x, y)
    summary = Trainer(nn.Linear(5, 3), data, eval_fn=eval_fn, val_data=data, config=QUIET,
                      run_dir=tmp_path / "a").fit()
    assert summary["val"] == {"loss": pytest.approx(7.0)}  # no accuracy of outputs it never saw
    with pytest.raises(UsageError) as err:  # refused before training: nothing is written
        Trainer(nn.Linear(5, 3), data, eval_fn=eval_fn, val_data=data, run_dir=tmp_path / "b",
                config={**QUIET, "eval.early_stop_metric": "accuracy"}).setup()
    assert str(err.value) == ("config error: eval.early_stop_metric = 'accuracy': is not among the validation "
                              "metrics: loss (eval_fn= computes the evaluation's loss and no other figure)")
    assert not (tmp_path / "b").exists()


class Features(Dataset):
    """Dict samples without the labels the model's loss needs."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"features": torch.ones(5)}


def test_a_validation_split_the_evaluation_cannot_take_is_refused_before_training(tmp_path: Path) -> None:
    x, y = _blobs()
    with pytest.raises(UsageError) as err:
        Trainer(nn.Linear(5, 3), Records(), step_fn=_step, val_data=TensorDataset(x, y), config=QUIET,
                run_dir=tmp_path / "a").setup()
    assert str(err.value).startswith(
        "val_data cannot be evaluated: its first batch ((inputs, targets) tensors) fails in the evaluation's "
        "function (eval_fn=, or step_fn= without one): TypeError: tuple indices must be integers or slices, "
        "not str (at ")
    assert str(err.value).endswith("test_python_api.py:42 in _step); give it batches that function takes, or pass "
                                   "the Trainer an eval_fn=(model, batch) -> loss for these")
    with pytest.raises(UsageError) as err:
        Trainer(nn.Linear(5, 3), TensorDataset(x, y), test_data=Records(), config=QUIET,
                run_dir=tmp_path / "b").setup()
    assert str(err.value) == (
        "test_data cannot be evaluated: its first batch (dicts with keys features, label) fails in (inputs, "
        "targets), as in training: KeyError: 0; give it (inputs, targets) samples as training has, or pass "
        "eval_fn=(model, batch) -> loss to the Trainer")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # nothing trained, nothing left


class _Mlp(nn.Module):
    """A forward of the user's own, which dynamo compiles (torch's own modules' it leaves alone)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(5, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def test_the_check_of_the_evaluation_splits_compiles_nothing(tmp_path: Path) -> None:
    """train.compile=true: the check's forward on two samples runs eagerly. Compiled, it was a
    compile thrown away (seconds), and its batch of 2 made dynamo compile training's graph for any
    batch size."""
    from torch._dynamo.utils import counters

    x, y = _blobs()
    torch._dynamo.reset()
    counters.clear()
    try:
        Trainer(_Mlp(), TensorDataset(x, y), val_data=TensorDataset(x, y), test_data=TensorDataset(x, y),
                config={**QUIET, "train.compile": True}, run_dir=tmp_path)
        assert counters["frames"]["total"] == 0
    finally:
        torch._dynamo.reset()


def test_dict_batches_without_labels_are_refused_before_training(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as err:
        Trainer(_tiny_gpt2(), TokenRecords(["input_ids"]), config=QUIET, run_dir=tmp_path).setup()
    assert str(err.value) == (
        "train_data: model(**batch) returns no .loss for its batches, dicts with keys input_ids, and its batches "
        "have no 'labels': give each sample its labels (a Hugging Face model computes its loss from them), or "
        "pass step_fn=(model, batch) -> loss to the Trainer")
    with pytest.raises(UsageError) as err:
        Trainer(_tiny_gpt2(), TokenRecords(["input_ids", "labels"]), val_data=TokenRecords(["input_ids"]),
                config=QUIET, run_dir=tmp_path).setup()
    assert str(err.value) == (
        "val_data has no labels (dicts with keys input_ids): model(**batch) gives no loss without them; give its "
        "samples training's keys (with labels), or pass eval_fn=(model, batch) -> loss to the Trainer")


def test_the_models_own_error_on_the_first_samples_is_reported(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=32, num_labels=3,
                                     pad_token_id=0)  # it looks for padding: a real forward, not the meta device's
    x, _ = _tokens()
    with pytest.raises(UsageError) as err:  # token ids past the vocabulary: the model's own IndexError
        Trainer(transformers.GPT2ForSequenceClassification(config), TensorDataset(x + 50, torch.zeros(64).long()),
                config=QUIET, run_dir=tmp_path).setup()
    message = str(err.value)
    assert message.startswith("the model raises on train_data's first samples, model(inputs) with inputs "
                              "int64 [2, 12]: IndexError: index out of range in self (at transformers/models/gpt2/"
                              "modeling_gpt2.py:")
    assert message.endswith(" in forward). A model that runs only on its training device: pass "
                            "loss_fn=(outputs, targets) -> loss to the Trainer")


class Classifier(nn.Module):
    """A model of the Hugging Face kind: model(**batch) returns .loss (given labels) and .logits."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(5, 3)

    def forward(self, features: torch.Tensor, labels: torch.Tensor | None = None) -> SimpleNamespace:
        logits = self.linear(features)
        return SimpleNamespace(logits=logits, loss=None if labels is None else F.cross_entropy(logits, labels))


class LabelledRecords(Records):
    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"features": self.x[i], "labels": self.y[i]}


def test_a_dict_batch_classifier_is_scored_from_its_logits_and_labels(tmp_path: Path) -> None:
    model = Classifier()
    trainer = Trainer(model, LabelledRecords(), val_data=LabelledRecords(32), config={**QUIET, "train.epochs": 2},
                      run_dir=tmp_path)
    assert (trainer.parts.task.kind, trainer.parts.task.num_classes, trainer.parts.task.dict_batches) == ("classification", 3, True)
    val = trainer.fit()["val"]
    assert set(val) == {"accuracy", "precision", "recall", "f1", "auroc", "loss"}
    data = LabelledRecords(32)
    with torch.no_grad():
        out = model(data.x, data.y)
    assert val["accuracy"] == pytest.approx((out.logits.argmax(1) == data.y).double().mean().item())
    assert val["loss"] == pytest.approx(out.loss.item(), rel=1e-5)


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
        Trainer(Odd(), TensorDataset(x, torch.randint(0, 3, (32,))), config=QUIET, run_dir=tmp_path).setup()


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
    """The same samples as a TensorDataset of these tensors, through the generic (DataLoader) path."""

    def __init__(self, *tensors: torch.Tensor) -> None:
        self.tensors = tensors

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        return tuple(t[i] for t in self.tensors)


def _losses(run_dir: Path) -> list[float]:
    import json

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "split" not in r]


def _weighted_step(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    inputs, targets, weights = batch
    return (F.cross_entropy(model(inputs), targets, reduction="none") * weights).mean()


def _inputs_only_step(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    (inputs,) = batch
    return model(inputs).square().mean()


def _as_given(x: torch.Tensor, y: torch.Tensor) -> tuple[Dataset, tuple[torch.Tensor, ...], dict]:
    return TensorDataset(x, y), (x, y), {}


def _subset(x: torch.Tensor, y: torch.Tensor) -> tuple[Dataset, tuple[torch.Tensor, ...], dict]:
    return Subset(TensorDataset(x, y), range(96)), (x, y), {}


def _nested_subsets(x: torch.Tensor, y: torch.Tensor) -> tuple[Dataset, tuple[torch.Tensor, ...], dict]:
    keep = list(range(0, 96, 2)) + list(range(1, 96, 2))  # every sample, reordered, then a part of that
    inner = Subset(TensorDataset(x, y), keep)
    return Subset(inner, range(10, 90)), (x[keep][10:90], y[keep][10:90]), {}


def _concatenated(x: torch.Tensor, y: torch.Tensor) -> tuple[Dataset, tuple[torch.Tensor, ...], dict]:
    return ConcatDataset([TensorDataset(x[:40], y[:40]), TensorDataset(x[40:], y[40:])]), (x, y), {}


def _three_tensors(x: torch.Tensor, y: torch.Tensor) -> tuple[Dataset, tuple[torch.Tensor, ...], dict]:
    w = torch.linspace(0.5, 1.5, len(x))
    return TensorDataset(x, y, w), (x, y, w), {"step_fn": _weighted_step}


def _one_tensor(x: torch.Tensor, y: torch.Tensor) -> tuple[Dataset, tuple[torch.Tensor, ...], dict]:
    return TensorDataset(x), (x,), {"step_fn": _inputs_only_step}


@pytest.mark.parametrize(
    "make", [_as_given, _subset, _nested_subsets, _concatenated, _three_tensors, _one_tensor], ids=lambda f: f.__name__
)
def test_tensor_datasets_take_the_in_memory_path_and_train_the_same(tmp_path: Path, make) -> None:
    """torch's own in-memory data sets (TensorDataset of any number of tensors, Subsets of it, nested
    or not, ConcatDatasets of them) are indexed a batch at a time, and train exactly as the same
    samples read one by one through a DataLoader."""
    x, y = _blobs(96)
    data, tensors, kwargs = make(x, y)
    config = {**QUIET, "train.epochs": 2, "log.every_steps": 1, "data.num_workers": "auto"}
    torch.manual_seed(0)
    fast = Trainer(nn.Linear(5, 3), data, config=config, run_dir=tmp_path / "fast", **kwargs)
    assert fast.parts.feed.tensors is not None and fast.parts.feed.loader is None  # batch indexing: no workers, no collate
    fast.fit()
    torch.manual_seed(0)
    slow = Trainer(nn.Linear(5, 3), Rows(*tensors), config={**config, "data.num_workers": 0},
                   run_dir=tmp_path / "slow", **kwargs)
    assert slow.parts.feed.loader is not None
    slow.fit()
    assert _losses(tmp_path / "fast") == _losses(tmp_path / "slow")  # the same batches in the same order


class Shifted(TensorDataset):
    """A TensorDataset whose own __getitem__ changes the samples: only it can read them."""

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        x, y = super().__getitem__(i)
        return x + 1, y


def test_a_data_set_that_reads_its_own_way_keeps_its_reads(tmp_path: Path) -> None:
    x, y = _blobs(32)
    trainer = Trainer(nn.Linear(5, 3), Shifted(x, y), config={**QUIET, "data.num_workers": 0}, run_dir=tmp_path)
    assert trainer.parts.feed.tensors is None  # its __getitem__ runs, sample by sample


def test_the_trainer_keeps_its_parts_in_one_place_and_says_where_an_old_attribute_went(tmp_path: Path) -> None:
    data = TensorDataset(torch.randn(32, 5), torch.randint(0, 3, (32,)))
    trainer = Trainer(nn.Linear(5, 3), data, config=QUIET, run_dir=tmp_path)
    assert trainer.model is trainer.parts.model and trainer.optimizer is trainer.parts.optimizer
    assert trainer.config is trainer.parts.place.config and trainer.run_dir == trainer.parts.run_dir
    with pytest.raises(AttributeError, match=r"no attribute 'device': it is trainer\.parts\.place\.device$"):
        trainer.device  # noqa: B018 - the attribute read is the test
    with pytest.raises(AttributeError, match=r"no attribute 'step_parts': it is trainer\.parts\.step$"):
        trainer.step_parts  # noqa: B018
    with pytest.raises(AttributeError, match=r"no attribute 'nonsense'$"):
        trainer.nonsense  # noqa: B018
    assert not hasattr(trainer, "feed") and trainer.parts.place.device == torch.device("cpu")
