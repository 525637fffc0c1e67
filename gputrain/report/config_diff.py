"""Which config keys matter for a run: the ones that differ from the defaults, or between runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

UNSET = None
"""A key config.toml leaves unset (written as a comment), e.g. train.max_steps."""


def flatten(config: Mapping[str, Mapping[str, Any]] | None) -> dict[str, Any]:
    """{"train.epochs": 20, ...} from {"train": {"epochs": 20}, ...}; a key outside any table (a
    hand-edited file) stands as itself."""
    flat: dict[str, Any] = {}
    for section, values in (config or {}).items():
        if isinstance(values, Mapping):
            flat.update({f"{section}.{key}": value for key, value in values.items()})
        else:
            flat[str(section)] = values
    return flat


def default_config() -> dict[str, Any]:
    """gputrain's defaults (`Config()`), flattened, with unset keys as UNSET."""
    from gputrain.config import Config, config_to_dict

    return flatten(config_to_dict(Config()))


def differs_from_defaults(config: Mapping[str, Mapping[str, Any]] | None) -> dict[str, tuple[Any, Any]]:
    """{key: (value, default)} for every key whose value is not the default, in config order.

    Only keys the run's config has, or leaves unset, count: a key it lacks altogether came with a
    later gputrain, and its default is not something this run chose."""
    defaults = default_config()
    values = flatten(config)
    keys = list(values) + [k for k in defaults if k not in values and defaults[k] is UNSET]
    return {
        k: (values.get(k, UNSET), defaults.get(k, UNSET))
        for k in keys
        if values.get(k, UNSET) != defaults.get(k, UNSET)
    }


def differs_between(configs: Sequence[Mapping[str, Mapping[str, Any]] | None]) -> dict[str, list[Any]]:
    """{key: [value in each run]} for every key on which the runs do not all agree. A key a run's
    config lacks (it came with a later gputrain) counts as its default: that is how the run ran."""
    defaults = default_config()
    flat = [{**defaults, **flatten(c)} for c in configs]
    keys: list[str] = []
    for f in flat:
        keys.extend(k for k in f if k not in keys)
    differing = {}
    for key in keys:
        values = [f.get(key, UNSET) for f in flat]
        if any(v != values[0] for v in values[1:]):
            differing[key] = values
    return differing


def show_value(value: Any) -> str:
    if value is UNSET:
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    return repr(value) if isinstance(value, float) else str(value)
