"""Every value that reaches report.html passes through here, escaped for the place it lands.

A report is a file people send each other, and everything a run directory holds (its name, the
fields of summary.json, env.json, lr_find.json and the profile, config.toml's keys and values,
metrics.jsonl's keys, error.log) is untrusted text there: a field holding `<script>` must show as
those characters, never run. So no report code puts a value into markup itself; it calls one of:

- `esc`: element text (HTML and inline SVG alike, <title> included) and attribute values. Every
  attribute the report writes is quoted, and `esc` escapes both quotes, so one function serves both.
- `data_number`: a number written into an attribute the page's script reads (`data-value`): the
  number's repr, or nothing when the value is not a finite number (a string where a number belongs).
- `script_json`: a value inside a <script> element, as JSON that cannot end the element or open a
  comment there (`<`, `>`, `&` and every non-ASCII character, the line terminators U+2028/U+2029
  among them, as \\u escapes). The page's own script holds no value today: what it needs it reads
  from attributes (`data-name`, `data-value`, `data-x`); a value put into a script goes through here.
- `css_colour`: a colour inside a style or presentation attribute: only `#rgb`/`#rrggbb`.

page.py adds a Content-Security-Policy that runs only the page's own script (by its hash) as a
second wall: a value ever put in unescaped still could not run a handler or fetch anything.
"""

from __future__ import annotations

import html
import json
import math
import re
from typing import Any

_COLOUR = re.compile(r"#(?:[0-9a-fA-F]{3}|[0-9a-fA-F]{6})")
_IN_SCRIPT = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"}


def esc(value: object) -> str:
    """`value` as text for an element's content or a quoted attribute's value: & < > " ' escaped."""
    return html.escape(str(value), quote=True)


def data_number(value: object) -> str:
    """A finite number as its repr (exact, and what JavaScript's Number() reads back); "" for
    anything else, a bool or a string included."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return ""
    try:
        number = float(value)
    except OverflowError:  # an integer past a float's range
        return ""
    return repr(number) if math.isfinite(number) else ""


def script_json(value: Any) -> str:
    """`value` as JSON to place between <script> and </script>: `</script>`, `<!--` and a line
    terminator inside a string cannot end the element or the statement. ASCII only: the page is
    written as ASCII with character references, which a script's text would not decode. NaN and
    Infinity are written as null (they are not JSON)."""
    text = json.dumps(_finite(value), ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return re.sub("[<>&]", lambda m: _IN_SCRIPT[m.group()], text)  # U+2028/9 are \u escapes already


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def css_colour(value: str) -> str:
    """`value` if it is a hex colour; a ValueError otherwise (the report's colours are its own
    constants: anything else reaching a style is a bug, not something to pass on)."""
    if not _COLOUR.fullmatch(value):
        raise ValueError(f"not a colour: {value!r}")
    return value
