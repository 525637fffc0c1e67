"""A user's own optimizer and scheduler (`Trainer(optimizer=..., scheduler=...)`, issue 29 §1), given
wrong: each case is refused with one line (a UsageError: exit 2, no traceback) that says what to
pass instead. What the arguments alone tell is refused by the constructor before anything is made
(no run directory); what a factory does is known only once the model is parallelised, after the run
directory is claimed, which then holds no file."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import LambdaLR, OneCycleLR, ReduceLROnPlateau, StepLR

from gputrain import Trainer
from gputrain.config import config_to_toml, load_config
from gputrain.errors import UsageError
from gputrain.train.user_optim import OPTIMIZER_FIELDS, SCHEDULE_FIELDS
from tests.adversarial.helpers import QUIET, linear_data

Args = Callable[[nn.Module, Path], dict[str, Any]]
"""The Trainer's keyword arguments for a case, given its model and a scratch directory."""


def _sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1)


def _other() -> list[nn.Parameter]:
    return list(nn.Linear(6, 3).parameters())


def _raising(params: Any) -> torch.optim.Optimizer:
    raise ValueError("no such group: 'head'")


def _two_groups_same_param(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW([{"params": params}, {"params": params[:1]}])


def _instance_with_a_param_twice(model: nn.Module, _: Path) -> dict[str, Any]:
    weight, bias = model.parameters()
    optimizer = torch.optim.SGD([{"params": [weight]}, {"params": [bias]}], lr=0.1)
    optimizer.param_groups[1]["params"].append(weight)  # torch checks only when a group is added
    return {"optimizer": optimizer}


def _emptied_instance(model: nn.Module, _: Path) -> dict[str, Any]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.param_groups.clear()
    return {"optimizer": optimizer}


def _meta_model_instance(model: nn.Module, _: Path) -> dict[str, Any]:
    with torch.device("meta"):
        on_meta = nn.Linear(6, 3)
    return {"model": on_meta, "optimizer": torch.optim.SGD(on_meta.parameters(), lr=0.1)}


def _toml(text: str) -> Args:
    def args(model: nn.Module, scratch: Path) -> dict[str, Any]:
        path = scratch / "config.toml"
        path.write_text(text)
        return {"optimizer": _sgd, "config": path}

    return args


CONSTRUCTOR = "constructor"  # refused before anything is made: no run directory
BUILD = "build"  # refused once the model is parallelised: the directory is claimed, and holds nothing

CASES: list[tuple[str, Args, str, str]] = [
    # what optimizer= is
    ("optimizer a string", lambda m, s: {"optimizer": "adamw"},
     r"optimizer= is a builtins\.str: pass a torch\.optim\.Optimizer or a factory params -> Optimizer", CONSTRUCTOR),
    ("optimizer a class's instance of nothing", lambda m, s: {"optimizer": 3},
     r"optimizer= is a builtins\.int: pass a torch\.optim\.Optimizer", CONSTRUCTOR),
    ("optimizer holding no parameters", _emptied_instance, r"optimizer= holds no parameters", CONSTRUCTOR),
    ("instance over another model's parameters", lambda m, s: {"optimizer": torch.optim.SGD(_other(), lr=0.1)},
     r"optimizer= is an instance over parameters the training step does not update \(they are not the model's "
     r"parameters\): pass a factory", BUILD),
    ("instance with a parameter in two groups", _instance_with_a_param_twice,
     r"optimizer= holds a parameter in two parameter groups", BUILD),
    ("factory returning None", lambda m, s: {"optimizer": lambda params: None},
     r"optimizer= factory <lambda> returned a builtins\.NoneType, not a torch\.optim\.Optimizer", BUILD),
    ("factory returning the params", lambda m, s: {"optimizer": lambda params: params},
     r"returned a gputrain\.optim\.params\.TrainParams, not a torch\.optim\.Optimizer", BUILD),
    ("factory raising", lambda m, s: {"optimizer": _raising},
     r"optimizer= factory _raising raised ValueError: no such group: 'head'$", BUILD),
    ("factory over no parameters", lambda m, s: {"optimizer": lambda params: torch.optim.SGD([], lr=0.1)},
     r"optimizer= factory <lambda> raised ValueError: optimizer got an empty parameter list", BUILD),
    ("factory with a parameter in two groups", lambda m, s: {"optimizer": _two_groups_same_param},
     r"factory _two_groups_same_param raised ValueError: some parameters appear in more than one parameter group",
     BUILD),
    ("factory over another model's parameters", lambda m, s: {"optimizer": lambda p: torch.optim.SGD(_other(), lr=.1)},
     r"optimizer= factory SGD holds tensors that are not the model's parameters as the step trains them", BUILD),
    ("factory leaving out the bias", lambda m, s: {"optimizer": lambda params: torch.optim.SGD(params[:1], lr=0.1)},
     r"optimizer= leaves out 1 trained parameter \(bias\): their gradients would pile up unzeroed; .*"
     r"set requires_grad=False", BUILD),
    ("instance leaving out the weight", lambda m, s: {"optimizer": torch.optim.SGD([m.bias], lr=0.1)},
     r"optimizer= leaves out 1 trained parameter \(weight\)", BUILD),
    ("instance over a meta-device model", _meta_model_instance,
     r"optimizer= is an instance over parameters the training step does not update \(the model is on the meta "
     r"device and is materialised rank by rank\): pass a factory", CONSTRUCTOR),
    ("partial with a bad setting", lambda m, s: {"optimizer": functools.partial(torch.optim.SGD, lr=-1.0)},
     r"optimizer= factory SGD raised ValueError: Invalid learning rate: -1\.0$", BUILD),
    # what scheduler= is
    ("scheduler a number", lambda m, s: {"scheduler": 0.1},
     r"scheduler= is a builtins\.float: pass a torch\.optim\.lr_scheduler\.LRScheduler or a factory", CONSTRUCTOR),
    ("scheduler ReduceLROnPlateau", lambda m, s: {"optimizer": (o := torch.optim.SGD(m.parameters(), lr=0.1)),
                                                  "scheduler": ReduceLROnPlateau(o)},
     r"scheduler= is a ReduceLROnPlateau, which steps on a validation metric", CONSTRUCTOR),
    ("scheduler over another optimizer", lambda m, s: {"optimizer": torch.optim.SGD(m.parameters(), lr=0.1),
                                                       "scheduler": StepLR(torch.optim.SGD(_other(), lr=0.1), 2)},
     r"scheduler= is a StepLR over another optimizer than the optimizer= given: pass a factory", CONSTRUCTOR),
    ("scheduler instance with the config's optimizer",
     lambda m, s: {"scheduler": StepLR(torch.optim.SGD(m.parameters(), lr=0.1), 2)},
     r"scheduler= is a StepLR over another optimizer than the config's optimizer, which the run builds itself",
     CONSTRUCTOR),
    ("scheduler instance with an optimizer factory",
     lambda m, s: {"optimizer": _sgd, "scheduler": StepLR(torch.optim.SGD(m.parameters(), lr=0.1), 2)},
     r"over another optimizer than the optimizer optimizer= makes: pass a factory, e\.g\. scheduler=lambda opt: "
     r"StepLR\(opt, \.\.\.\)", CONSTRUCTOR),
    ("scheduler factory returning None", lambda m, s: {"scheduler": lambda opt: None},
     r"scheduler= factory <lambda> returned a builtins\.NoneType, not an LRScheduler", BUILD),
    ("scheduler factory returning ReduceLROnPlateau", lambda m, s: {"scheduler": ReduceLROnPlateau},
     r"scheduler= factory ReduceLROnPlateau returned a torch\.optim\.lr_scheduler\.ReduceLROnPlateau", BUILD),
    ("scheduler factory raising", lambda m, s: {"scheduler": lambda opt: OneCycleLR(opt)},
     r"scheduler= factory <lambda> raised TypeError: .*missing 1 required positional argument: .max_lr.$", BUILD),
    ("scheduler factory over another optimizer",
     lambda m, s: {"scheduler": lambda opt: LambdaLR(torch.optim.SGD(_other(), lr=0.1), lambda step: 1.0)},
     r"scheduler= is a LambdaLR over another optimizer than the optimizer= given", BUILD),
    # the config's optim.* mixed in, each way the config can say it
    ("nested dict optim.lr", lambda m, s: {"optimizer": _sgd, "config": {"optim": {"lr": 0.1}}},
     r"optimizer= and the config's optim\.lr would both set the run's optimizer", CONSTRUCTOR),
    ("TOML file optim.name", _toml('[optim]\nname = "sgd"\n'),
     r"optimizer= and the config's optim\.name would both set", CONSTRUCTOR),
    ("TOML file optim.lr and betas", _toml('[optim]\nlr = 0.1\nbetas = [0.9, 0.95]\n'),
     r"the config's optim\.betas, optim\.lr would both set the run's optimizer: .*remove them", CONSTRUCTOR),
    ("a CLI run's whole config.toml", _toml(config_to_toml(load_config(QUIET))),
     r"^optimizer= and the config's optim\.base_batch_size, optim\.betas, optim\.decay, optim\.eps, optim\.lr, "
     r"optim\.momentum and 4 more would both set the run's optimizer", CONSTRUCTOR),
    ("Config object with optim.eps", lambda m, s: {"optimizer": _sgd, "config": load_config(None, {**QUIET,
                                                                                               "optim.eps": 1e-6})},
     r"optimizer= and the config's optim\.eps", CONSTRUCTOR),
    ("both, with a field of each", lambda m, s: {"optimizer": _sgd, "scheduler": lambda o: StepLR(o, 2),
                                                 "config": {"optim.momentum": 0.5, "optim.warmup_steps": 3}},
     r"^optimizer= and scheduler= and the config's optim\.momentum, optim\.warmup_steps would both", CONSTRUCTOR),
]
# every field each replaces, set by a dotted override to a value of its own kind
_VALUES = {"name": "sgd", "lr": 0.5, "weight_decay": 0.1, "decay": "all", "momentum": 0.5, "nesterov": True,
           "betas": [0.8, 0.9], "eps": 1e-6, "scale_lr": "linear", "base_batch_size": 64, "schedule": "cosine",
           "warmup_steps": 2, "step_size": 3, "gamma": 0.5, "milestones": [2], "min_lr": 1e-5}
def _with_field(given: str, field: str, extra: dict[str, Any] | None = None) -> Args:
    """optimizer= (a factory) or scheduler= (a factory) with the config setting `optim.<field>`."""
    arg = _sgd if given == "optimizer" else (lambda o: StepLR(o, 2))
    return lambda m, s: {given: arg, "config": {**(extra or {}), f"optim.{field}": _VALUES[field]}}


CASES += [(f"optimizer= with optim.{f}", _with_field("optimizer", f),
           rf"optimizer= and the config's optim\.{f} would both set the run's optimizer", CONSTRUCTOR)
          for f in OPTIMIZER_FIELDS if f != "nesterov"]
CASES += [("optimizer= with optim.nesterov", _with_field("optimizer", "nesterov", {"optim.name": "sgd"}),
           r"optimizer= and the config's optim\.name, optim\.nesterov would both", CONSTRUCTOR)]
CASES += [(f"scheduler= with optim.{f}", _with_field("scheduler", f),
           rf"scheduler= and the config's optim\.{f} would both set the run's schedule", CONSTRUCTOR)
          for f in SCHEDULE_FIELDS]


@pytest.mark.parametrize(("args", "message", "when"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_wrong_optimizer_or_scheduler_is_one_line(tmp_path: Path, args: Args, message: str, when: str) -> None:
    torch.manual_seed(0)
    model = nn.Linear(6, 3)
    kwargs = args(model, tmp_path)
    config = kwargs.pop("config", {})
    model = kwargs.pop("model", model)
    if isinstance(config, dict):
        config = {**QUIET, **config}
    run_dir = tmp_path / "run"
    with pytest.raises(UsageError) as err:
        Trainer(model, linear_data(), loss_fn=F.cross_entropy, config=config, run_dir=run_dir, **kwargs).fit()
    text = str(err.value)
    assert "\n" not in text and "Traceback" not in text and err.value.exit_code == 2
    assert len(text) < 400, text
    assert re.search(message, text), text
    if when == CONSTRUCTOR:
        assert not run_dir.exists()
    else:
        assert not run_dir.exists() or not any(run_dir.iterdir()), sorted(run_dir.iterdir())
