"""The CUDA prefetcher's order of operations, recorded on the CPU through stand-ins for CUDA's stream,
event and pinning calls (a complement: tests/gpu/test_input_pipeline.py copies real batches, and the
CPU feed's own tests run the real path). What a GPU run depends on and no CPU run shows: batch n+1's
copy is issued (pinned first where it came pageable) before batch n is handed out, on the side stream;
the compute stream waits on batch n's own event, not on the side stream; each of batch n's tensors is
marked for the compute stream before its step uses it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from gputrain.data import prefetch
from gputrain.observe.breakdown import StepTimer


class _Calls:
    def __init__(self) -> None:
        self.log: list[str] = []
        self.current = "compute"


class _Stream:
    def __init__(self, calls: _Calls, name: str) -> None:
        self.calls, self.name = calls, name

    def wait_event(self, event: _Event) -> None:
        self.calls.log.append(f"{self.name} waits {event.name}")


class _Event:
    made = 0

    def __init__(self, calls: _Calls) -> None:
        self.calls = calls
        self.name = "?"

    def record(self, stream: _Stream) -> None:
        self.name = f"event{len([e for e in self.calls.log if e.startswith('record')])}"
        self.calls.log.append(f"record {self.name} on {stream.name}")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> _Calls:
    calls = _Calls()
    side = _Stream(calls, "side")

    class StreamContext:
        def __init__(self, stream: _Stream) -> None:
            self.stream = stream

        def __enter__(self) -> None:
            self.before, calls.current = calls.current, self.stream.name

        def __exit__(self, *exc: object) -> None:
            calls.current = self.before

    monkeypatch.setattr(torch.cuda, "Stream", lambda device: side)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: _Stream(calls, "compute"))
    monkeypatch.setattr(torch.cuda, "stream", StreamContext)
    monkeypatch.setattr(torch.cuda, "Event", lambda: _Event(calls))
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda t, s: calls.log.append(f"keep {int(t[0])} for {s.name}"))
    pinned_ids: set[int] = set()

    def pin_memory(t: torch.Tensor) -> torch.Tensor:
        calls.log.append(f"pin {int(t[0])}")
        copy = t.clone()
        pinned_ids.add(id(copy))
        return copy

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda t: id(t) in pinned_ids or bool(t[0] < 0))
    return calls


def _run(calls: _Calls, groups: list[list[Any]]) -> list[list[Any]]:
    def move(batch: Any) -> Any:
        first = batch[0] if isinstance(batch, (list, tuple)) else batch
        calls.log.append(f"copy {int(first[0])} on {calls.current}")
        return batch

    fed: Iterator[list[Any]] = prefetch.prefetch_to_cuda(
        iter(groups), torch.device("cuda", 0), move, StepTimer(torch.device("cpu"), 0)
    )
    out = []
    for group in fed:
        calls.log.append(f"step {int(group[0][0][0])}")
        out.append(group)
    return out


def test_batch_n_plus_1_is_copied_before_batch_n_is_handed_out_and_compute_waits_on_its_own_event(
    calls: _Calls,
) -> None:
    pinned = [[(torch.full((2,), -float(i + 1)), torch.full((2,), -float(i + 1)))] for i in range(3)]  # < 0: pinned
    _run(calls, pinned)
    assert calls.log == [
        "copy -1 on side",
        "record event0 on side",
        "copy -2 on side",
        "record event1 on side",
        "compute waits event0",
        "keep -1 for compute",
        "keep -1 for compute",
        "step -1",
        "copy -3 on side",
        "record event2 on side",
        "compute waits event1",
        "keep -2 for compute",
        "keep -2 for compute",
        "step -2",
        "compute waits event2",
        "keep -3 for compute",
        "keep -3 for compute",
        "step -3",
    ]


def test_a_pageable_batch_is_pinned_before_its_copy_and_a_pinned_one_is_not(calls: _Calls) -> None:
    pageable = (torch.full((2,), 5.0), torch.full((2,), -5.0))  # inputs pageable, targets pinned
    out = _run(calls, [[pageable]])
    assert calls.log[:2] == ["pin 5", "copy 5 on side"]
    assert "pin -5" not in calls.log
    ((inputs, targets),) = out[0]
    assert inputs is not pageable[0] and torch.equal(inputs, pageable[0])  # the pinned copy went
    assert targets is pageable[1]


def test_pinned_leaves_pinned_batches_and_non_tensors_as_they_are(calls: _Calls) -> None:
    batch = {"ids": torch.full((2,), -1.0), "meta": ["a", 3], "nested": (torch.full((2,), -2.0),)}
    assert prefetch.pinned(batch) is batch
    mixed = {"ids": torch.full((2,), 7.0), "name": "x"}
    out = prefetch.pinned(mixed)
    assert out is not mixed and out["name"] == "x" and calls.log == ["pin 7"]
