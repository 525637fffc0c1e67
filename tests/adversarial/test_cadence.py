"""The loop's cadences and limits (issue 29 part 3) attacked: eval.every_steps, eval.max_batches,
train.limit_batches, train.max_time and train.smoke_steps given values a new user or an attacker
would try. Bad values are one ConfigError naming the field (exit 2, one line, no traceback, before
torch through the real command); values that are odd but meaningful do what the README says
(every_steps beyond the run's length validates at the end only; a limit above an epoch's steps
changes nothing)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from gputrain import Trainer
from gputrain.config import load_config
from gputrain.errors import ConfigError, UsageError
from tests.adversarial.helpers import QUIET, linear_data, read_summary
from tests.adversarial.test_config_values import gputrain, rejected


def _trainer(run_dir: Path, val: Any = "default", **config: Any) -> Trainer:
    torch.manual_seed(0)
    return Trainer(nn.Linear(6, 3), linear_data(), val_data=linear_data(16) if val == "default" else val,
                   loss_fn=F.cross_entropy, config={**QUIET, **config}, run_dir=run_dir)


def _val_steps(run_dir: Path) -> list[int]:
    rows = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    return [row["step"] for row in rows if row.get("split") == "val"]


# --- bad values: one ConfigError naming the field ----------------------------------------------

BAD: list[tuple[str, Any, str]] = [
    ("eval.every_steps", -1, "must be >= 0"),
    ("eval.every_steps", -(2**40), "must be >= 0"),
    ("eval.every_steps", 2**31, "must be at most"),
    ("eval.every_steps", 1.5, "integer"),
    ("eval.every_steps", "50", "integer"),
    ("eval.every_steps", "every", "integer"),
    ("eval.every_steps", True, "integer"),
    ("eval.max_batches", 0, "must be > 0"),
    ("eval.max_batches", -3, "must be > 0"),
    ("eval.max_batches", "all", "integer"),
    ("train.limit_batches", 0, "must be > 0"),
    ("train.limit_batches", -1, "must be > 0"),
    ("train.limit_batches", 0.5, "integer"),
    ("train.smoke_steps", 0, "must be > 0"),
    ("train.smoke_steps", -5, "must be > 0"),
    ("train.smoke_steps", "yes", "integer"),
    ("train.max_time", "2 hours", "45s, 90m, 2h"),
    ("train.max_time", -1, "seconds > 0"),
    ("train.max_time", 0, "seconds > 0"),
    ("train.max_time", "0", "seconds > 0"),
    ("train.max_time", "0s", "seconds > 0"),
    ("train.max_time", "0h0m", "seconds > 0"),
    ("train.max_time", "-2h", "seconds > 0"),
    ("train.max_time", "2h-1m", "seconds > 0"),
    ("train.max_time", "1d2d", "seconds > 0"),
    ("train.max_time", "30m2h", "seconds > 0"),
    ("train.max_time", "2 h", "seconds > 0"),
    ("train.max_time", "h", "seconds > 0"),
    ("train.max_time", "", "seconds > 0"),
    ("train.max_time", "1e999", "seconds > 0"),
    ("train.max_time", "inf", "seconds > 0"),
    ("train.max_time", "nan", "seconds > 0"),
    ("train.max_time", float("inf"), "finite"),
    ("train.max_time", float("nan"), "finite"),
    ("train.max_time", "9" * 400 + "s", "seconds > 0"),
    ("train.max_time", "400d", "at most a year"),
    ("train.max_time", 10**12, "at most a year"),
    ("train.max_time", "2h\x00", "control character"),
    ("train.max_time", True, "a number or a string"),
    ("train.max_time", [2], "a number or a string"),
]


@pytest.mark.parametrize("key, value, words", BAD, ids=[f"{k}={v!r}"[:60] for k, v, _ in BAD])
def test_a_bad_value_is_one_line_naming_the_field(key: str, value: Any, words: str) -> None:
    err = rejected(None, {key: value}, field=key)
    assert words in str(err), str(err)


GOOD_TIMES = [("45s", 45.0), ("90m", 5400.0), ("2h", 7200.0), ("1d", 86400.0), ("1h30m", 5400.0),
              ("1.5h", 5400.0), (" 2H ", 7200.0), (5400, 5400.0), (0.5, 0.5), ("5400", 5400.0)]


@pytest.mark.parametrize("value, seconds", GOOD_TIMES, ids=[repr(v) for v, _ in GOOD_TIMES])
def test_a_duration_in_any_documented_form_is_read_as_its_seconds(value: Any, seconds: float) -> None:
    config = load_config(None, {"train.max_time": value})
    assert config.train.max_time_s == seconds


def test_a_smoke_run_that_names_a_checkpoint_to_resume_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "COMMITTED").write_text("")
    err = rejected(None, {"train.smoke_steps": 2, "checkpoint.resume": str(tmp_path / "ckpt")},
                   field="checkpoint.resume")
    assert "smoke run" in str(err)


def test_early_stopping_on_the_step_cadence_alone_is_accepted() -> None:
    config = load_config(None, {"eval.every_epochs": 0, "eval.every_steps": 5, "eval.early_stop_metric": "loss"})
    assert config.eval.every_steps == 5
    rejected(None, {"eval.every_epochs": 0, "eval.early_stop_metric": "loss"}, field="eval.early_stop_metric",
             words=("eval.every_steps",))


# --- what the Trainer makes of them ------------------------------------------------------------

def test_every_steps_without_a_validation_split_is_refused_at_once(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        _trainer(tmp_path / "r", val=None, **{"eval.every_steps": 5})
    assert info.value.field == "eval.every_steps" and "no validation split" in str(info.value)
    assert len(str(info.value).splitlines()) <= 2  # the message, and its hint


def test_every_steps_beyond_the_run_validates_at_the_end_only(tmp_path: Path) -> None:
    run = tmp_path / "r"
    summary = _trainer(run, **{"eval.every_steps": 10**6, "eval.every_epochs": 0}).fit()
    assert summary["status"] == "completed" and _val_steps(run) == [summary["global_step"]]


def test_every_steps_of_one_validates_after_every_step_once(tmp_path: Path) -> None:
    run = tmp_path / "r"
    summary = _trainer(run, **{"eval.every_steps": 1}).fit()
    assert _val_steps(run) == list(range(1, summary["global_step"] + 1))


def test_a_limit_above_an_epoch_changes_nothing(tmp_path: Path) -> None:
    assert _trainer(tmp_path / "r", **{"train.limit_batches": 10**6}).fit()["global_step"] == 8


def test_a_limit_with_max_steps_ends_at_the_smaller(tmp_path: Path) -> None:
    summary = _trainer(tmp_path / "r", **{"train.limit_batches": 3, "train.epochs": 5, "train.max_steps": 7}).fit()
    assert summary["global_step"] == 7


def test_max_batches_beyond_the_split_evaluates_all_of_it(tmp_path: Path) -> None:
    a = _trainer(tmp_path / "a", **{"eval.max_batches": 10**6})
    assert a.validate() == _trainer(tmp_path / "b").validate()


def test_max_batches_with_a_dataloader_takes_its_first_batches(tmp_path: Path) -> None:
    data = linear_data(16)
    a = _trainer(tmp_path / "a", val=DataLoader(data, batch_size=2), **{"eval.max_batches": 1})
    b = _trainer(tmp_path / "b", val=DataLoader(torch.utils.data.Subset(data, range(2)), batch_size=2))
    assert repr(a.validate()) == repr(b.validate())  # AUROC of 2 samples is nan on both


def test_validate_without_val_data_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^Trainer.validate\(\): the Trainer has no val_data$"):
        _trainer(tmp_path / "r", val=None).validate()
    with pytest.raises(UsageError, match=r"Trainer.test\(\): the Trainer has no test_data"):
        _trainer(tmp_path / "r").test()


@pytest.mark.parametrize("checkpoint", ["nowhere", "best", "last"])
def test_validate_on_a_checkpoint_that_is_not_there_is_one_line(tmp_path: Path, checkpoint: str) -> None:
    with pytest.raises(UsageError) as info:
        _trainer(tmp_path / "r").validate(checkpoint=str(tmp_path / checkpoint) if checkpoint == "nowhere"
                                          else checkpoint)
    assert len(str(info.value).splitlines()) == 1 and "Traceback" not in str(info.value)


def test_validate_on_another_models_weights_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    other = tmp_path / "other"
    torch.manual_seed(1)
    Trainer(nn.Linear(6, 4), linear_data(), loss_fn=F.cross_entropy, config={**QUIET, "train.epochs": 1},
            run_dir=other).fit()
    trainer = _trainer(tmp_path / "r")
    before = trainer.validate()
    with pytest.raises(UsageError, match="cannot load weights"):
        trainer.validate(checkpoint=other / "model.safetensors")
    assert trainer.validate() == before


def test_a_smoke_run_leaves_a_complete_run_in_its_directory_as_it_was(tmp_path: Path) -> None:
    run = tmp_path / "r"
    _trainer(run).fit()
    files = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    summary = _trainer(run, **{"train.smoke_steps": 2}).fit()
    assert summary["global_step"] == 2
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == files
    assert read_summary(run)["global_step"] == 8


def test_a_timed_out_run_is_continued_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import functools

    from gputrain.train.cadence import TimeBudget
    from tests.sim_clock import SimClock

    sim = SimClock()
    monkeypatch.setattr("gputrain.train.build.TimeBudget", functools.partial(TimeBudget, clock=sim))
    run = tmp_path / "r"
    trainer = _trainer(run, **{"train.max_time": 3})
    trainer.model.register_forward_hook(lambda *_: sim.advance(1.0) if torch.is_grad_enabled() else None)
    assert trainer.fit()["status"] == "timed_out"
    summary = _trainer(run).fit()  # no limit now: it continues from step 3 to the end
    assert summary["status"] == "completed" and summary["global_step"] == 8


# --- the real command: exit 2, one line, before torch ---------------------------------------

@pytest.mark.parametrize("args, words", [
    (["train", "train.max_time=2 hours"], ["config error: train.max_time = '2 hours'", "45s, 90m, 2h"]),
    (["train", "eval.every_steps=-1"], ["config error: eval.every_steps = -1: must be >= 0"]),
    (["train", "train.limit_batches=0"], ["config error: train.limit_batches = 0: must be > 0"]),
    (["train", "train.smoke_steps=2", "checkpoint.resume=nowhere"], ["checkpoint.resume"]),
])
def test_the_command_exits_2_with_one_line(tmp_path: Path, args: list[str], words: list[str]) -> None:
    done, err = gputrain(*args, "--run-dir", "run", tmp_path=tmp_path)
    assert done.returncode == 2, err
    assert len(err) == 1 and "Traceback" not in err[0], err
    for word in words:
        assert word in err[0], err
    assert not (tmp_path / "run").exists()


def test_max_time_without_checkpoints_says_it_kept_none(tmp_path: Path) -> None:
    run = tmp_path / "r"
    summary = _trainer(run, **{"train.max_time": 1e-6, "checkpoint.enabled": False}).fit()
    assert summary["status"] == "timed_out" and summary["global_step"] == 1  # any step outlasts a microsecond
    assert "without a checkpoint (checkpoint.enabled=false)" in summary["stop_reason"]
    assert not (run / "checkpoints").exists()


@pytest.mark.parametrize("config", [{"checkpoint.enabled": False}, {"checkpoint.resume": "never"},
                                    {"checkpoint.every_steps": 1, "checkpoint.async_save": True},
                                    {"train.max_time": 1e-6}, {"eval.every_steps": 1},
                                    {"train.limit_batches": 1, "train.epochs": 9}])
def test_a_smoke_run_takes_its_own_checkpoint_and_length_whatever_the_config(tmp_path: Path,
                                                                             config: dict[str, Any]) -> None:
    trainer = _trainer(tmp_path / "r", **{"train.smoke_steps": 2, **config})
    summary = trainer.fit()
    assert summary["status"] == "completed" and summary["global_step"] == 2
    assert not trainer.run_dir.exists() and not (tmp_path / "r").exists()


def test_a_smoke_run_refused_at_start_leaves_no_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    with pytest.raises(ConfigError, match=r"train\.batch_size"):  # larger than the 64 samples: refused in the build
        _trainer(tmp_path / "r", **{"train.smoke_steps": 2, "train.batch_size": 128}).setup()
    assert list((tmp_path / "tmp").iterdir()) == [] and not (tmp_path / "r").exists()
