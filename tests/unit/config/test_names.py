"""The config validates `model.name`/`data.name` against its own lists (no torch, no registries):
those lists must be what the registries hold."""

import pytest

from gputrain.config import load_config
from gputrain.config.names import DATA_NAMES, MODEL_NAMES, choices
from gputrain.data import available_data
from gputrain.errors import ConfigError
from gputrain.models import available_models


def test_config_lists_the_registered_models():
    assert sorted(MODEL_NAMES) == available_models(), \
        "a model registered with @register_model is missing from gputrain/config/names.py (or the reverse)"


def test_config_lists_the_registered_data_sources():
    assert sorted(DATA_NAMES) == available_data(), \
        "a data source registered with @register_data is missing from gputrain/config/names.py (or the reverse)"


@pytest.mark.parametrize("override, message", [
    ("model.name=resnt18", "config error: model.name = 'resnt18': unknown choice; choose from "
                           + ", ".join(sorted(MODEL_NAMES))
                           + ", or a library's model: timm:<name>, torchvision:<name>, or hf with model.hf_config"
                           + "\n  did you mean 'resnet18'?"),
    ("data.name=nothing", "config error: data.name = 'nothing': unknown choice; choose from "
                          + ", ".join(sorted(DATA_NAMES))),
])
def test_unknown_name_lists_the_choices(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert str(info.value) == message


def test_a_name_registered_at_run_time_validates(monkeypatch):
    from gputrain.config import names
    from gputrain.data.registry import SOURCES, register_data
    from gputrain.models.registry import MODELS, register_model

    for table in (MODELS, SOURCES):  # leave the registries as they were for the tests after this one
        table.names()  # loaded first, so the copy restored afterwards holds every built-in
        monkeypatch.setattr(table, "_items", dict(table._items))
    monkeypatch.setattr(names, "_added", {"model.name": set(), "data.name": set()})
    register_model("my_net")(lambda config, spec: None)
    register_data("my_data")(lambda config, seed: None)
    config = load_config(None, ["model.name=my_net", "data.name=my_data"])
    assert (config.model.name, config.data.name) == ("my_net", "my_data")
    assert "my_net" in choices("model.name") and "my_net" not in MODEL_NAMES
