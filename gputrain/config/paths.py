"""The files and folders a config names, checked before anything heavy is imported.

`gputrain train` runs `check_config_paths` right after loading the config, before torch loads, so a
mistyped path answers in a fraction of a second; the data sources, the weights loader and the
checkpointer call the same functions, so the message is the same whichever meets it first.
Only existence is checked here: what a file holds is read (and checked) by its loader.
"""

from __future__ import annotations

from pathlib import Path

from gputrain.config.schema import CheckpointConfig, Config, DataConfig, ModelConfig
from gputrain.errors import ConfigError, DataError

FILE_SOURCES = ("csv", "text")
"""Data sources whose data.path is one file."""
FOLDER_SOURCES = ("mnist", "image_folder")
"""Data sources whose data.path is a folder."""
TOKEN_FILE_HINT = "no such token file (flat uint16 ids, e.g. nanoGPT's prepare.py writes train.bin and val.bin)"


def check_data_path(config: DataConfig) -> None:
    """data.path (and data.val_path) of the built-in sources that read files exist.

    Raises:
        DataError: naming the missing file or folder.
    """
    if config.path is None:
        return  # the source says what it needs (a source without files needs none)
    path = Path(config.path)
    if config.name in FILE_SOURCES and not path.is_file():
        raise DataError(f"data.path: no such file: {path}")
    if config.name in FOLDER_SOURCES and not path.is_dir():
        raise DataError(f"data.path: no such folder: {path}")
    if config.name == "tokens":
        for given in (path, Path(config.val_path) if config.val_path is not None else None):
            if given is not None and not given.exists():
                raise DataError(f"{given}: {TOKEN_FILE_HINT}")


def check_weights_path(path: Path) -> None:
    """model.weights names a file.

    Raises:
        ConfigError: naming model.weights.
    """
    if not path.is_file():
        raise ConfigError("model.weights", "no such file", str(path))


def check_hf_config_path(path_text: str) -> None:
    """model.hf_config names a config.json, or a folder holding one.

    Raises:
        ConfigError: naming model.hf_config.
    """
    path = Path(path_text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError("model.hf_config", "is a directory without a config.json", path_text)
    elif not path.is_file():
        raise ConfigError("model.hf_config", "no such file or directory", path_text)


def check_resume_setting(config: CheckpointConfig) -> None:
    """checkpoint.resume names auto, never or an existing checkpoint directory.

    Raises:
        ConfigError: naming checkpoint.resume.
    """
    if config.resume not in ("auto", "never") and not Path(config.resume).is_dir():
        raise ConfigError(
            "checkpoint.resume",
            "no such checkpoint directory; use auto, never or a path like runs/NAME/checkpoints/step-100",
            config.resume,
        )


def check_model_paths(config: ModelConfig) -> None:
    if config.weights is not None:
        check_weights_path(Path(config.weights))
    if config.name == "hf" and config.hf_config:
        check_hf_config_path(config.hf_config)


def check_config_paths(config: Config) -> None:
    """Every path the config names, in the order a run would meet them: data, model, checkpoint.

    Raises:
        UsageError (DataError, ConfigError): naming the field or file.
    """
    check_data_path(config.data)
    check_model_paths(config.model)
    check_resume_setting(config.checkpoint)
