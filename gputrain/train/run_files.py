"""The run directory: where it is, and the small files written into it."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

from gputrain.config import Config, config_to_toml


def default_run_dir(model_name: str, data_name: str) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{model_name}-{data_name}-{stamp}"


def write_text(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)


def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def write_run_files(run_dir: Path, config: Config) -> None:
    """The files a run directory holds from its start: the resolved config (loadable with
    --config) and the doctor's facts about this machine."""
    from gputrain.env import collect_env  # the doctor's modules: only needed once a run starts

    run_dir.mkdir(parents=True, exist_ok=True)
    write_text(run_dir / "config.toml", config_to_toml(config))
    write_json(run_dir / "env.json", collect_env().to_dict())
