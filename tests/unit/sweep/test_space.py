"""The search space file (gputrain/sweep/space.py): its forms, and every value a trial can get
checked against the config before any trial."""

from __future__ import annotations

import pytest

from gputrain.config.load import parse_toml
from gputrain.errors import UsageError
from gputrain.sweep.space import Param, check_space, parse_space


def space(text: str):  # type: ignore[no-untyped-def]
    return parse_space(parse_toml(text, "space.toml"), "space.toml")


def test_dotted_quoted_and_section_keys_are_one_form() -> None:
    parsed = space(
        """
        optim.lr = {log_uniform = [1e-4, 1e-2]}
        "optim.weight_decay" = {uniform = [0.0, 0.1]}
        [train]
        batch_size = {choice = [32, 64]}
        [model]
        hidden = {int = [16, 64]}
        [base]
        train.epochs = 1
        "eval.every_steps" = 5
        [base.data]
        name = "digits"
        """
    )
    assert parsed.params == (
        Param("optim.lr", "log_uniform", (1e-4, 1e-2)),
        Param("optim.weight_decay", "uniform", (0.0, 0.1)),
        Param("train.batch_size", "choice", (32, 64)),
        Param("model.hidden", "int", (16, 64)),
    )
    assert parsed.base == {"train.epochs": 1, "eval.every_steps": 5, "data.name": "digits"}


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("optim.lr = {uniform = [0.1, 0.1]}", "is empty"),
        ("optim.lr = {log_uniform = [1e-2, 1e-4]}", "is empty"),
        ("optim.lr = {log_uniform = [0.0, 1e-2]}", "low > 0"),
        ("optim.lr = {int = [1, 2.5]}", "whole numbers"),
        ("optim.lr = {uniform = [1]}", "[low, high]"),
        ("optim.lr = {uniform = [nan, 1.0]}", "finite"),
        ("optim.lr = {uniform = [true, 2]}", "[low, high]"),
        ("optim.lr = {choice = []}", "choice is empty"),
        ("optim.lr = {choice = [0.1, 0.1]}", "twice"),
        ("optim.betas = {choice = [[0.9, 0.95]]}", "numbers, strings or booleans"),
        ("optim.lr = {uniform = [0, 1], int = [0, 1]}", "one distribution"),
        ("optim.lr = {normal = [0, 1]}", "one distribution"),
        ("optim.lr = 0.1", "one distribution"),
        ("optim.lr = {choice = 0.1}", "takes a list"),
        ("[base]\ntrain.epochs = 1", "no parameter"),
        ("base = 3\noptim.lr = {choice = [0.1]}", "[base] must be a table"),
        ("optim.lr = {choice = [0.1]}\n[base]\noptim.lr = 0.2", "both searched and fixed"),
        ('optim.lr = {choice = [0.1]}\n"optim.lr" = {choice = [0.2]}', "given twice"),
    ],
)
def test_a_malformed_entry_names_the_file_and_key(text: str, words: str) -> None:
    with pytest.raises(UsageError) as err:
        space(text)
    assert str(err.value).startswith("space.toml: ") and words in str(err.value)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("optim.lrr = {log_uniform = [1e-4, 1e-2]}", "optim.lrr"),  # no such key
        ("optimizer.lr = {log_uniform = [1e-4, 1e-2]}", "optimizer"),  # no such section
        ("train.batch_size = {uniform = [16, 128]}", "train.batch_size = "),  # a float for an int key
        ('train.batch_size = {choice = [32, "big"]}', "'big'"),
        ("optim.lr = {uniform = [-1.0, 1.0]}", "optim.lr = -1.0"),  # outside the key's own range
        ("train.epochs = {int = [0, 3]}", "train.epochs = 0"),
        ('model.name = {choice = ["mlp", "no_such_model"]}', "no_such_model"),
    ],
)
def test_every_value_a_trial_can_get_is_checked_against_the_config(text: str, words: str) -> None:
    with pytest.raises(UsageError) as err:
        check_space(space(text), "space.toml", None, [])
    assert str(err.value).startswith("space.toml: ") and words in str(err.value), str(err.value)


def test_a_space_the_config_takes_passes_and_the_base_is_checked_too() -> None:
    check_space(space("optim.lr = {log_uniform = [1e-4, 1e-2]}\ntrain.batch_size = {int = [8, 64]}"), "s", None, [])
    with pytest.raises(UsageError, match=r"^s: \[base\]: .*train\.epochs"):
        check_space(space("optim.lr = {choice = [0.1]}\n[base]\ntrain.epochs = -1"), "s", None, [])
    with pytest.raises(UsageError, match=r"train\.epochs"):  # the command line's overrides over the base
        check_space(space("optim.lr = {choice = [0.1]}"), "s", None, ["train.epochs=0"])
