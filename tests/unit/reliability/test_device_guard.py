"""The non-finite guard decided on the device (issue 15 §1): no host sync on a non-logging step, and
a masked step changes nothing; skip mode reads its flag on the host each step (issue 26)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from gputrain.data.tensors import TensorData
from gputrain.train import device_guard
from gputrain.train.device_guard import DeviceGuard
from gputrain.train.nonfinite import NonFiniteGuard, NonFiniteStep
from gputrain.train.trainer import Trainer

# the ops through which a tensor's value reaches the host: .item(), float(), bool(), .tolist(), nonzero
HOST_READS = {
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.nonzero.default,
    torch.ops.aten.is_nonzero.default,
}


class CountHostReads(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func in HOST_READS:
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture(autouse=True)
def _device_guard_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard a GPU gets, on CPU tensors: a CPU itself gets the host guard (device_guard.ON_CPU)."""
    monkeypatch.setattr(device_guard, "ON_CPU", True)


def test_a_cpu_gets_the_host_guard_where_reading_the_flag_waits_for_nothing(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_guard, "ON_CPU", False)
    assert isinstance(_trainer(tmp_path).parts.step.guard, NonFiniteGuard)


def _data() -> TensorData:
    g = torch.Generator().manual_seed(0)
    return TensorData(torch.randn(256, 8, generator=g), torch.randint(0, 3, (256,), generator=g))


def _trainer(run_dir: Path, *, precision: str = "fp32", mode: str = "stop", poison: int | None = None,
             max_steps: int = 12, extra: dict | None = None, seen: dict | None = None) -> Trainer:
    """A tiny MLP; with `poison`, that step's loss is NaN and `seen` gets the parameters each step began with."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    calls = [0]

    def step_fn(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        calls[0] += 1
        if seen is not None:
            seen[calls[0]] = [p.detach().clone() for p in m.parameters()]
        loss = F.cross_entropy(m(batch[0]), batch[1])
        return loss * float("nan") if calls[0] == poison else loss

    config = {"train.max_steps": max_steps, "train.epochs": 1, "train.batch_size": 16, "train.device": "cpu",
              "train.precision": precision, "train.on_nonfinite": mode, "optim.schedule": "cosine",
              "log.progress": "none", "log.tensorboard": False, "log.every_steps": 4,
              "checkpoint.every_steps": 0, **(extra or {})}
    return Trainer(model, _data(), step_fn=step_fn if poison else None, config=config, run_dir=run_dir)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("clip", [None, 1.0])
def test_no_host_read_on_a_non_logging_step(tmp_path: Path, precision: str, clip: float | None) -> None:
    trainer = _trainer(tmp_path, precision=precision, extra={"train.clip_grad_norm": clip})
    assert isinstance(trainer.parts.step.guard, DeviceGuard)
    per_step: list[int] = []
    with CountHostReads() as reads:
        def on_step() -> None:
            per_step.append(reads.count - sum(per_step))

        trainer.fit(on_step=on_step)
    logging_steps = {4, 8, 12}
    quiet = {step: n for step, n in enumerate(per_step, start=1) if step not in logging_steps}
    assert quiet == dict.fromkeys(quiet, 0), f"host reads per step: {per_step}"
    assert all(per_step[s - 1] > 0 for s in logging_steps)  # the reads happen, on the logging steps


def test_a_checkpoint_put_off_costs_no_host_read(tmp_path: Path) -> None:
    """checkpoint.every_steps=1 with an overhead budget that only the first save fits: the saves put
    off (steps 2-11) do not read the guard's flags. A step's save follows `on_step`, so step k's
    count holds the save of step k - 1 (step 2's, the save of step 1)."""
    trainer = _trainer(tmp_path, extra={"checkpoint.every_steps": 1, "checkpoint.max_overhead": 1e-9})
    assert isinstance(trainer.parts.step.guard, DeviceGuard)
    per_step: list[int] = []
    with CountHostReads() as reads:
        trainer.fit(on_step=lambda: per_step.append(reads.count - sum(per_step)))
    saved = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "checkpoints").iterdir())
    assert saved == [1, 12]  # the first save, and the run's end (which always saves)
    quiet = {step: per_step[step - 1] for step in range(3, 12) if step not in (4, 8)}
    assert quiet == dict.fromkeys(quiet, 0), f"host reads per step: {per_step}"


def test_an_optimizer_without_a_fused_kernel_keeps_the_host_guard(tmp_path: Path, monkeypatch) -> None:
    """NAdam cannot skip an update on the device: the guard stays on the host. That guard reads
    one flag per step (counted with AdamW, whose fused step reads nothing itself)."""
    assert isinstance(_trainer(tmp_path / "nadam", extra={"optim.name": "nadam"}).parts.step.guard, NonFiniteGuard)
    monkeypatch.setattr(device_guard, "fits", lambda *args: False)
    trainer = _trainer(tmp_path / "adamw")
    assert isinstance(trainer.parts.step.guard, NonFiniteGuard)
    per_step: list[int] = []
    with CountHostReads() as reads:
        trainer.fit(on_step=lambda: per_step.append(reads.count - sum(per_step)))
    assert per_step[1] == per_step[4] == 1


def test_stop_names_the_first_bad_step_and_keeps_the_model_before_it(tmp_path: Path) -> None:
    """Step 5 is bad; the host learns of it on step 8 (a logging step). Steps 6-8 were masked on the
    device, so the model is the one step 5 started from, and the run says step 5."""
    seen: dict[int, list[torch.Tensor]] = {}
    trainer = _trainer(tmp_path, poison=5, seen=seen)
    with pytest.raises(NonFiniteStep, match=r"^step 5: loss is nan"):
        trainer.fit()
    assert len(seen) == 8  # the device masked steps 5-8; the host read the flag after step 8
    for ours, began in zip(trainer.model.parameters(), seen[5], strict=True):
        assert torch.equal(ours, began)
    assert trainer.state.global_step == 4 and trainer.scheduler.last_epoch == 4
    assert all(int(s["step"]) == 4 for s in trainer.optimizer.state.values())  # Adam's moments untouched too


def test_skip_mode_reads_its_flag_on_the_host_and_keeps_the_schedule_exact(tmp_path: Path) -> None:
    """Skip mode goes on after a bad step, so the guard decides it on the host, one read a step, and
    a skipped step does not move the LR schedule (the trade-off in train/device_guard.py)."""
    trainer = _trainer(tmp_path, mode="skip", poison=3)
    assert isinstance(trainer.parts.step.guard, NonFiniteGuard)
    per_step: list[int] = []
    with CountHostReads() as reads:
        summary = trainer.fit(on_step=lambda: per_step.append(reads.count - sum(per_step)))
    assert summary["train"]["nonfinite_steps"] == 1 and summary["global_step"] == 12
    assert trainer.scheduler.last_epoch == 11
    assert per_step[1] == per_step[4] == 1


def test_a_huge_logging_interval_keeps_the_device_buffers_small(tmp_path: Path) -> None:
    """log.every_steps=10**6 must not mean a million-slot buffer on the device (nor a million views
    made at the first step): the flags are read every MAX_WINDOW steps at the latest."""
    trainer = _trainer(tmp_path, poison=3, extra={"log.every_steps": 10**6})
    guard = trainer.parts.step.guard
    assert isinstance(guard, DeviceGuard) and guard.window == device_guard.MAX_WINDOW
    with pytest.raises(NonFiniteStep, match=r"^step 3: loss is nan"):
        trainer.fit()
    assert trainer.state.global_step == 2
