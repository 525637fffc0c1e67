"""Each optimizer takes one step and matches torch's own; each schedule matches torch's own."""

import math

import pytest
import torch

from gputrain.config import load_config
from gputrain.optim import build_optimizer, build_schedule, effective_lr


def _params(seed=0):
    torch.manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))]


def _one_step(opt, params):
    loss = (params[0].sum(dim=0) * params[1]).pow(2).sum()
    loss.backward()
    opt.step()
    return [p.detach().clone() for p in params]


@pytest.mark.parametrize("name, torch_cls, kwargs", [
    ("sgd", torch.optim.SGD, {"momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    ("adam", torch.optim.Adam, {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}),
    ("adamw", torch.optim.AdamW, {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}),
    ("rmsprop", torch.optim.RMSprop, {"momentum": 0.9, "eps": 1e-8, "weight_decay": 0.01}),
    ("adagrad", torch.optim.Adagrad, {"eps": 1e-8, "weight_decay": 0.01}),
    ("adadelta", torch.optim.Adadelta, {"eps": 1e-8, "weight_decay": 0.01}),
    ("adamax", torch.optim.Adamax, {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}),
    ("nadam", torch.optim.NAdam, {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}),
])
@pytest.mark.parametrize("decay", ["matrices", "all"])
def test_optimizer_step_matches_torch(name, torch_cls, kwargs, decay):
    config = load_config(None, {"optim.name": name, "optim.lr": 0.05, "optim.weight_decay": 0.01,
                                "optim.nesterov": name == "sgd", "optim.decay": decay})
    ours = _params()
    theirs = _params()
    opt = build_optimizer(ours, config.optim, batch_size=64, device=torch.device("cpu"))
    assert type(opt) is torch_cls
    # the fused kernel wherever torch has one (it can skip an update on the device: device_guard.py)
    assert opt.defaults.get("fused", False) == (name in ("sgd", "adam", "adamw", "adagrad"))
    if opt.defaults.get("fused"):
        kwargs = {**kwargs, "fused": True}
    for _ in range(3):
        a = _one_step(opt, ours)
        opt.zero_grad()
    if decay == "all":
        ref = torch_cls(theirs, lr=0.05, **kwargs)
    else:  # the [4, 3] weight decays, the [3] bias does not
        ref = torch_cls([{"params": theirs[:1]}, {"params": theirs[1:], "weight_decay": 0.0}], lr=0.05, **kwargs)
    for _ in range(3):
        b = _one_step(ref, theirs)
        ref.zero_grad()
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_linear_lr_scaling():
    config = load_config(None, {"optim.lr": 0.1, "optim.scale_lr": "linear", "optim.base_batch_size": 256})
    assert effective_lr(config.optim, 512) == pytest.approx(0.2)
    assert effective_lr(load_config(None, {"optim.lr": 0.1}).optim, 512) == 0.1


def _lrs(scheduler, optimizer, steps):
    out = []
    for _ in range(steps):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def _sgd(lr=0.1):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


TOTAL = 40


@pytest.mark.parametrize("overrides, reference", [
    ({"optim.schedule": "constant"}, lambda o: torch.optim.lr_scheduler.ConstantLR(o, factor=1.0)),
    ({"optim.schedule": "step", "optim.step_size": 7, "optim.gamma": 0.5},
     lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=7, gamma=0.5)),
    ({"optim.schedule": "multistep", "optim.milestones": [5, 20], "optim.gamma": 0.3},
     lambda o: torch.optim.lr_scheduler.MultiStepLR(o, milestones=[5, 20], gamma=0.3)),
    ({"optim.schedule": "exponential", "optim.gamma": 0.9},
     lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.9)),
    ({"optim.schedule": "cosine", "optim.min_lr": 0.001},
     lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=TOTAL, eta_min=0.001)),
    ({"optim.schedule": "linear"},
     lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=1.0, end_factor=0.0, total_iters=TOTAL)),
    ({"optim.schedule": "onecycle"},
     lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=TOTAL, cycle_momentum=False)),
])
def test_schedule_matches_torch(overrides, reference):
    config = load_config(None, {"optim.lr": 0.1, **overrides})
    ours_opt, ref_opt = _sgd(), _sgd()
    ours = _lrs(build_schedule(ours_opt, config.optim, TOTAL), ours_opt, TOTAL)
    ref = _lrs(reference(ref_opt), ref_opt, TOTAL)
    assert ours == pytest.approx(ref, rel=1e-6, abs=1e-9)


def test_warmup_cosine_ramps_then_decays_to_min():
    config = load_config(None, {"optim.lr": 0.1, "optim.schedule": "warmup_cosine", "optim.warmup_steps": 10,
                                "optim.min_lr": 0.01})
    opt = _sgd()
    lrs = _lrs(build_schedule(opt, config.optim, TOTAL), opt, TOTAL + 1)
    assert lrs[:10] == pytest.approx([0.1 * (i + 1) / 10 for i in range(10)])
    assert lrs[10] == pytest.approx(0.1)
    expected_mid = 0.01 + 0.09 * 0.5 * (1 + math.cos(math.pi * 15 / 30))
    assert lrs[25] == pytest.approx(expected_mid)
    assert lrs[TOTAL] == pytest.approx(0.01)


def _moved_by_decay_alone(decay: str) -> set[str]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    config = load_config(None, {"optim.lr": 0.1, "optim.weight_decay": 0.5, "optim.decay": decay})
    opt = build_optimizer(model.parameters(), config.optim, batch_size=64, device=torch.device("cpu"))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # no gradient: only decay can move a parameter
    opt.step()
    return {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}


def test_by_default_only_matrices_decay():
    assert _moved_by_decay_alone("matrices") == {"0.weight"}  # not the bias, not LayerNorm's scale or shift
    # everything decays with decay=all (LayerNorm's shift starts at 0, which decay leaves at 0)
    assert _moved_by_decay_alone("all") == {"0.weight", "0.bias", "1.weight"}
