"""checkpoint/async_save.py: the background saver writes the state of the moment it was asked
(training goes on meanwhile), and a failed write surfaces at the next wait, once. Killed while
saving in the background: tests/unit/checkpoint/test_io.py."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from torch import nn

from gputrain.checkpoint import verify_checkpoint
from gputrain.checkpoint.async_save import AsyncSaver
from tests.unit.checkpoint.helpers import read_and_apply
from gputrain.errors import RunError


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
    state = read_and_apply(path, fresh)
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
