"""NaN/Inf in the loss or the gradients: the step is never applied (issue 7, figure 4)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gputrain.checkpoint import find_resumable, verify_checkpoint
from gputrain.data.tensors import TensorData
from gputrain.precision import Precision
from gputrain.train import nonfinite
from gputrain.train.nonfinite import Guard, NonFiniteGuard, NonFiniteStep
from gputrain.train.step import StepParts, train_step
from gputrain.train.trainer import Trainer

KINDS = ["loss_nan", "loss_inf", "grad_nan", "grad_inf"]
BAD = {"nan": float("nan"), "inf": float("inf")}


def _data() -> TensorData:
    g = torch.Generator().manual_seed(0)
    return TensorData(torch.randn(256, 8, generator=g), torch.randint(0, 3, (256,), generator=g))


def _trainer(run_dir: Path, mode: str, inject_step: int | None, kind: str, max_steps: int
             ) -> tuple[Trainer, dict[int, list[torch.Tensor]]]:
    """A tiny MLP whose step_fn poisons step `inject_step` and records the parameters each step starts from."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    seen: dict[int, list[torch.Tensor]] = {}
    calls = [0]

    def step_fn(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        calls[0] += 1
        step = calls[0]
        seen[step] = [p.detach().clone() for p in m.parameters()]
        out = m(batch[0])
        bad = BAD[kind.split("_")[1]]
        if step == inject_step and kind.startswith("grad"):
            out.register_hook(lambda g: torch.full_like(g, bad))  # finite loss, poisoned gradients
        loss = F.cross_entropy(out, batch[1])
        return loss * bad if step == inject_step and kind.startswith("loss") else loss

    config = {"train.max_steps": max_steps, "train.epochs": 1, "train.batch_size": 16, "train.device": "cpu",
              "train.on_nonfinite": mode, "optim.schedule": "cosine", "log.progress": "none",
              "log.tensorboard": False, "log.every_steps": 4, "checkpoint.every_steps": 3, "checkpoint.keep_last": 1,
              "checkpoint.max_overhead": 0}
    return Trainer(model, _data(), step_fn=step_fn, config=config, run_dir=run_dir), seen


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _params(trainer: Trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.model.parameters()]


def test_30_random_injections_never_apply_the_step(tmp_path: Path) -> None:
    rng = random.Random(7)
    max_steps = 8
    for trial in range(30):
        mode = ("stop", "skip")[trial % 2]
        kind = KINDS[(trial // 2) % 4]
        inject = rng.randint(1, max_steps)
        trainer, seen = _trainer(tmp_path / f"t{trial}", mode, inject, kind, max_steps)
        if mode == "stop":
            with pytest.raises(NonFiniteStep) as err:
                trainer.fit()
            # an Inf gradient turns into NaN on its way through the layers (inf * 0), so only the loss's is exact
            expected = f"step {inject}: loss is {kind[5:]}" if kind.startswith("loss") else f"step {inject}: gradient norm is "
            assert str(err.value).startswith(expected), err.value
            assert _same(_params(trainer), seen[inject]), f"trial {trial}: parameters changed"
            assert trainer.scheduler.last_epoch == inject - 1
            latest = find_resumable(tmp_path / f"t{trial}" / "checkpoints")
            good = (inject - 1) // 3 * 3  # the last checkpoint step before the poisoned one
            if good == 0:
                assert latest is None  # nothing good to keep yet, and nothing bad was written
            else:
                assert latest is not None and latest.name == f"step-{good}"
                verify_checkpoint(latest)
        else:
            summary = trainer.fit()
            after = seen.get(inject + 1, _params(trainer))
            assert _same(after, seen[inject]), f"trial {trial}: a skipped step changed the parameters"
            assert trainer.scheduler.last_epoch == max_steps - 1  # one step did not move the schedule
            assert summary["train"]["nonfinite_steps"] == 1
            assert summary["global_step"] == max_steps
            assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_skip_count_survives_resume(tmp_path: Path) -> None:
    trainer, _ = _trainer(tmp_path, "skip", 3, "loss_nan", 8)
    assert trainer.fit()["train"]["nonfinite_steps"] == 1
    resumed, seen = _trainer(tmp_path, "skip", None, "loss_nan", 12)
    summary = resumed.fit()
    assert min(seen) == 1 and len(seen) == 4  # only steps 9..12 ran in the resumed trainer
    assert summary["train"]["nonfinite_steps"] == 1
    assert resumed.scheduler.last_epoch == 11


def _scaled_parts(scale: float) -> tuple[StepParts, nn.Module]:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    precision = Precision("fp32", torch.device("cpu"))
    precision.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)  # stands in for the CUDA fp16 scaler

    def compute_loss(m: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        return m(batch).sum() * scale

    guard = NonFiniteGuard("stop", precision)  # with its GradScaler: an Inf gradient is the scaler's
    return StepParts(model=model, optimizer=optimizer, scheduler=scheduler, precision=precision,
                     compute_loss=compute_loss, guard=guard), model


def test_grad_scaler_overflow_skips_without_moving_the_schedule() -> None:
    parts, model = _scaled_parts(scale=1e36)  # finite loss, gradients overflow once scaled by 2**16
    before = [p.detach().clone() for p in model.parameters()]
    result = train_step(parts, [torch.ones(3, 4)], measure_grad_norm=False)
    assert result.verdict.kind == "overflow"
    assert _same([p.detach() for p in model.parameters()], before)
    assert parts.scheduler.last_epoch == 0
    assert parts.precision.scaler is not None and parts.precision.scaler.get_scale() == 2.0**15


def test_grad_scaler_normal_step_advances_the_schedule() -> None:
    parts, model = _scaled_parts(scale=1.0)
    before = [p.detach().clone() for p in model.parameters()]
    result = train_step(parts, [torch.ones(3, 4)], measure_grad_norm=False)
    assert result.verdict.kind == "apply"
    assert not _same([p.detach() for p in model.parameters()], before)
    assert parts.scheduler.last_epoch == 1


def test_clip_grad_value_does_not_hide_an_inf_gradient() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)

    def compute_loss(m: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        out = m(batch)
        out.register_hook(lambda g: torch.full_like(g, float("inf")))
        return out.sum()

    parts = StepParts(model=model, optimizer=optimizer, scheduler=scheduler,
                      precision=Precision("fp32", torch.device("cpu")), compute_loss=compute_loss,
                      clip_grad_value=1.0, guard=NonFiniteGuard("skip", Precision("fp32", torch.device("cpu"))))
    before = [p.detach().clone() for p in model.parameters()]
    result = train_step(parts, [torch.ones(3, 4)], measure_grad_norm=False)
    assert result.verdict.kind == "nonfinite"
    assert _same([p.detach() for p in model.parameters()], before)


@pytest.fixture(params=["cpu kernels", "cuda kernels"])
def amp_kernels(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The fused AMP check's dtype table: this machine's, or CUDA's, which has no bfloat16 kernel
    (pytorch#127176) and so sends bf16 tensors down the norm path (tests/gpu runs the real one)."""
    if request.param == "cuda kernels":
        monkeypatch.setitem(nonfinite._AMP_CHECK_DTYPES, "cpu", nonfinite._AMP_CHECK_DTYPES["cuda"])
    return str(request.param)


def test_cuda_has_no_bf16_flag_kernel_and_the_guard_knows() -> None:
    cuda = torch.device("cuda", 0)
    assert not nonfinite.amp_check_supports(cuda, torch.bfloat16)
    assert nonfinite.amp_check_supports(cuda, torch.float16) and nonfinite.amp_check_supports(cuda, torch.float32)


@pytest.mark.parametrize("bad", [None, "grad_nan", "grad_inf", "loss_nan", "bf16_grad_inf", "bf16_grad_nan"])
@pytest.mark.parametrize("layout", ["mixed", "all_bf16"])
def test_flag_check_leaves_gradients_bit_identical_and_finds_every_bad_value(bad: str | None, layout: str,
                                                                             amp_kernels: str) -> None:
    """Steps that need no gradient norm use the fused AMP finiteness check with a scale of 1: it must
    not change a single gradient bit, and must see a bad value in any dtype or in the loss alone.
    "all_bf16" is a model cast to bf16 (every gradient and the loss in bf16)."""
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(5, 3, generator=g), torch.randn(7, generator=g), torch.randn(4, generator=g).bfloat16()]
    loss = torch.tensor(2.5)
    if layout == "all_bf16":
        grads, loss = [t.bfloat16() for t in grads], loss.bfloat16()
    if bad == "grad_nan":
        grads[0][2, 1] = float("nan")
    elif bad == "grad_inf":
        grads[1][6] = float("-inf")
    elif bad == "bf16_grad_inf":
        grads[2][0] = float("inf")
    elif bad == "bf16_grad_nan":
        grads[2][3] = float("nan")
    elif bad == "loss_nan":
        loss = torch.full_like(loss, float("nan"))
    before = [t.clone() for t in grads]
    verdict = NonFiniteGuard("skip", Precision("fp32", torch.device("cpu"))).check_gradients(loss, grads)
    assert verdict.kind == ("apply" if bad is None else "nonfinite")
    for old, new in zip(before, grads, strict=True):
        assert torch.equal(old.view(torch.int16) if old.dtype == torch.bfloat16 else old.view(torch.int32),
                           new.view(torch.int16) if new.dtype == torch.bfloat16 else new.view(torch.int32))


def test_off_means_no_check_at_all(tmp_path: Path) -> None:
    """on_nonfinite=off is the hand-written loop's behaviour: the poisoned step is applied, nothing is counted."""
    trainer, _ = _trainer(tmp_path, "off", 3, "grad_nan", 5)
    assert type(trainer.parts.step.guard) is Guard  # the guard that applies every update
    summary = trainer.fit()
    assert summary["status"] == "completed" and summary["train"]["nonfinite_steps"] == 0
    assert not all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert trainer.scheduler.last_epoch == 5
