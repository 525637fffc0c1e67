"""The run directory's config.toml always reloads to an equal Config: a property over generated
valid configs (any field; strings with quotes, backslashes, any printable Unicode; floats of every
magnitude; lists), and the TOML writer's escaping on its own."""

from __future__ import annotations

import dataclasses
import re
import tomllib
import typing
from typing import Any, Literal, get_args, get_origin

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gputrain.config import config_to_toml, load_config
from gputrain.config.load import toml_value
from gputrain.config.names import DATA_NAMES, MODEL_NAMES
from gputrain.config.limits import LIMITS, Range
from gputrain.config.schema import SECTIONS
from gputrain.errors import ConfigError

HINTS = {f"{s}.{f.name}": typing.get_type_hints(cls)[f.name] for s, cls in SECTIONS.items()
         for f in dataclasses.fields(cls)}
# printable text: every character but the control ones (Cc) and lone surrogates (Cs), which the
# config refuses; quotes, backslashes, U+2028, emoji, combining marks and TOML look-alikes included
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cc", "Cs"]), max_size=24) | st.sampled_from(
    ['"', "\\", '\\"', "'''", '"""', "\\u0041", "a\u2028b", "é", "🙂", "x = 1\n[y]".replace("\n", " "), "# c"])
SPECIAL_TEXT = {"model.name": st.sampled_from(MODEL_NAMES), "data.name": st.sampled_from(DATA_NAMES),
                "train.device": st.sampled_from(["auto", "cpu", "cuda", "cuda:3", "mps"])}


def _number(limit: Range, integer: bool) -> st.SearchStrategy[Any]:
    if integer:
        low, high = int(limit.low) + limit.low_open, int(limit.high) - limit.high_open
        return st.integers(low, min(high, low + 10**6)) | st.sampled_from([low, high])
    return st.floats(limit.low, limit.high, exclude_min=limit.low_open, exclude_max=limit.high_open,
                     allow_subnormal=True)


def _value(key: str, annotation: Any) -> st.SearchStrategy[Any]:
    origin = get_origin(annotation)
    if key in SPECIAL_TEXT:
        return SPECIAL_TEXT[key]
    if origin is Literal:
        return st.sampled_from(get_args(annotation))
    if origin in (typing.Union, __import__("types").UnionType):
        return st.one_of([_value(key, a) for a in get_args(annotation)])
    if origin is list:
        (item,) = get_args(annotation)
        return st.lists(_value(key, item), max_size=4)
    if annotation is type(None):
        return st.none()
    if annotation is bool:
        return st.booleans()
    if annotation in (int, float):
        return _number(LIMITS[key], annotation is int)
    if annotation is str:
        return TEXT
    raise TypeError(annotation)


@st.composite
def valid_configs(draw: st.DrawFn) -> dict[str, Any]:
    keys = draw(st.lists(st.sampled_from(sorted(HINTS)), unique=True, max_size=10))
    return {key: draw(_value(key, HINTS[key])) for key in keys}


@settings(max_examples=400, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(overrides=valid_configs())
def test_saved_config_reloads_equal(tmp_path_factory: pytest.TempPathFactory, overrides: dict[str, Any]) -> None:
    try:
        config = load_config(overrides)
    except ConfigError:
        assume(False)  # a combination the cross-field rules refuse: not a config to save
    text = config_to_toml(config)
    path = tmp_path_factory.mktemp("roundtrip") / "config.toml"
    path.write_text(text, encoding="utf-8")
    assert load_config(path) == config, text
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]", text)  # one line per key, no raw control characters


@pytest.mark.parametrize("value", [
    'say "hi"', "C:\\data\\x.csv", "\\\\server\\share", "\\u0041 stays six characters", "tab\there", "line\nbreak",
    "nul\x00", "del\x7f", "nel\x85", "é 🙂 \u2028 \u200b", "'''", '"""', "",
    0.1, 1e-300, 5e-324, -0.0, 1e16, 123456789.125, 2**53 + 1, -(2**63), [1, 2], ["a", 'b"'], [],
])
def test_toml_literal_reads_back_equal(value: Any) -> None:
    assert tomllib.loads(f"v = {toml_value(value)}")["v"] == value
