"""The config keys a report lists: those a run set away from the defaults, and those on which
several runs differ; a key an older run's config.toml lacks is neither."""

from __future__ import annotations

from gputrain.config import config_to_dict, load_config
from gputrain.report.config_diff import differs_between, differs_from_defaults


def test_only_changed_keys_differ_from_the_defaults():
    config = config_to_dict(load_config(None, ["optim.lr=0.01", "train.max_steps=5"]))
    assert differs_from_defaults(config) == {"optim.lr": (0.01, 0.001), "train.max_steps": (5, None)}


def test_a_key_an_older_config_lacks_is_not_a_difference():
    config = config_to_dict(load_config(None, ["optim.lr=0.01"]))
    del config["parallel"]  # written before the parallel section existed
    del config["train"]["seed"]
    assert differs_from_defaults(config) == {"optim.lr": (0.01, 0.001)}
    assert differs_between([config, config_to_dict(load_config(None, ["optim.lr=0.01"]))]) == {}


def test_runs_differ_on_exactly_the_keys_they_disagree_on():
    a = config_to_dict(load_config(None, ["optim.lr=0.01", "model.name=mlp"]))
    b = config_to_dict(load_config(None, ["optim.lr=0.02", "model.name=mlp"]))
    c = config_to_dict(load_config(None, ["optim.lr=0.01", "model.name=mlp", "train.epochs=3"]))
    assert differs_between([a, b, c]) == {"optim.lr": [0.01, 0.02, 0.01], "train.epochs": [20, 20, 3]}


def test_a_key_outside_any_table_stands_as_itself():
    """A hand-edited config.toml with a key before its first table: shown, not a crash."""
    config = {"note": "<b>mine</b>", "train": {"epochs": 3}}
    assert differs_from_defaults(config)["note"] == ("<b>mine</b>", None)
    assert differs_between([config, {"train": {"epochs": 3}}])["note"] == ["<b>mine</b>", None]
