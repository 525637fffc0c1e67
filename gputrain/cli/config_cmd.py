"""`gputrain config show`: every field with its resolved value, default and meaning."""

from __future__ import annotations

import argparse

from gputrain.errors import UsageError

USAGE = "gputrain config show [--config FILE.toml] [--toml] [section.key=value ...]"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=["show"], help="show: print the fields")
    parser.add_argument("--config", metavar="FILE.toml", help="TOML config file to resolve")
    parser.add_argument("--toml", action="store_true", help="print the resolved config as TOML only")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")


def _show(value: object) -> str:
    return "unset" if value is None else repr(value)


def run(args: argparse.Namespace) -> int:
    if args.action is None:
        raise UsageError(f"which action? usage: {USAGE}")
    from gputrain.config import config_to_dict, config_to_toml, load_config
    from gputrain.config.docs import describe_fields

    config = load_config(args.config, args.overrides)
    if args.toml:
        print(config_to_toml(config), end="")
        return 0
    from gputrain.data import available_data
    from gputrain.models import available_models

    choices = {"model.name": available_models(), "data.name": available_data()}
    values = config_to_dict(config)
    section_now = ""
    lines = []
    for row in describe_fields():
        section, key = row["key"].split(".")
        if section != section_now:
            lines.append(f"\n[{section}]")
            section_now = section
        value = values[section][key]
        changed = "" if value == row["default"] else f"   (default {_show(row['default'])})"
        lines.append(f"  {row['key']} = {_show(value)}{changed}")
        lines.append(f"      {row['doc']}")
        if row["range"]:
            lines.append(f"      range: {row['range']}")
        if row["key"] in choices:
            lines.append(f"      choices: {', '.join(choices[row['key']])}")
    print("\n".join(lines).lstrip("\n"))
    return 0
