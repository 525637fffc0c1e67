"""`gputrain plan` allocates no real tensor storage, whatever optimizer the config names and whichever
kernel (fused, foreach, the single-tensor loop) it steps with: torch has no fake kernel for fused SGD
or Adagrad, and its fake mode ran their real kernel on zero-filled real copies of every parameter,
gradient and state (issue 27: a 2.6 GiB peak for a "fake" step of GPT-2 350M). Counted by c10's CPU
allocator (plan/allocator.py) in a process of its own, which nothing profiled before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest

from gputrain.config.schema import OptimizerName
from gputrain.optim.optimizers import _CLASSES
from gputrain.optim.states import optimizer_states_per_param

ROOT = Path(__file__).resolve().parents[3]
WIDTH = 2048  # mlp [2048, 2048] on digits (64 features, 10 classes): 4.35M parameters, 16.6 MiB of fp32
REAL_BYTES_BOUND = 64 * 1024
"""Real bytes the fake step may allocate: the optimizers' scalar step counters and the like."""
VARIANTS = ("as built", "foreach", "single-tensor")
MOMENTUM = {"sgd": 0.9, "rmsprop": 0.9}  # the state a momentum buffer adds, to be materialised or not

_SCRIPT = r"""
import json, sys
from gputrain.cli.plan import build_plan_target
from gputrain.config import load_config
from gputrain.optim import optimizers
from gputrain.plan.allocator import AllocatorPeak
from gputrain.plan.planner import make_plan

width, names, momentum = int(sys.argv[1]), sys.argv[2].split(","), json.loads(sys.argv[3])
real_flags = optimizers.kernel_flags
forced = {"foreach": {"foreach": True}, "single-tensor": {"foreach": False}}
out = []
for variant in ("as built", "foreach", "single-tensor"):
    flags = forced.get(variant)
    optimizers.kernel_flags = real_flags if flags is None else (lambda cls, params, device, f=flags: dict(f))
    for name in names:
        config = load_config(None, [f"optim.name={name}", f"optim.momentum={momentum.get(name, 0.0)}",
                                    "model.name=mlp", f"model.hidden_sizes=[{width},{width}]"])
        target, micro, _ = build_plan_target(config)  # real data and a model on meta: before the count
        seen = {}
        make = target.make_optimizer
        def spy(params, make=make, seen=seen):
            optimizer = make(params)
            seen["kernel"] = {k: optimizer.defaults.get(k) for k in ("fused", "foreach")}
            return optimizer
        target.make_optimizer = spy
        with AllocatorPeak() as peak:
            plan = make_plan(target, micro, 1, 2**34)
            peak.mark()
        step = target.step(micro)
        out.append({"variant": variant, "name": name, "real_peak": peak.peak_between(0, 1) - peak.live_at(0),
                    "measured": plan.measured, "optimizer": None if step is None else step.optimizer,
                    "params": plan.num_params, "kernel": seen.get("kernel")})
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def planned() -> dict[tuple[str, str], dict[str, Any]]:
    """Every optimizer × kernel variant planned once, in one fresh process (~15 s)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    names = ",".join(get_args(OptimizerName))
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(WIDTH), names, json.dumps(MOMENTUM)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return {(r["variant"], r["name"]): r for r in json.loads(lines[0].removeprefix("RESULT "))}


def test_every_name_the_config_takes_is_an_optimizer() -> None:
    assert set(get_args(OptimizerName)) == set(_CLASSES)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", get_args(OptimizerName))
def test_the_plans_step_allocates_nothing_real(
    planned: dict[tuple[str, str], dict[str, Any]], name: str, variant: str
) -> None:
    row = planned[variant, name]
    param_bytes = 4 * row["params"]
    assert param_bytes > 16 * 2**20  # a materialised step would be several times this
    assert row["real_peak"] <= REAL_BYTES_BOUND, row
    # measured, not given up on: activations and every state tensor the optimizer keeps
    assert row["measured"] and row["optimizer"] is not None, row
    states = optimizer_states_per_param(name, MOMENTUM.get(name, 0.0))
    assert states * param_bytes <= row["optimizer"] <= states * param_bytes + 4096, (row, states)


def test_each_variant_is_the_one_asked_for(planned: dict[tuple[str, str], dict[str, Any]]) -> None:
    """On the CPU the config's optimizer is fused where torch has the kernel (a fused kernel without
    a fake implementation, SGD's or Adagrad's in torch 2.13, steps as the single-tensor loop in the
    plan: like the fused kernel it makes no temporaries the size of all the parameters)."""
    fused = {"sgd", "adam", "adamw", "adagrad"}  # optim/optimizers.py's _FUSED_OPS
    for name in get_args(OptimizerName):
        assert planned["foreach", name]["kernel"]["foreach"] is True
        assert planned["single-tensor", name]["kernel"]["foreach"] is False
        built = planned["as built", name]["kernel"]
        if name in fused:
            assert built["fused"] is True or built["foreach"] is False, (name, built)
        else:
            assert not built["fused"] and not built["foreach"], (name, built)
    assert planned["as built", "adamw"]["kernel"]["fused"] is True  # torch fakes fused Adam(W): stepped as it is


def test_the_plans_fake_mode_runs_no_real_kernel() -> None:
    """Whatever the step calls: an op without a fake implementation (aten._fused_sgd_ in torch 2.13)
    fails the measurement, which the plan then says, instead of running on real zero-filled copies."""
    import torch
    from torch._subclasses.fake_tensor import UnsupportedOperatorException

    from gputrain.plan.measure import fake_mode

    with fake_mode():
        params, grads = [torch.empty(1024, 1024)], [torch.empty(1024, 1024)]
        with pytest.raises(UnsupportedOperatorException):
            torch._fused_sgd_(
                params,
                grads,
                [],
                weight_decay=0.0,
                momentum=0.0,
                lr=0.1,
                dampening=0.0,
                nesterov=False,
                maximize=False,
                is_first_step=True,
            )
