"""The search space of a sweep: a TOML file of config keys, each with one distribution, and the
fixed part every trial shares.

    optim.lr = {log_uniform = [1e-4, 1e-2]}        # a float, uniform in log space
    "optim.weight_decay" = {uniform = [0.0, 0.1]}  # a float (the dotted key quoted, or as above)
    train.batch_size = {choice = [32, 64, 128]}    # one of these values (numbers, strings, booleans)
    model.hidden = {int = [64, 256]}               # a whole number in [low, high]

    [base]                                         # fixed for every trial (over --config)
    train.epochs = 1

Every key is checked as the trials will use it: each range's ends and every choice is built into
a config (gputrain/config), so an unknown key, a value of the wrong type or out of the key's range
answers before any trial starts, naming the space file and the key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gputrain.errors import UsageError

Kind = Literal["log_uniform", "uniform", "int", "choice"]
KINDS: tuple[Kind, ...] = ("log_uniform", "uniform", "int", "choice")
BASE = "base"
"""The space file's table of fixed values."""


@dataclass(frozen=True, slots=True)
class Param:
    """One searched config key and its distribution."""

    key: str
    """The dotted config key, e.g. optim.lr."""
    kind: Kind
    values: tuple[Any, ...]
    """(low, high) for the ranges, the candidates for a choice."""

    def corners(self) -> tuple[Any, ...]:
        """The values that bound what a trial may get, checked against the config before any trial:
        a choice's every value; a range's ends, and for a float range a value inside it that is no
        whole number (a float range over an int key fails there, not in the fifth trial)."""
        if self.kind in ("choice", "int"):
            return self.values
        low, high = float(self.values[0]), float(self.values[1])
        inside = math.exp(math.log(low) + 0.37 * (math.log(high) - math.log(low))) if self.kind == "log_uniform" else 0
        if self.kind == "uniform":
            inside = low + 0.37 * (high - low)
        return (*self.values, inside)

    def describe(self) -> dict[str, Any]:
        """As sweep.json and the study record it (the space file's own form)."""
        return {"key": self.key, "kind": self.kind, "values": list(self.values)}


@dataclass(frozen=True, slots=True)
class Space:
    params: tuple[Param, ...]
    base: dict[str, Any]
    """Fixed `section.key` -> value for every trial."""

    def describe(self) -> dict[str, Any]:
        return {"params": [p.describe() for p in self.params], "base": self.base}


def _scalar(value: Any) -> bool:
    return isinstance(value, (bool, int, float, str)) and not (isinstance(value, float) and not math.isfinite(value))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def parse_param(key: str, spec: Any, where: str) -> Param:
    """One entry of the space file: `key = {kind = [...]}`.

    Raises:
        UsageError: naming `where` (the file), the key and what would be right.
    """
    if not isinstance(spec, Mapping) or len(spec) != 1 or next(iter(spec)) not in KINDS:
        raise UsageError(
            f"{where}: {key}: give one distribution, e.g. {key} = {{log_uniform = [1e-4, 1e-2]}} "
            f"(kinds: {', '.join(KINDS)})"
        )
    kind, values = next(iter(spec.items()))
    if not isinstance(values, list):
        raise UsageError(f"{where}: {key}: {kind} takes a list, e.g. {kind} = {_example(kind)}")
    if kind == "choice":
        if not values:
            raise UsageError(f"{where}: {key}: choice is empty: give at least one value")
        if not all(_scalar(v) for v in values):
            raise UsageError(
                f"{where}: {key}: choice values must be numbers, strings or booleans (a list is no candidate)"
            )
        if len({(type(v), v) for v in values}) < len(values):
            raise UsageError(f"{where}: {key}: choice lists a value twice")
        return Param(key, kind, tuple(values))
    if len(values) != 2 or not all(_number(v) for v in values):
        raise UsageError(f"{where}: {key}: {kind} takes [low, high], two finite numbers, e.g. {_example(kind)}")
    low, high = values
    if kind == "int" and not all(isinstance(v, int) for v in values):
        raise UsageError(f"{where}: {key}: int takes whole numbers [low, high], got {values}")
    if not low < high:
        raise UsageError(f"{where}: {key}: {kind} range [{low}, {high}] is empty: low must be below high")
    if kind == "log_uniform" and low <= 0:
        raise UsageError(f"{where}: {key}: log_uniform needs low > 0 (a log scale), got {low}")
    return Param(key, kind, (low, high))


def _example(kind: str) -> str:
    return {"log_uniform": "[1e-4, 1e-2]", "uniform": "[0.0, 0.1]", "int": "[16, 128]", "choice": "[32, 64]"}[kind]


def _flat(table: Mapping[str, Any], where: str, is_leaf: Any) -> dict[str, Any]:
    """`section.key` -> value from a TOML table written with dotted keys, quoted dotted keys or
    sections; a key given twice is refused."""
    flat: dict[str, Any] = {}
    for name, value in table.items():
        if isinstance(value, Mapping) and "." not in name and not is_leaf(value):
            items = [(f"{name}.{k}", v) for k, v in value.items()]
        else:
            items = [(name, value)]
        for key, item in items:
            if key in flat:
                raise UsageError(f"{where}: {key} is given twice")
            flat[key] = item
    return flat


def parse_space(document: Mapping[str, Any], where: str) -> Space:
    """The space file's TOML document as a Space (its shape only: `check_space` checks the keys)."""
    base_table = document.get(BASE, {})
    if not isinstance(base_table, Mapping):
        raise UsageError(f"{where}: [{BASE}] must be a table of fixed config values, e.g. [base] train.epochs = 1")
    rest = {k: v for k, v in document.items() if k != BASE}

    def is_distribution(value: Mapping[str, Any]) -> bool:
        return any(k in KINDS for k in value)

    params = tuple(parse_param(k, v, where) for k, v in _flat(rest, where, is_distribution).items())
    if not params:
        raise UsageError(f"{where}: no parameter to search: add one, e.g. optim.lr = {{log_uniform = [1e-4, 1e-2]}}")
    base = _flat(base_table, where, lambda _: False)  # a config value is never a table: a table is a section
    both = sorted(set(base) & {p.key for p in params})
    if both:
        raise UsageError(f"{where}: {both[0]} is both searched and fixed in [{BASE}]: give it once")
    return Space(params, base)


def read_space(path: Path) -> Space:
    """Read and parse the space file (config/load.py's TOML reader: its errors name the file)."""
    from gputrain.config.load import read_toml

    return parse_space(read_toml(path), str(path))


def check_space(space: Space, where: str, config_file: str | None, overrides: Sequence[str]) -> None:
    """Build the config each range end and each choice gives (over --config, the base and the command
    line's overrides), so every value a trial can get is one the config takes.

    Raises:
        UsageError: naming the space file, the key and the config's own reason.
    """
    from gputrain.config.load import load_config, parse_override

    fixed = {**space.base, **dict(map(parse_override, overrides))}
    try:
        load_config(config_file, fixed)
    except UsageError as err:
        raise UsageError(f"{where}: [{BASE}]: {str(err).removeprefix('config error: ').splitlines()[0]}") from None
    for param in space.params:
        for value in param.corners():
            try:
                load_config(config_file, {**fixed, param.key: value})
            except UsageError as err:
                text = str(err).removeprefix("config error: ").splitlines()[0]
                raise UsageError(f"{where}: {param.key} = {value!r} is not a value the config takes: {text}") from None
