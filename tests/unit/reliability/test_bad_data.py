"""A sample that cannot be read mid-run is named; data.on_error=fail stops, skip drops and counts it
(issue 7, figure 8)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from gputrain.errors import RunError
from gputrain.train.trainer import Trainer

BAD = {5, 22, 41}


class FlakyImages(Dataset):
    """64 'images' read from files; some files are corrupt (OSError naming the file), one index has a
    decoding bug that knows no file (ValueError)."""

    def __init__(self, root: Path) -> None:
        self.files = [root / f"img{i:03d}.png" for i in range(64)]
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(64, 6, generator=g)
        self.y = torch.randint(0, 2, (64,), generator=g)

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if i == 22:
            raise ValueError("cannot decode pixel data")
        if i in BAD:
            raise OSError(f"cannot identify image file {str(self.files[i])!r}")
        return self.x[i], self.y[i]


def _trainer(tmp_path: Path, on_error: str, workers: int, epochs: int = 2, **splits: Dataset) -> Trainer:
    torch.manual_seed(0)
    config = {"train.epochs": epochs, "train.batch_size": 16, "train.device": "cpu", "data.on_error": on_error,
              "data.num_workers": workers, "log.progress": "none", "log.tensorboard": False}
    return Trainer(nn.Linear(6, 2), FlakyImages(tmp_path), loss_fn=nn.functional.cross_entropy, config=config,
                   run_dir=tmp_path / "run", **splits)


@pytest.mark.parametrize("workers", [0, 2])
def test_fail_names_the_sample_and_file(tmp_path: Path, workers: int) -> None:
    trainer = _trainer(tmp_path, "fail", workers)
    with pytest.raises(RunError) as err:
        trainer.fit()
    message = str(err.value)
    assert message.startswith("training failed at step ")
    assert "BadSample: train split: sample " in message and "set data.on_error=skip" in message
    assert "Traceback" not in message and "\n" not in message
    first_bad = [line for line in message.split("BadSample: train split: ")[1:]][0]
    if first_bad.startswith("sample 22"):
        assert first_bad.startswith("sample 22 (file ") and "ValueError: cannot decode pixel data" in first_bad
    else:
        index = int(first_bad.split()[1])
        assert index in BAD and f"(file {tmp_path}/img{index:03d}.png): OSError: cannot identify image file" in first_bad
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed"


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_drops_and_counts_bad_samples(tmp_path: Path, workers: int, gputrain_warnings: list[str]) -> None:
    summary = _trainer(tmp_path, "skip", workers).fit()
    assert summary["status"] == "completed" and summary["global_step"] == 8
    assert summary["data"]["skipped_samples"] == 2 * len(BAD)  # every sample is drawn once per epoch
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["data"]["skipped_samples"] == 6
    skipping = [m for m in gputrain_warnings if "skipping unreadable samples" in m]
    assert len(skipping) == 1 and "sample " in skipping[0]  # once, with an example


def test_skip_count_survives_resume(tmp_path: Path) -> None:
    assert _trainer(tmp_path, "skip", 0, epochs=1).fit()["data"]["skipped_samples"] == 3
    summary = _trainer(tmp_path, "skip", 0, epochs=2).fit()
    assert summary["data"]["skipped_samples"] == 6


class Readable(Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1)
        self.x, self.y = torch.randn(40, 6, generator=g), torch.randint(0, 2, (40,), generator=g)

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


@pytest.mark.parametrize("split", ["val", "test"])
def test_evaluation_reads_through_the_guard_and_fails_naming_the_split(tmp_path: Path, split: str) -> None:
    """A held-out sample that cannot be read stops the run like a training one (exit 1, a record),
    naming the split and the file; before, the reader's own error escaped unnamed."""
    torch.manual_seed(0)
    config = {"train.epochs": 1, "train.batch_size": 8, "train.device": "cpu", "data.num_workers": 0,
              "log.progress": "none", "log.tensorboard": False}
    trainer = Trainer(nn.Linear(6, 2), Readable(), loss_fn=nn.functional.cross_entropy, config=config,
                      run_dir=tmp_path / "run", **{f"{split}_data": FlakyImages(tmp_path)})
    with pytest.raises(RunError) as err:
        trainer.fit()
    message = str(err.value)
    assert f"BadSample: {split} split: sample 5 (file {tmp_path}/img005.png): OSError: cannot identify" in message
    assert "set data.on_error=skip" in message and "\n" not in message
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "failed"
    assert (tmp_path / "run" / "error.log").is_file()


def test_evaluation_skips_and_counts_per_split(tmp_path: Path, gputrain_warnings: list[str]) -> None:
    torch.manual_seed(0)
    config = {"train.epochs": 2, "train.batch_size": 8, "train.device": "cpu", "data.num_workers": 0,
              "data.on_error": "skip", "log.progress": "none", "log.tensorboard": False}
    trainer = Trainer(nn.Linear(6, 2), Readable(), loss_fn=nn.functional.cross_entropy, config=config,
                      run_dir=tmp_path / "run", val_data=FlakyImages(tmp_path), test_data=FlakyImages(tmp_path))
    summary = trainer.fit()
    assert summary["status"] == "completed" and summary["data"]["skipped_samples"] == 0
    # per evaluation: the val split was evaluated twice, each time without the same 3 samples
    assert trainer.parts.evaluator.skipped == {"val": len(BAD), "test": len(BAD)}
    assert summary["data"]["eval_skipped_samples"] == {"val": len(BAD), "test": len(BAD)}
    warned = [m for m in gputrain_warnings if "unreadable samples (data.on_error=skip)" in m]
    assert [m.split(":")[0] for m in warned] == ["val split", "test split"]


class HoleyShare(Dataset):
    """20 samples; 5 and 7 cannot be read. Under 2 ranks both fall in rank 1's share (odd indices)."""

    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if i in (5, 7):
            raise OSError(f"cannot read img{i}")
        return torch.full((4,), float(i)), i % 2


def _evaluate_shared(rank: int, on_error: str) -> tuple[str, Any]:
    """One rank of a plain-DDP evaluation (each rank reads its share, the figures are gathered)."""
    import contextlib

    import torch.distributed as dist

    from gputrain.data.guard import BadSample
    from gputrain.distributed.context import DistContext
    from gputrain.evaluate.evaluator import EvalSpec, Evaluator
    from gputrain.evaluate.layout import eval_layout
    from gputrain.train.tasks import Task

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    place = DistContext(rank=rank, world_size=2, dp_rank=rank, dp_size=2)
    spec = EvalSpec(Task("classification", nn.functional.cross_entropy, num_classes=2), ["loss"], contextlib.nullcontext)
    evaluator = Evaluator(model, model, spec, eval_layout(place, torch.device("cpu"), 4), on_error=on_error)
    try:
        return "ok", (evaluator.evaluate(HoleyShare(), "val").metrics, evaluator.skipped)
    except BadSample as err:
        return "BadSample", str(err)


@pytest.mark.slow
@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_shared_evaluation_with_an_unreadable_sample_on_one_rank(on_error: str) -> None:
    """The rank that meets the sample tells the others in the one gathering of the figures: every rank
    raises (fail) or reports the same count (skip), and none waits forever for the other."""
    from tests.dist.harness import run_ranks

    first, second = run_ranks(_evaluate_shared, on_error, timeout_s=90)
    if on_error == "fail":
        assert first == ("BadSample", "val split: another rank could not read a sample of its share (its error log "
                                      "names it)")
        assert second == ("BadSample", "val split: sample 5: OSError: cannot read img5 (and 1 more in this batch); "
                                       "set data.on_error=skip to skip unreadable samples")
    else:
        assert first[0] == second[0] == "ok" and first[1][1] == second[1][1] == {"val": 2}
        assert first[1][0] == second[1][0]  # the same figures on both ranks


def test_an_evaluation_reader_counts_each_pass_alone(tmp_path: Path) -> None:
    from gputrain.data.feed import EvalBatches

    reader = EvalBatches(FlakyImages(tmp_path), 16, torch.device("cpu"), on_error="skip", split="val")
    for _ in range(2):
        assert sum(len(batch[0]) for batch in reader) == 64 - len(BAD)
        assert reader.skipped == len(BAD) and reader.example is not None and reader.example.startswith("sample 5 ")
