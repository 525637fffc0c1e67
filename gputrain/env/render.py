"""Show the doctor's verdict: a plain-text table for people, a JSON document for tools."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence

from gputrain.env.checks import Check
from gputrain.env.facts import EnvReport

__all__ = ["render_json", "render_table"]

# Plain words rather than colours: the output is read in CI logs and pasted into issues.
_MARK = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}


def render_table(checks: Sequence[Check], *, width: int = 100) -> str:
    """One row per check (status, name, detail) with the fix indented below non-ok rows."""
    name_w = max((len(c.name) for c in checks), default=4)
    indent = " " * (4 + 2 + name_w + 2)
    lines = []
    for c in checks:
        head = f"{_MARK[c.status]}  {c.name:<{name_w}}  "
        lines.extend(
            textwrap.wrap(c.detail, width, initial_indent=head, subsequent_indent=indent, break_on_hyphens=False)
            or [head]
        )
        if c.fix and c.status != "ok":
            lines.extend(
                textwrap.wrap(
                    c.fix,
                    width,
                    initial_indent=indent + "fix: ",
                    subsequent_indent=indent + "     ",
                    break_on_hyphens=False,
                )
            )
    fails = sum(c.status == "fail" for c in checks)
    warns = sum(c.status == "warn" for c in checks)
    if any(c.name == "cpu training" for c in checks):
        verdict = "CPU training works; this machine has no GPU" if fails == 0 else "NOT ready: fix the FAIL rows"
    else:
        verdict = (
            "GPU training is possible" if fails == 0 else "GPU training is NOT possible until the FAIL rows are fixed"
        )
    lines.append("")
    lines.append(f"{verdict} ({fails} fail, {warns} warn, {len(checks) - fails - warns} ok)")
    return "\n".join(lines)


def render_json(facts: EnvReport, checks: Sequence[Check]) -> str:
    """`{"facts": {...}, "checks": [{"name", "status", "detail", "fix"}]}`."""
    return json.dumps({"facts": facts.to_dict(), "checks": [c.to_dict() for c in checks]}, indent=2)
