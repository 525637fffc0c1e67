"""`gputrain config show`: every field with its resolved value, default and meaning."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["show"], help="show: print the fields")
    parser.add_argument("--config", metavar="FILE.toml", help="TOML config file to resolve")
    parser.add_argument("--toml", action="store_true", help="print the resolved config as TOML only")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from gputrain.config import config_to_dict, config_to_toml, load_config
    from gputrain.config.docs import describe_fields

    config = load_config(args.config, args.overrides)
    console = Console(highlight=False)
    if args.toml:
        print(config_to_toml(config), end="")
        return 0
    values = config_to_dict(config)
    table = Table(show_header=True, header_style="bold", show_lines=False)
    for column in ("key", "value", "default", "meaning"):
        table.add_column(column, overflow="fold")
    for row in describe_fields():
        section, key = row["key"].split(".")
        value = values[section][key]
        shown = "unset" if value is None else repr(value)
        default = "unset" if row["default"] is None else repr(row["default"])
        table.add_row(row["key"], shown if value == row["default"] else f"[bold]{shown}[/]", default, row["doc"])
    console.print(table)
    return 0
