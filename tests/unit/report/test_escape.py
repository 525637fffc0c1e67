"""escape.py, per place a value lands: element text, a quoted attribute (double or single), inline
SVG's text, a number attribute, a <script>'s JSON and a colour. Each hostile string is parsed back
with an HTML parser: it must come back as the same characters, and as no tag or attribute of its
own. The page's builders (table, facts, the lr-find line) go through these for every value."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
from html.parser import HTMLParser

import pytest

from gputrain.report.escape import css_colour, data_number, esc, script_json
from gputrain.report.page import SCRIPT, Cell, facts, num, page, shown, table

HOSTILE = [
    "<script>alert(1)</script>",
    '"><img src=x onerror=alert(1)>',
    "' onmouseover='alert(1)' x='",
    "</script><script>alert(1)</script>",
    "</title><svg><foreignObject><img src=x onerror=alert(1)></foreignObject></svg>",
    "&lt;b&gt; &amp; &#60; &#x3c;",
    "--><!--",
    "javascript:alert(1)",
    "\u2028\u2029\x00\x1b tab\there é ∑ 😀",
    "plain text",
]


class Parsed(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))

    def handle_data(self, data: str) -> None:
        self.text += data


def parse(markup: str) -> Parsed:
    parsed = Parsed()
    parsed.feed(markup)
    parsed.close()
    return parsed


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize("element", ["p", "title", "td", "pre"])
def test_element_text_comes_back_as_the_same_characters_and_no_tag(value, element):
    parsed = parse(f"<{element}>{esc(value)}</{element}>")
    assert [tag for tag, _ in parsed.tags] == [element]
    assert parsed.text == value


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize("quote", ['"', "'"])
def test_a_quoted_attribute_holds_the_value_and_nothing_else(value, quote):
    parsed = parse(f"<span title={quote}{esc(value)}{quote} class={quote}k{quote}>x</span>")
    assert parsed.tags == [("span", [("title", value), ("class", "k")])]


@pytest.mark.parametrize("value", HOSTILE)
def test_inline_svg_text_and_attributes(value):
    parsed = parse(f'<svg><text data-name="{esc(value)}">{esc(value)}</text></svg>')
    assert parsed.tags == [("svg", []), ("text", [("data-name", value)])]
    assert parsed.text == value


def test_escaping_is_not_done_twice_and_takes_any_value():
    assert esc("&amp;") == "&amp;amp;"  # the characters the file holds, not what they would decode to
    assert esc(None) == "None" and esc(1.5) == "1.5"
    assert esc("<>&\"'") == "&lt;&gt;&amp;&quot;&#x27;"


@pytest.mark.parametrize(
    ("value", "written"),
    [
        (1.5, "1.5"),
        (3, "3.0"),
        (-0.0, "-0.0"),
        (True, ""),
        ("1e3", ""),
        ('"><img src=x>', ""),
        (None, ""),
        (math.nan, ""),
        (math.inf, ""),
        (10**400, ""),
        ([1], ""),
    ],
)
def test_a_number_attribute_holds_a_number_or_nothing(value, written):
    assert data_number(value) == written


@pytest.mark.parametrize("value", HOSTILE)
def test_json_in_a_script_cannot_end_it_and_reads_back(value):
    record = {"name": value, value: [value, 1.5, None]}
    text = script_json(record)
    assert text.isascii() and not re.search(r"[<>&]", text)
    assert json.loads(text) == record
    parsed = parse(f"<script>var x = {text};</script><p>after</p>")
    assert [tag for tag, _ in parsed.tags] == ["script", "p"]  # the script element ended where it was meant to


def test_json_in_a_script_writes_what_json_cannot_hold_as_null():
    assert json.loads(script_json({"a": math.nan, "b": [math.inf, -math.inf], 3: 1})) == {
        "a": None,
        "b": [None, None],
        "3": 1,
    }


@pytest.mark.parametrize("colour", ["#fff", "#1f77b4", "#ABCDEF"])
def test_a_colour_is_a_hex_colour(colour):
    assert css_colour(colour) == colour


@pytest.mark.parametrize("colour", ["red", "#12345", "#1f77b4;background:url(x)", '#fff"', "", "expression(1)"])
def test_anything_else_in_a_style_is_refused(colour):
    with pytest.raises(ValueError, match="not a colour"):
        css_colour(colour)


@pytest.mark.parametrize("value", HOSTILE)
def test_text_where_a_number_belongs_shows_as_text(value):
    assert shown(value, ".2e") == value and shown(0.000123, ".2e") == "1.23e-04"
    assert num(value).text == value and num(value).value is None  # type: ignore[arg-type]
    markup = table(["h"], [[num(value), Cell("x", value)]])  # type: ignore[arg-type]
    parsed = parse(markup)
    assert "data-value" not in markup  # a number attribute only holds numbers
    assert {tag for tag, _ in parsed.tags} == {"div", "table", "thead", "tr", "th", "tbody", "td"}
    assert value in parsed.text


@pytest.mark.parametrize("value", HOSTILE)
def test_facts_and_the_page_title_escape(value):
    parsed = parse(page(value, facts([(value, value)]), [], esc(value)))
    tags = {tag for tag, _ in parsed.tags}
    assert tags == {
        "html",
        "head",
        "meta",
        "title",
        "style",
        "script",
        "body",
        "nav",
        "main",
        "div",
        "b",
        "span",
        "footer",
    }


def test_the_policy_runs_only_the_pages_own_script():
    document = page("t", "", [], "")
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', document)
    assert policy is not None
    digest = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
    rules = dict(r.strip().split(" ", 1) for r in policy.group(1).replace("&#x27;", "'").split(";"))
    assert rules["default-src"] == "'none'"  # nothing fetched: no image, frame, font or connection
    assert rules["script-src"] == f"'sha256-{digest}'"  # no inline handler, no other script
    assert f"<script>{SCRIPT}</script>" in document


SAFE = {"esc", "css_colour", "data_number", "script_json"}
READS = re.compile(
    r"\.get\(|\b(run|runs|record|summary|config|env|profile|cell|op|f|metrics|name|title|label|text|value|note|"
    r"notes|path|status|task|split|metric|key|k|v)\b"
)
"""What an expression that reads a run's values looks like: a lookup, or a name such values go by."""
MARKUP = {
    ("build.py", "len(runs)"),
    ("overview.py", "badge(run.status)"),
    ("page.py", "note"),
    ("page.py", "value"),
    ("page.py", "''.join((figure(f, x_name) for f in figures))"),
    ("svg.py", "''.join(text)"),
}
"""Places that look like a read value but are a count or markup the report built (and escaped) itself."""


def test_no_markup_string_puts_a_value_read_from_a_run_in_raw():
    """A guard for code written later: in an f-string that writes markup, every value goes through
    escape.py or is formatted as a number (a format spec refuses text); what only looks like a read
    value is listed in MARKUP. It finds the places the report once put values in raw (the lr-find
    line's record.get(...), a cell's value!r, a colour looked up by a key read from a file)."""
    import ast
    from pathlib import Path

    import gputrain.report

    raw = []
    for source in sorted(Path(gputrain.report.__file__).parent.glob("*.py")):
        if source.name == "rundir.py":  # reads the files, writes no markup (its "<name>" is in messages)
            continue
        for node in ast.walk(ast.parse(source.read_text())):
            if not isinstance(node, ast.JoinedStr):
                continue
            literal = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
            if not re.search(r"<|=\"|='", literal):
                continue
            for part in node.values:
                if not isinstance(part, ast.FormattedValue):
                    continue
                call = part.value
                if part.conversion == -1 and (
                    part.format_spec is not None
                    or (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in SAFE)
                ):
                    continue
                expression = ast.unparse(call)
                if (part.conversion != -1 or READS.search(expression)) and (source.name, expression) not in MARKUP:
                    raw.append(f"{source.name}:{node.lineno}: {{{expression}}}")
    assert raw == [], "escape these with gputrain.report.escape (or list markup the report built in MARKUP)"
