"""Build a `Config` from a TOML file, a dict and `section.key=value` overrides, checking types.

Every problem becomes a `ConfigError` naming the field, so the CLI can print one short line.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import sys
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from gputrain.config.schema import MOVED, SECTIONS, Config
from gputrain.config.validate import validate_config
from gputrain.errors import ConfigError, UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib  # type: ignore[import-not-found]


def _did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else None


def _type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if annotation is bool:
        return "true or false"
    if annotation is int:
        return "an integer"
    if annotation is float:
        return "a number"
    if annotation is str:
        return "a string"
    if annotation is type(None):
        return "unset"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(annotation))
    if origin is list:
        return f"a list of {_type_name(get_args(annotation)[0]).removeprefix('a ').removeprefix('an ')}s"
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(annotation) if a is not type(None))
    return str(annotation)


class _Mismatch(Exception):
    pass


def _coerce(value: Any, annotation: Any) -> Any:
    """Return `value` as `annotation`, or raise _Mismatch. bool is never an int here."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        for option in get_args(annotation):
            try:
                return _coerce(value, option)
            except _Mismatch:
                continue
        raise _Mismatch
    if origin is Literal:
        if value in get_args(annotation) and not isinstance(value, bool):
            return value
        raise _Mismatch
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        (item_type,) = get_args(annotation)
        return [_coerce(v, item_type) for v in value]
    if annotation is type(None):
        if value is None:
            return None
        raise _Mismatch
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Mismatch
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:  # an integer beyond float's range: as large as inf, refused as such
                return math.inf if value > 0 else -math.inf
        raise _Mismatch
    if annotation is str:
        if isinstance(value, str):
            return value
        raise _Mismatch
    raise TypeError(f"unsupported config annotation {annotation!r}")


def _build_section(section: str, cls: type, values: Mapping[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if f"{section}.{key}" in MOVED:
            new = MOVED[f"{section}.{key}"]
            raise ConfigError(f"{section}.{key}", f"moved to {new}", hint=f"did you mean {new!r}?")
        if key not in hints:
            hint = _did_you_mean(key, names)
            raise ConfigError(
                f"{section}.{key}", "unknown key", hint=(hint or f"keys of [{section}]: {', '.join(names)}")
            )
        annotation = hints[key]
        try:
            kwargs[key] = _coerce(value, annotation)
        except _Mismatch:
            choices = get_origin(annotation) is Literal
            raise ConfigError(
                f"{section}.{key}",
                ("unknown choice; choose from " if choices else "expected ")
                + (", ".join(map(str, get_args(annotation))) if choices else _type_name(annotation)),
                value,
                hint=_did_you_mean(str(value), map(str, get_args(annotation))) if choices else None,
            ) from None
    return cls(**kwargs)


def parse_override(text: str) -> tuple[str, Any]:
    """`section.key=value` -> (dotted key, value parsed as a TOML literal, else kept as a string)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or "." not in key or not key.replace(".", "").replace("_", "").isalnum():
        raise UsageError(f"override {text!r} is not of the form section.key=value (e.g. train.epochs=5)")
    try:
        document = tomllib.loads(f"v = {raw}")
    except tomllib.TOMLDecodeError:
        return key, raw
    except RecursionError:
        raise ConfigError(key, "cannot be read: lists nested too deeply") from None
    except ValueError:  # valid TOML that Python cannot hold: an integer of more than 4300 digits
        raise ConfigError(key, "cannot be read: a number too long to be a config value") from None
    if len(document) != 1:  # a line break let more TOML in: `train.epochs=3\n[optim]\nlr = 5`
        raise ConfigError(key, "is more than one value: an override is one line", raw[:80] + "…" * (len(raw) > 80))
    return key, document["v"]


def _nest(flat: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    nested: dict[str, dict[str, Any]] = {}
    for dotted, value in flat.items():
        section, _, key = dotted.partition(".")
        if isinstance(value, Mapping) and not key:
            nested.setdefault(section, {}).update(value)
        elif not key or "." in key:
            raise ConfigError(dotted, "config keys are section.key, e.g. train.epochs")
        else:
            nested.setdefault(section, {})[key] = value
    return nested


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read a config file; a missing file or broken TOML names the file (and the line)."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"config file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"config file {path} is not UTF-8 text") from None
    except OSError as err:
        raise UsageError(f"config file {path} cannot be read: {err.strerror or err}") from None
    return parse_toml(text, path)


def parse_toml(text: str, path: str | Path) -> dict[str, Any]:
    """A config file's text (read from `path`, named in the messages) as TOML.

    Raises:
        UsageError: naming the file, and the line where it is not TOML.
    """
    try:
        return tomllib.loads(text.removeprefix("\ufeff"))  # a byte-order mark is no TOML
    except tomllib.TOMLDecodeError as err:
        raise UsageError(f"config file {path} is not valid TOML: {err}") from None
    except RecursionError:
        raise UsageError(f"config file {path} cannot be read: lists nested too deeply") from None
    except ValueError:  # valid TOML that Python cannot hold: an integer of more than 4300 digits
        raise UsageError(f"config file {path} cannot be read: a number too long to be a config value") from None


Defaults = Callable[[Config], Mapping[str, Any]]
"""A command's own defaults for shared fields, `section.key` -> value, decided from the config
built without them (e.g. `gputrain rl`'s CleanRL values, which depend on rl.env)."""


def build_config(
    base: Mapping[str, Any] | None = None, overrides: Mapping[str, Any] | None = None, defaults: Defaults | None = None
) -> Config:
    """Merge a nested mapping (as from TOML) with dotted overrides and validate the result;
    `defaults` fill the keys that neither sets."""
    merged: dict[str, dict[str, Any]] = {}
    for source in (base or {}, _nest(overrides or {})):
        for section, values in source.items():
            if section not in SECTIONS:
                hint = _did_you_mean(section, SECTIONS)
                raise ConfigError(section, "unknown section", hint=hint or f"sections: {', '.join(SECTIONS)}")
            if not isinstance(values, Mapping):
                raise ConfigError(section, "must be a table of keys, e.g. [train] epochs = 5")
            merged.setdefault(section, {}).update(values)
    config = _sections(merged)
    unset = {
        dotted: value
        for dotted, value in (defaults(config) if defaults is not None else {}).items()
        if dotted.partition(".")[2] not in merged.get(dotted.partition(".")[0], {})
    }
    if unset:
        for section, values in _nest(unset).items():
            merged.setdefault(section, {}).update(values)
        config = _sections(merged)
    validate_config(config)
    return config


def _sections(merged: Mapping[str, Mapping[str, Any]]) -> Config:
    return Config(**{name: _build_section(name, cls, merged.get(name, {})) for name, cls in SECTIONS.items()})


def load_config(
    source: Config | Mapping[str, Any] | str | Path | None = None,
    overrides: Iterable[str] | Mapping[str, Any] = (),
    defaults: Defaults | None = None,
) -> Config:
    """Accept a Config, a mapping (nested or dotted keys), or a TOML path, plus overrides;
    `defaults` fill what neither sets (a Config sets every key)."""
    override_map = dict(overrides) if isinstance(overrides, Mapping) else dict(map(parse_override, overrides))
    moved_from: dict[str, str] = {}
    if isinstance(source, Config):
        base: Mapping[str, Any] = config_to_dict(source)
    elif isinstance(source, (str, Path)):
        base, moved_from = _moved_keys_read(read_toml(source), defaults is not None)
    elif source is None:
        base = {}
    else:
        base = _nest(source) if any("." in k for k in source) else dict(source)
    try:
        return build_config(base, override_map, defaults)
    except ConfigError as err:
        old = moved_from.get(err.field)
        if old is None or err.field in override_map:
            raise
        # the value came from the file's old key: named as the file holds it
        raise ConfigError(f"{old} (now {err.field})", err.problem, err.value) from None


def _moved_keys_read(base: dict[str, Any], for_rl: bool) -> tuple[dict[str, Any], dict[str, str]]:
    """A config file written before some keys moved (MOVED: `rl.learning_rate` became `optim.lr`, ...)
    read as it meant. Every config.toml that gputrain wrote then holds them (each run's whole config),
    so a file is never refused for them, though a command-line override or a dict naming one is (with
    the new name). The old keys were `gputrain rl`'s alone: for rl (`for_rl`: the command brings its
    own defaults for the shared keys) each value moves to its new key, over the file's value there,
    which rl never read ("auto": the new key is left to rl's defaults); for any other command they
    said nothing and are dropped. Returns the sections, and {new key: old key} of each value moved
    (an error in one names the key the file holds)."""

    def holds(dotted: str) -> bool:
        section, _, key = dotted.partition(".")
        values = base.get(section)
        return isinstance(values, Mapping) and key in values  # not a table: build_config names the section

    moved = {old: new for old, new in MOVED.items() if holds(old)}
    moved_from: dict[str, str] = {}
    if not moved:
        return base, moved_from
    out = {section: dict(values) if isinstance(values, Mapping) else values for section, values in base.items()}
    for old, new in moved.items():
        old_section, old_key = old.split(".")
        value = out[old_section].pop(old_key)
        if not for_rl:
            continue
        new_section, new_key = new.split(".")
        section = out.setdefault(new_section, {})
        if not isinstance(section, dict):
            continue  # not a table: build_config names the section's error
        if value == "auto":
            section.pop(new_key, None)
            continue
        section[new_key] = value
        moved_from[new] = old
    return out, moved_from


def config_to_dict(config: Config) -> dict[str, dict[str, Any]]:
    return {name: dataclasses.asdict(getattr(config, name)) for name in SECTIONS}


# TOML basic strings: a quote and a backslash are escaped, and so is every control character
# but tab (U+0000-U+001F, U+007F); C1 controls (U+0080-U+009F) are escaped too, to keep the file
# printable. Everything else is written as itself, in UTF-8.
_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _toml_char(ch: str) -> str:
    if ch in _TOML_ESCAPES:
        return _TOML_ESCAPES[ch]
    code = ord(ch)
    return f"\\u{code:04X}" if code < 0x20 or 0x7F <= code <= 0x9F else ch


def toml_value(value: Any) -> str:
    """`value` as a TOML literal that `tomllib` reads back equal (floats included, via repr)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)  # shortest round-trip form; inf and nan are TOML too: inf, -inf, nan
    if isinstance(value, str):
        return '"' + "".join(map(_toml_char, value)) + '"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(value)


def config_to_toml(config: Config) -> str:
    """The fully resolved config as TOML (unset fields appear as comments)."""
    lines: list[str] = []
    for section, values in config_to_dict(config).items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            lines.append(f"# {key} = (unset)" if value is None else f"{key} = {toml_value(value)}")
        lines.append("")
    return "\n".join(lines)
