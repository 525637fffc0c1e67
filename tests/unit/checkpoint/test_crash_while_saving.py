"""SIGKILL inside checkpoint writes, synchronous and asynchronous: nothing partial at a final path,
resume from the last complete checkpoint (issue 7, figure 2; `scripts/kill_during_save.py --trials 50`
prints the full figure). Plus the asynchronous saver's own guarantees."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

from gputrain.checkpoint import load_checkpoint, verify_checkpoint
from gputrain.checkpoint.async_save import AsyncSaver
from gputrain.errors import RunError
from tests.unit.reliability.chaos import TINY, check_after_crash, compare_runs, kill_during_save, resumed_from, run_train

EVERY = 4


@pytest.mark.slow
def test_sigkill_during_saves(tmp_path: Path, reference_run: Path) -> None:
    rng = random.Random(5)
    for trial in range(5):
        mode = ("sync", "async")[trial % 2]
        overrides = TINY + [f"checkpoint.async_save={str(mode == 'async').lower()}"]
        run_dir = tmp_path / f"t{trial}"
        left = kill_during_save(run_dir, overrides, rng.randint(1, 14), 0.05, rng.uniform(0, 0.4))
        assert left is not None, "the run finished before it could be killed"
        problems, resume_from = check_after_crash(run_dir)
        assert problems == [], (trial, left)
        lost = left["killed_at_step"] - (int(resume_from.name[5:]) if resume_from else 0)
        assert lost <= (EVERY if mode == "sync" else 2 * EVERY), (trial, left, resume_from)
        if trial == 1:  # one full resume (async); test_kill_resume and the script cover many more
            assert run_train(run_dir, overrides) == 0
            assert resume_from is None or resumed_from(run_dir, resume_from)
            assert not list((run_dir / "checkpoints").glob(".step-*")), "temporaries left behind"
            assert compare_runs(reference_run, run_dir) == []


def test_async_save_writes_the_state_of_the_moment_it_was_asked(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import gputrain.checkpoint.async_save as async_save

    gate = threading.Event()
    real_save = async_save.save_checkpoint

    def slow_save(*args, **kwargs):  # type: ignore[no-untyped-def]
        gate.wait(10)
        return real_save(*args, **kwargs)

    monkeypatch.setattr(async_save, "save_checkpoint", slow_save)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = optimizer.state_dict()["state"][0]["momentum_buffer"].clone()
    saver = AsyncSaver()
    path = saver.save(tmp_path, 1, model, {"optimizer": optimizer.state_dict()})
    assert not path.exists()  # still in flight
    with torch.no_grad():  # training goes on while the save is in flight
        for p in model.parameters():
            p.add_(1.0)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    gate.set()
    saver.wait()
    verify_checkpoint(path)
    fresh = nn.Linear(3, 2)
    state = load_checkpoint(path, fresh)
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in expected.items())
    assert torch.equal(state["optimizer"]["state"][0]["momentum_buffer"], momentum)


def test_async_save_failure_surfaces_at_the_next_wait(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    saver = AsyncSaver()
    saver.save(blocker / "checkpoints", 1, nn.Linear(2, 2), {})
    with pytest.raises(RunError, match="writing checkpoint .*step-1 failed"):
        saver.wait()
    saver.wait()  # reported once


def test_a_crash_between_the_renames_of_a_resave_is_repaired(tmp_path: Path) -> None:
    from gputrain.checkpoint import find_resumable, rotate_checkpoints, save_checkpoint

    root = tmp_path / "checkpoints"
    save_checkpoint(root, 4, nn.Linear(2, 2), {})
    save_checkpoint(root, 8, nn.Linear(2, 2), {})
    # what a kill between `final → .old` and `tmp → final` leaves: no step-8, its old copy, a new temporary
    (root / "step-8").rename(root / ".step-8.old-999999")
    (root / ".step-8.tmp-999999").mkdir()
    assert find_resumable(root) == root / "step-8"
    verify_checkpoint(root / "step-8")
    rotate_checkpoints(root, keep_last=2)  # the next save's rotation sweeps the debris
    assert sorted(p.name for p in root.iterdir()) == ["step-4", "step-8"]
