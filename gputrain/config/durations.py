"""Durations in the config (`train.max_time`): seconds as a number, or a number with a unit.

"45s", "90m", "2h", "1.5d", "1h30m" (units in falling order, each once) or 5400 (seconds) all say
how long; anything else ("2 hours", "-1", "0", "1e999") is refused, naming the field. The value is
kept as written in the config (config.toml round-trips it); `duration_seconds` reads it.
"""

from __future__ import annotations

import math
import re

from gputrain.config.limits import DURATION_FORMS as FORMS
from gputrain.config.limits import DURATION_MAX_S as MAX_S
from gputrain.config.limits import shown_value
from gputrain.errors import ConfigError

_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_PART = r"(?:(\d+(?:\.\d+)?)d)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?"
_FORM = re.compile(_PART)


def duration_seconds(value: float | str, field: str) -> float:
    """The seconds `value` says (a number of seconds, or text of the forms above).

    Raises:
        ConfigError: naming `field`: not a duration, not above 0, or beyond a year.
    """
    seconds = _seconds(value)
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(field, f"must be {FORMS}", shown_value(value))
    if seconds > MAX_S:
        raise ConfigError(field, f"must be at most a year ({int(MAX_S)} s)", shown_value(value))
    return seconds


def _seconds(value: float | str) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    text = value.strip().lower()
    try:  # a plain number in text ("5400") is seconds, as a number is
        return float(text) if re.fullmatch(r"\d+(?:\.\d+)?", text) else _with_units(text)
    except OverflowError:
        return None


def _with_units(text: str) -> float | None:
    match = _FORM.fullmatch(text)
    if not text or match is None:
        return None
    return sum(float(part) * unit for part, unit in zip(match.groups(), _UNITS.values(), strict=True) if part)


__all__ = ["FORMS", "MAX_S", "duration_seconds"]
