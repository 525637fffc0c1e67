"""A user's own optimizer and LR scheduler through `Trainer(optimizer=..., scheduler=...)` (issue 29
§1): parameter groups kept, stepped like the config's schedule, guarded, checkpointed and resumed bit
for bit; a third-party class (a tiny Lion) included."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from gputrain.config import load_config
from gputrain.data.tensors import TensorData
from gputrain.errors import RunError, UsageError
from gputrain.optim.params import TrainParams, train_params, weight_decay_groups
from gputrain.train import device_guard
from gputrain.train.device_guard import DeviceGuard
from gputrain.train.nonfinite import NonFiniteGuard, NonFiniteStep
from gputrain.train.trainer import Trainer
from gputrain.train.user_optim import states_per_param

QUIET = {"train.device": "cpu", "log.progress": "none", "log.tensorboard": False, "log.every_steps": 1,
         "train.epochs": 3, "train.batch_size": 16, "train.deterministic": True}
STEPS = 12  # 3 epochs of 64 samples in batches of 16


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023), as a third-party package would write it: no fused/foreach options."""

    def __init__(self, params: Any, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                avg = state["exp_avg"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(torch.sign(avg * beta1 + p.grad * (1 - beta1)), alpha=-group["lr"])
                avg.mul_(beta2).add_(p.grad, alpha=1 - beta2)


class Net(nn.Module):
    """A body with a norm and biases, and a head: what parameter groups are made for."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.LayerNorm(16), nn.ReLU(), nn.Dropout(0.1))
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _data() -> TensorData:
    g = torch.Generator().manual_seed(0)
    return TensorData(torch.randn(64, 6, generator=g), torch.randint(0, 3, (64,), generator=g))


def two_group_adamw(params: TrainParams) -> torch.optim.AdamW:
    """No decay on biases and norm scales, a larger LR for the head (by name)."""
    head = [p for name, p in params.named() if name.startswith("head.")]
    body = [p for name, p in params.named() if not name.startswith("head.")]
    groups = weight_decay_groups(body, 0.1)
    return torch.optim.AdamW([*groups, {"params": head, "lr": 3e-2, "weight_decay": 0.0}], lr=1e-2)


def one_cycle(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.OneCycleLR:
    max_lr = [group["lr"] for group in optimizer.param_groups]
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=max_lr, total_steps=STEPS)


def _trainer(run_dir: Path, *, loss_fn: Any = F.cross_entropy, optimizer: Any = two_group_adamw,
             scheduler: Any = one_cycle, **config: Any) -> Trainer:
    torch.manual_seed(0)
    return Trainer(Net(), _data(), loss_fn=loss_fn, config={**QUIET, **config}, run_dir=run_dir,
                   optimizer=optimizer, scheduler=scheduler)


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    """The step rows, without the figures of time (which differ between any two runs)."""
    timed = {"samples_per_s", "step_time_s", "achieved_flops", "mfu", "peak_memory_bytes"}
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in timed and not k.startswith("time_")}
            for row in rows if "split" not in row]


def _crash_at(step: int) -> Any:
    calls = [0]

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            calls[0] += 1
            if calls[0] == step:
                raise RuntimeError("simulated crash")
        return F.cross_entropy(outputs, targets)

    return loss_fn


def _assert_same(a: Trainer, b: Trainer) -> None:
    assert _rows(a.run_dir) == _rows(b.run_dir)  # every step's loss, LR and gradient norm, exactly
    wa, wb = load_file(a.run_dir / "model.safetensors"), load_file(b.run_dir / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
    assert sa["param_groups"] == sb["param_groups"]  # each group's LR, momentum, decay, ...
    for key, state in sa["state"].items():
        assert all(torch.equal(v, sb["state"][key][n]) for n, v in state.items()), key
    assert a.scheduler.state_dict() == b.scheduler.state_dict()


@pytest.mark.parametrize("optimizer", [two_group_adamw, functools.partial(Lion, lr=1e-3)], ids=["adamw", "lion"])
def test_crash_then_resume_equals_the_unbroken_run_bit_for_bit(tmp_path: Path, optimizer: Any) -> None:
    """A user's AdamW with two parameter groups (or a third-party Lion) and OneCycleLR, crashed at
    step 8 with a checkpoint at step 5, resumes there: rows, weights, optimizer state and LR are
    the unbroken run's."""
    unbroken = _trainer(tmp_path / "unbroken", optimizer=optimizer)
    unbroken.fit()
    with pytest.raises(RunError, match=r"step 8.*simulated crash"):
        _trainer(tmp_path / "crashed", optimizer=optimizer, loss_fn=_crash_at(8), **{"checkpoint.every_steps": 5}).fit()
    resumed = _trainer(tmp_path / "crashed", optimizer=optimizer, **{"checkpoint.every_steps": 5})
    resumed.fit()
    assert [r["step"] for r in _rows(resumed.run_dir)] == list(range(1, STEPS + 1))
    _assert_same(unbroken, resumed)
    lrs = [group["lr"] for group in resumed.optimizer.param_groups]
    if optimizer is two_group_adamw:
        assert len(lrs) == 3 and lrs[2] > lrs[0]  # the groups kept their own LRs to the end


def test_parameter_groups_and_onecycle_are_the_users(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path)
    groups = trainer.optimizer.param_groups
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    assert [sorted(names[id(p)] for p in g["params"]) for g in groups] == [
        ["body.0.weight"], ["body.0.bias", "body.1.bias", "body.1.weight"], ["head.bias", "head.weight"]]
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0, 0.0]
    assert isinstance(trainer.scheduler, torch.optim.lr_scheduler.OneCycleLR)
    assert trainer.parts.step.scheduler is trainer.scheduler
    summary = trainer.fit()
    record = summary["optimizer"]
    assert record["class"] == "torch.optim.adamw.AdamW" and record["scheduler"] == "OneCycleLR"
    assert [g["params"] for g in record["param_groups"]] == [1, 3, 2]
    assert record["param_groups"][2]["max_lr"] == 3e-2 and record["param_groups"][0]["weight_decay"] == 0.1
    assert record["kernel"] == "for-loop" and record["nonfinite_guard"] == "host"
    # the schedule ran its whole cycle, one step per optimizer step: the last LR is its floor
    assert trainer.scheduler.last_epoch == STEPS
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["optimizer"] == record
    # config.toml says its [optim] was not this run's optimizer, and still loads as a config
    head = (tmp_path / "config.toml").read_text().splitlines()[:2]
    assert head == ["# [optim] below is not what this run used for the optimizer (torch.optim.adamw.AdamW, 3 parameter "
                    "groups: the Trainer's optimizer=) and the LR schedule (OneCycleLR: the Trainer's scheduler=);",
                    '# summary.json\'s "optimizer" block records their settings.']
    assert load_config(tmp_path / "config.toml").optim == load_config(QUIET).optim
    # and it may be given again with the same optimizer= (its [optim] names every field, none of them set)
    torch.manual_seed(0)
    Trainer(Net(), _data(), loss_fn=F.cross_entropy, config=tmp_path / "config.toml", run_dir=tmp_path / "again",
            optimizer=two_group_adamw, scheduler=one_cycle)


def test_an_instance_is_trained_as_it_is(tmp_path: Path) -> None:
    """An instance (single process, no layout that replaces the parameters) and a scheduler over it."""
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD([{"params": model.body.parameters()}, {"params": model.head.parameters(),
                                                                         "lr": 0.5}], lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
    before = model.head.weight.detach().clone()
    trainer = Trainer(model, _data(), loss_fn=F.cross_entropy, config=QUIET, run_dir=tmp_path,
                      optimizer=optimizer, scheduler=scheduler)
    assert trainer.optimizer is optimizer and trainer.scheduler is scheduler
    trainer.fit()
    assert not torch.equal(model.head.weight, before)
    assert [g["lr"] for g in optimizer.param_groups] == [0.1 * 0.5**3, 0.5 * 0.5**3]  # 12 steps: 3 halvings


def test_the_configs_schedule_runs_over_a_users_optimizer(tmp_path: Path) -> None:
    """optimizer= alone: optim.schedule (set explicitly) moves each group's own LR."""
    trainer = _trainer(tmp_path, scheduler=None, **{"optim.schedule": "onecycle"})
    assert isinstance(trainer.scheduler, torch.optim.lr_scheduler.OneCycleLR)
    assert [g["max_lr"] for g in trainer.optimizer.param_groups] == [1e-2, 1e-2, 3e-2]


def test_a_scheduler_factory_over_the_configs_optimizer(tmp_path: Path) -> None:
    warm = lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))  # noqa: E731
    trainer = _trainer(tmp_path, optimizer=None, scheduler=warm, **{"optim.lr": 0.02, "optim.name": "sgd"})
    assert isinstance(trainer.optimizer, torch.optim.SGD)
    trainer.fit()
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.02)
    assert trainer.fit()["optimizer"]["given"] == "scheduler="


def test_the_factory_gets_the_parameters_by_the_users_names() -> None:
    """Wrappers that put a segment into the names (torch.compile's `_orig_mod.`) leave it out."""
    model = Net()
    model.body = torch.compile(model.body)  # type: ignore[assignment]
    model.head.bias.requires_grad_(False)  # frozen: not trained, not given
    params = train_params(model)
    assert params.names == ["body.0.weight", "body.0.bias", "body.1.weight", "body.1.bias", "head.weight"]
    assert isinstance(params, list) and params.module is model
    assert [p for _, p in params.named()] == list(params)
    torch.optim.AdamW(params)  # a plain list to torch


def test_the_state_memory_check_counts_the_users_optimizer() -> None:
    p = [nn.Parameter(torch.zeros(2))]
    assert states_per_param(torch.optim.AdamW(p)) == 2
    assert states_per_param(torch.optim.SGD(p, lr=0.1)) == 0
    assert states_per_param(Lion(p)) == 1
    assert states_per_param(two_group_adamw) is None  # a factory: made only once the model is parallelised


# ----------------------------------------------------------------- the non-finite guard
def _poisoned(step: int) -> Any:
    calls = [0]

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(outputs, targets)
        if torch.is_grad_enabled():
            calls[0] += 1
            if calls[0] == step:
                return loss * float("nan")
        return loss

    return loss_fn


def test_a_third_party_optimizer_is_guarded_on_the_host(tmp_path: Path) -> None:
    """Lion has no found_inf: the host guard skips the bad step, and the schedule does not move for it."""
    lion = functools.partial(Lion, lr=1e-3)
    clean = _trainer(tmp_path / "clean", optimizer=lion)
    skipping = _trainer(tmp_path / "skip", optimizer=lion, loss_fn=_poisoned(5), **{"train.on_nonfinite": "skip"})
    assert isinstance(skipping.parts.step.guard, NonFiniteGuard)
    summary = skipping.fit()
    assert summary["train"]["nonfinite_steps"] == 1 and summary["optimizer"]["nonfinite_guard"] == "host"
    clean.fit()
    lr_clean = {r["step"]: r["lr"] for r in _rows(clean.run_dir)}
    lr_skip = {r["step"]: r["lr"] for r in _rows(skipping.run_dir)}
    # from step 5 on the skipping run is one schedule step behind: the bad step did not count
    assert [lr_skip[s] for s in range(5, STEPS + 1)] == [lr_clean[s] for s in range(4, STEPS)]
    seen: dict[str, torch.Tensor] = {}
    stopping = _trainer(tmp_path / "stop", optimizer=lion, loss_fn=_poisoned(3))
    stopping.optimizer.register_step_post_hook(lambda opt, *_: seen.update(head=stopping.model.head.weight.clone()))
    with pytest.raises(NonFiniteStep, match="step 3"):
        stopping.fit()
    assert torch.equal(stopping.model.head.weight, seen["head"])  # as after step 2: step 3 not applied


def test_a_users_fused_adamw_gets_the_device_guard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """functools.partial(AdamW, fused=True): the device guard (as on a GPU); a subclass with a step of
    its own, which may not read found_inf, the host guard; a bad step stops the run, the schedule
    set back to the step it names."""
    monkeypatch.setattr(device_guard, "ON_CPU", True)  # a GPU's guard, on CPU tensors

    class OwnStep(torch.optim.AdamW):
        def step(self, closure: Any = None) -> Any:
            return super().step(closure)

    fused = functools.partial(torch.optim.AdamW, lr=1e-2, fused=True)
    trainer = _trainer(tmp_path / "fused", optimizer=fused, loss_fn=_poisoned(6), **{"log.every_steps": 4})
    assert isinstance(trainer.parts.step.guard, DeviceGuard)
    assert trainer.parts.optimizer_record is not None
    assert trainer.parts.optimizer_record["kernel"] == "fused"
    assert trainer.parts.optimizer_record["nonfinite_guard"] == "device"
    with pytest.raises(NonFiniteStep, match="step 6"):
        trainer.fit()  # read at step 8, the logging step
    assert trainer.state.global_step == 5 and trainer.scheduler.last_epoch == 5
    own = _trainer(tmp_path / "own", optimizer=lambda p: OwnStep(p, lr=1e-2, fused=True))
    assert isinstance(own.parts.step.guard, NonFiniteGuard)


def test_the_state_memory_check_counts_an_instance_and_skips_a_factory(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """195 parameters: 1560 bytes of weights and gradients fit 2 KiB, AdamW's two moments more do not;
    SGD without momentum keeps none. A factory's optimizer exists only once the model is built."""
    monkeypatch.setattr("gputrain.train.build.state_memory", lambda *_: ((2**11, "a test limit"), "the host"))
    data = TensorData(torch.randn(64, 64), torch.randint(0, 3, (64,)))

    def build(model: nn.Module, optimizer: Any, name: str) -> Trainer:
        return Trainer(model, data, loss_fn=F.cross_entropy, config=QUIET, run_dir=tmp_path / name, optimizer=optimizer).setup()

    model = nn.Linear(64, 3)
    with pytest.raises(UsageError, match=r"^the model's 195 parameters need .* of AdamW state = .*\(a test limit\)"):
        build(model, torch.optim.AdamW(model.parameters()), "adamw")
    build(model, torch.optim.SGD(model.parameters(), lr=0.1), "sgd")
    build(nn.Linear(64, 3), functools.partial(torch.optim.AdamW, lr=1e-3), "factory")


def test_sigkill_then_resume_equals_the_unbroken_run_bit_for_bit(tmp_path: Path) -> None:
    """The process SIGKILLed in step 27 (checkpoints every 10 steps), run again: metrics.jsonl, the
    final weights and the last checkpoint's optimizer state (both groups), schedule, RNGs and
    counters are the unbroken run's, bit for bit."""
    import os
    import signal
    import subprocess
    import sys

    from tests.unit.reliability.chaos import REPO, compare_runs
    from tests.waiting import wait_until

    def start(run_dir: Path, *hold: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(Path(__file__).with_name("user_optim_run.py")), str(run_dir),
                                 *hold], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)

    reference, killed = tmp_path / "reference", tmp_path / "killed"
    assert start(reference).wait(timeout=300) == 0
    proc = start(killed, "27")
    wait_until(lambda: killed.with_suffix(".held").exists() or proc.poll() is not None, 300, "step 27")
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert not (killed / "summary.json").exists()  # killed: nothing recorded the end
    resumed = start(killed)
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read().decode()[-2000:] if resumed.stderr else ""
    assert compare_runs(reference, killed) == []
