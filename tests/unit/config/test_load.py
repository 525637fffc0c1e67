import pytest

from gputrain.config import Config, config_to_toml, load_config, parse_override
from gputrain.config.docs import describe_fields, field_docs
from gputrain.config.schema import SECTIONS
from gputrain.errors import ConfigError, UsageError


def test_defaults_are_the_documented_default_job():
    config = load_config()
    assert (config.model.name, config.data.name, config.train.batch_size) == ("cnn", "digits", 64)
    assert config.train.precision == "auto" and config.checkpoint.resume == "auto"


@pytest.mark.parametrize("text, key, value", [
    ("train.epochs=3", "train.epochs", 3),
    ("optim.lr=1e-3", "optim.lr", 1e-3),
    ("train.compile=true", "train.compile", True),
    ("optim.betas=[0.9, 0.95]", "optim.betas", [0.9, 0.95]),
    ("train.device=cuda:1", "train.device", "cuda:1"),
    ("data.path=/tmp/my data.csv", "data.path", "/tmp/my data.csv"),
])
def test_overrides_parse_as_toml_literals_else_strings(text, key, value):
    assert parse_override(text) == (key, value)


def test_override_without_equals_is_a_usage_error():
    with pytest.raises(UsageError, match="section.key=value"):
        parse_override("train.epochs")


def test_int_is_accepted_for_float_and_list_fields_are_typed():
    config = load_config(None, ["optim.lr=1", "model.hidden_sizes=[32, 16]"])
    assert config.optim.lr == 1.0 and isinstance(config.optim.lr, float)
    assert config.model.hidden_sizes == [32, 16]


def test_toml_file_then_overrides_on_top(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[train]\nepochs = 7\nbatch_size = 32\n[model]\nname = "mlp"\n')
    config = load_config(path, ["train.epochs=2"])
    assert (config.train.epochs, config.train.batch_size, config.model.name) == (2, 32, "mlp")


def test_dict_of_dotted_keys_and_nested_dict():
    assert load_config({"train.epochs": 4}).train.epochs == 4
    assert load_config({"train": {"epochs": 5}}).train.epochs == 5


@pytest.mark.parametrize("overrides, field, words", [
    (["train.bach_size=3"], "train.bach_size", "did you mean 'batch_size'"),
    (["trian.epochs=3"], "trian", "did you mean 'train'"),
    (["train.epochs=ten"], "train.epochs", "expected an integer"),
    (["train.epochs=true"], "train.epochs", "expected an integer"),
    (["train.epochs=0"], "train.epochs", "must be > 0"),
    (["optim.lr=-1"], "optim.lr", "must be > 0"),
    (["data.val_fraction=1.5"], "data.val_fraction", "fraction"),
    (["optim.name=adamm"], "optim.name", "did you mean 'adam'"),
    (["train.precision=bf32"], "train.precision", "choose from"),
    (["model.name=resnet9000"], "model.name", "choose from"),
    (["optim.betas=[0.9]"], "optim.betas", "two numbers"),
    (["train.batch_size=64", "train.grad_accum=5"], "train.batch_size", "train.grad_accum=5"),
    (["train.clip_grad_norm=1.0", "train.clip_grad_value=1.0"], "train.clip_grad_value", "not both"),
])
def test_bad_values_name_the_field(overrides, field, words):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert info.value.field == field
    assert words in str(info.value)
    assert len(str(info.value).splitlines()) <= 3


def test_broken_toml_names_file_and_line(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[train]\nepochs = 3\nbatch_size = = 4\n")
    with pytest.raises(UsageError, match=r"bad.toml.*line 3"):
        load_config(path)


def test_missing_config_file(tmp_path):
    with pytest.raises(UsageError, match="config file not found: .*nope.toml"):
        load_config(tmp_path / "nope.toml")


def test_resolved_config_round_trips_through_toml(tmp_path):
    config = load_config(None, ["train.epochs=3", "optim.betas=[0.8, 0.9]", "data.path=x.csv", "data.name=csv"])
    path = tmp_path / "config.toml"
    path.write_text(config_to_toml(config))
    assert load_config(path) == config


def test_every_field_has_a_docstring():
    docs = field_docs()
    rows = describe_fields()
    assert len(rows) > 60
    missing = [row["key"] for row in rows if not docs.get(row["key"])]
    assert missing == []
    assert set(SECTIONS) == {"model", "data", "train", "optim", "eval", "checkpoint", "log", "parallel", "rl"}


def test_config_object_passes_through():
    config = Config()
    assert load_config(config) == config
