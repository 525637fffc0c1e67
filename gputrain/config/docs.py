"""Field documentation, read from the docstrings under each field in `schema.py`."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
from typing import Any

from gputrain.config import schema
from gputrain.config.limits import LIMITS
from gputrain.config.load import _type_name
from gputrain.config.schema import SECTIONS


@functools.cache
def field_docs() -> dict[str, str]:
    """`section.key` -> the docstring written under that field."""
    tree = ast.parse(inspect.getsource(schema))
    class_to_section = {cls.__name__: name for name, cls in SECTIONS.items()}
    docs: dict[str, str] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or node.name not in class_to_section:
            continue
        body = node.body
        for stmt, nxt in itertools.pairwise(body):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[f"{class_to_section[node.name]}.{stmt.target.id}"] = " ".join(nxt.value.value.split())
    return docs


def describe_fields() -> list[dict[str, Any]]:
    """One row per field: key, type, default, range and meaning (for `config show` and `train --help`)."""
    import typing

    docs = field_docs()
    rows = []
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            key = f"{section}.{f.name}"
            type_name = _type_name(hints[f.name])
            limit = LIMITS.get(key)
            rows.append(
                {
                    "key": key,
                    "type": type_name,
                    "default": default,
                    "range": limit.describe("integer" in type_name) if limit else None,
                    "doc": docs.get(key, ""),
                }
            )
    return rows


RL_SECTION = "rl"
"""The section only `gputrain rl` reads: the other run commands leave it out of their help."""


def fields_help_text(omit: tuple[str, ...] = ()) -> str:
    """Plain-text listing of every field, grouped by section, less the sections in `omit` (named
    in one line at the end, with the command whose help lists them)."""
    lines = ["config keys (override any as section.key=value):"]
    current = ""
    for row in describe_fields():
        section = row["key"].split(".")[0]
        if section in omit:
            continue
        if section != current:
            lines.append(f"\n  [{section}]")
            current = section
        default = "unset" if row["default"] is None else repr(row["default"])
        in_range = f", range {row['range']}" if row["range"] else ""
        lines.append(f"    {row['key']:<34} default {default}{in_range}")
        lines.append(f"        {row['doc']}")
    if RL_SECTION in omit:
        lines.append(f"\n  [{RL_SECTION}] keys are for reinforcement learning: gputrain rl --help lists them")
    return "\n".join(lines)


__all__ = ["RL_SECTION", "describe_fields", "field_docs", "fields_help_text"]
