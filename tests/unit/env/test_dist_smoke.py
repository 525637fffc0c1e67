"""Who gets blamed when the all-reduce smoke test fails: fake ranks, real parent logic."""

from __future__ import annotations

import json
import time

from gputrain.env import dist_smoke
from gputrain.env.dist_smoke import _wait, choose_backend


class FakeRank:
    """A rank that exits with `code` and prints `report` (or never exits when code is None)."""

    def __init__(self, code: int | None, report: dict | None = None, stderr: str = "") -> None:
        self.returncode = code
        self.stdout = json.dumps(report) if report else ""
        self.stderr = stderr

    def poll(self) -> int | None:
        return self.returncode

    def communicate(self) -> tuple[str, str]:
        return self.stdout, self.stderr


OK = {"ok": True, "error": None, "in_collective": False}


def test_all_ranks_agree():
    assert _wait([FakeRank(0, OK), FakeRank(0, OK)], time.monotonic(), 5) == (None, None)


def test_the_crashed_rank_is_blamed_not_its_torn_down_peer():
    victim = FakeRank(3, {"ok": False, "error": "Connection closed by peer", "in_collective": True})
    crashed = FakeRank(-11, None, stderr="Segmentation fault")
    assert _wait([victim, crashed], time.monotonic(), 5) == (1, "Segmentation fault")


def test_a_rank_failing_in_its_own_code_is_blamed(monkeypatch):
    monkeypatch.setattr(dist_smoke, "_GRACE_S", 0.1)  # rank 2 never reports; stop waiting soon
    own = FakeRank(3, {"ok": False, "error": "RuntimeError: boom", "in_collective": False})
    victim = FakeRank(3, {"ok": False, "error": "Connection reset", "in_collective": True})
    assert _wait([victim, own, FakeRank(None)], time.monotonic(), 5) == (1, "RuntimeError: boom")


def test_a_hung_rank_is_named_after_the_timeout():
    rank, error = _wait([FakeRank(0, OK), FakeRank(None)], time.monotonic(), 0.2)
    assert rank == 1 and error == "timed out after 0.2 s (ranks still running: [1])"


def test_backend_choice():
    assert choose_backend(0, nccl_available=False) == ("gloo", 2)
    assert choose_backend(8, nccl_available=True) == ("nccl", 8)
    assert choose_backend(4, nccl_available=False) == ("gloo", 2)
