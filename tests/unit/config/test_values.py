"""The one value check (limits.check_values): every number finite and inside its field's Range,
every string printable UTF-8; the bounds are what the consumers accept (numpy, torch); the check
runs for configs built in Python too, and the bounds are listed by `config show`."""

from __future__ import annotations

import dataclasses
import math
import typing

import numpy as np
import pytest
import torch

from gputrain.config import Config, OptimConfig, TrainConfig, load_config
from gputrain.config.docs import describe_fields
from gputrain.config.limits import LIMITS, Range, check_values
from gputrain.config.schema import SECTIONS
from gputrain.errors import ConfigError


def _leaves(annotation: object) -> set[object]:
    if typing.get_origin(annotation) is typing.Literal:
        return {type(a) for a in typing.get_args(annotation)}
    args = typing.get_args(annotation)
    return set().union(*map(_leaves, args)) if args else {annotation}


def _number_fields() -> list[str]:
    """Every field whose type holds int or float (also inside a list or a union)."""
    return [f"{section}.{f.name}" for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)
            if _leaves(typing.get_type_hints(cls)[f.name]) & {int, float}]


def test_every_number_field_has_a_range_and_nothing_else_does():
    assert sorted(LIMITS) == sorted(_number_fields())


def test_a_number_field_without_a_range_is_a_programming_error(monkeypatch):
    monkeypatch.delitem(LIMITS, "train.epochs")
    with pytest.raises(TypeError, match="train.epochs is a number field without a Range"):
        TrainConfig()


def test_configs_built_in_python_are_checked_too():
    with pytest.raises(ConfigError) as info:
        TrainConfig(clip_grad_norm=float("nan"))
    assert info.value.field == "train.clip_grad_norm" and "finite" in str(info.value)
    with pytest.raises(ConfigError, match=r"optim.betas = \[0.9, inf\]: must be a finite number"):
        OptimConfig(betas=[0.9, math.inf])
    with pytest.raises(ConfigError, match="train.device .*control character U\\+000A"):
        TrainConfig(device="cuda\n")


def test_range_messages():
    assert Range(0, 10, low_open=True).problem(0) == "must be > 0"
    assert Range(0, 10).problem(-1) == "must be >= 0"
    assert Range(0, 10, why="ten").problem(11) == "must be at most 10 (ten)"
    assert Range(0, 1, high_open=True).problem(1.0) == "must be < 1"
    assert Range(0, 1, high_open=True, text="a fraction").problem(2) == "must be a fraction"
    assert Range(0, 10).problem(10) is None and Range(0, 10, low_open=True).problem(1e-300) is None
    assert Range(0, 1e6, low_open=True).describe(integer=False) == "(0, 1000000]"
    assert Range(0, 7, low_open=True).describe(integer=True) == "1..7"


def test_huge_values_are_named_without_printing_them():
    with pytest.raises(ConfigError) as info:
        load_config({"train.seed": 10**4000})
    message = str(info.value)
    assert info.value.field == "train.seed" and len(message) < 200 and "at most 4294967295" in message
    with pytest.raises(ConfigError) as info:
        load_config({"data.path": "x" * 5000})
    assert "is 5000 characters long; at most 4096" in str(info.value) and len(str(info.value)) < 300
    with pytest.raises(ConfigError, match="has 2000 items; at most 1024"):
        load_config({"optim.milestones": list(range(1, 2001))})


def test_the_largest_seed_is_one_numpy_and_torch_take():
    seed = LIMITS["train.seed"].high
    assert load_config({"train.seed": seed}).train.seed == seed
    np.random.seed(seed)  # the legacy seeding takes 0..2**32-1 only
    with pytest.raises(ValueError):
        np.random.seed(seed + 1)
    # the per-epoch shuffling seed gputrain derives (data/batches.py), for a very long run
    torch.Generator().manual_seed(seed * 1_000_003 + LIMITS["train.epochs"].high)


def test_the_largest_counts_and_sizes_stay_within_int64_products():
    count, batch = LIMITS["train.max_steps"].high, LIMITS["train.batch_size"].high
    assert count * batch < 2**63  # samples seen over a run, as an int64 tensor
    assert LIMITS["data.num_samples"].high * LIMITS["train.epochs"].high < 2**63


def test_boundary_values_are_accepted():
    config = load_config({"optim.lr": 1000, "optim.eps": 1.0, "optim.gamma": 1.0, "train.clip_grad_norm": 1e6,
                          "parallel.timeout_s": 7 * 24 * 3600, "optim.momentum": 0.0, "data.num_workers": 1024,
                          "train.batch_size": 2**24, "train.grad_accum": 2**24, "train.epochs": 2**31 - 1,
                          "parallel.tp": -1, "optim.min_lr": 5e-324})
    assert config.optim.lr == 1000.0 and config.train.batch_size == 2**24 and config.optim.min_lr == 5e-324


def test_config_show_lists_every_range():
    rows = {row["key"]: row for row in describe_fields()}
    assert {key for key, row in rows.items() if row["range"]} == set(LIMITS)
    assert rows["optim.lr"]["range"] == "(0, 1000]"
    assert rows["train.seed"]["range"] == "0..4294967295"
    assert rows["data.val_fraction"]["range"] == "a fraction in [0, 1)"


def test_check_values_reads_every_field_by_kind():
    # strings anywhere in a section, items of list fields, None and bools pass through
    check_values("eval", Config().eval)
    with pytest.raises(ConfigError) as info:
        load_config({"eval.metrics": ["accuracy", "f1\x00"]})
    assert info.value.field == "eval.metrics"
    with pytest.raises(ConfigError) as info:
        load_config({"data.augment": ["flip\udcff"]})
    assert info.value.field == "data.augment" and "not UTF-8" in str(info.value)
