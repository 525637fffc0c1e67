"""The files and folders a config names, checked before anything heavy is imported.

`gputrain train` runs `check_config_paths` right after loading the config, before torch loads, so a
mistyped path answers in a fraction of a second; the data sources, the weights loader and the
checkpointer call the same functions, so the message is the same whichever meets it first.
Only existence is checked here: what a file holds is read (and checked) by its loader.
"""

from __future__ import annotations

import stat
from pathlib import Path

from gputrain.config.schema import CheckpointConfig, Config, DataConfig, ModelConfig
from gputrain.errors import ConfigError, DataError
from gputrain.run.layout import checkpoints_folder, is_checkpoint_dir

FILE_SOURCES = ("csv", "text", "instructions", "text_classes")
"""Data sources whose data.path is one file."""
FOLDER_SOURCES = ("mnist", "image_folder")
"""Data sources whose data.path is a folder."""
TOKEN_FILE_HINT = "no such token file (flat uint16 ids, e.g. nanoGPT's prepare.py writes train.bin and val.bin)"


def kind_of(path: Path) -> str | None:
    """What `path` is ("a directory", "a regular file", "a FIFO (named pipe)", "a character device",
    ...), links followed; None where nothing is there."""
    try:
        mode = path.stat().st_mode
    except (OSError, ValueError):  # missing, a name too long, a NUL byte
        return None
    return kind_of_mode(mode)


def kind_of_mode(mode: int) -> str:
    """What a file of stat mode `mode` is, in kind_of's words."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "neither a file nor a directory"


def not_a_file(path: Path, what: str = "no such file") -> str:
    """Why `path` cannot be read as a file: `what` where nothing is there, else what it is."""
    kind = kind_of(path)
    return f"{what}: {path}" if kind is None else f"{path} is {kind}, not a regular file"


def not_a_token_file(path: Path) -> str:
    """Why `path` cannot be read as a token file: what one is where nothing is there, else what it is."""
    return not_a_file(path, TOKEN_FILE_HINT) if path.exists() else f"{path}: {TOKEN_FILE_HINT}"


def check_data_path(config: DataConfig) -> None:
    """data.path (and data.val_path) of the built-in sources that read files name a file or a folder
    as the source reads: a regular file (not a directory, a device or a FIFO, whose reading would
    never end) or a folder.

    Raises:
        DataError: naming the path and what is (or is not) there.
    """
    check_tokenizer_path(config.tokenizer)
    if config.path is None:
        return  # the source says what it needs (a source without files needs none)
    for field, given in (("data.path", config.path), ("data.val_path", config.val_path)):
        if given is not None and not given.strip():
            raise ConfigError(field, "is empty; give the path of the data (or leave it unset)", given)
    path = Path(config.path)
    if config.name in FILE_SOURCES and not path.is_file():
        raise DataError(f"data.path: {not_a_file(path)}" + _one_file(config.name, path))
    if config.name in FOLDER_SOURCES and not path.is_dir():
        kind = kind_of(path)
        raise DataError(
            f"data.path: no such folder: {path}"
            if kind is None
            else f"data.path: {path} is {kind}, not a folder; data.name={config.name} reads a folder"
        )
    if config.name == "tokens":
        if not path.is_dir() and not path.is_file():
            raise DataError(not_a_token_file(path))
        if config.val_path is not None and not Path(config.val_path).is_file():
            raise DataError(not_a_token_file(Path(config.val_path)))


def check_tokenizer_path(given: str | None) -> None:
    """data.tokenizer names something that is there (whether it is a tokenizer, text/tokenizer.py says).

    Raises:
        ConfigError: naming data.tokenizer.
    """
    if given is None:
        return
    if not given.strip():
        raise ConfigError("data.tokenizer", "is empty; give a tokenizer's path (or leave it unset)", given)
    if kind_of(Path(given).expanduser()) is None:
        raise ConfigError(
            "data.tokenizer",
            "no such file or directory; give a tokenizer.json, a model directory holding one, or a .tiktoken file",
            given,
        )


def _one_file(source: str, path: Path) -> str:
    return f"; data.name={source} reads one file" if path.is_dir() else ""


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


RESUME_FORMS = (
    "use auto, never, a checkpoint (runs/NAME/checkpoints/step-100), or a run directory or its checkpoints "
    "folder (its latest checkpoint)"
)


def check_resume_setting(config: CheckpointConfig) -> None:
    """checkpoint.resume names auto, never, a checkpoint directory, or a run directory or checkpoints
    folder that holds checkpoints (its latest is meant).

    Raises:
        ConfigError: naming checkpoint.resume and what the path is.
    """
    resume = config.resume
    if resume in ("auto", "never"):
        return
    if not resume.strip():
        raise ConfigError("checkpoint.resume", f"is empty; {RESUME_FORMS}", resume)
    path = Path(resume)
    if not path.is_dir():
        kind = kind_of(path)
        problem = "no such checkpoint directory" if kind is None else f"is {kind}, not a checkpoint directory"
        raise ConfigError("checkpoint.resume", f"{problem}; {RESUME_FORMS}", resume)
    if not is_checkpoint_dir(path) and checkpoints_folder(path) is None:
        raise ConfigError(
            "checkpoint.resume",
            "not a checkpoint: the folder has no COMMITTED marker or manifest.json, no step-N checkpoints and "
            f"no checkpoints/ folder with any; {RESUME_FORMS}",
            resume,
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
