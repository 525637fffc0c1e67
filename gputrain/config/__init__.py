"""Config: schema (dataclasses), loading (TOML + overrides), validation with suggestions."""

from gputrain.config.load import (
    config_to_dict,
    config_to_toml,
    load_config,
    parse_override,
)
from gputrain.config.schema import (
    CheckpointConfig,
    Config,
    DataConfig,
    EvalConfig,
    LogConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    TrainConfig,
)
from gputrain.config.validate import resolve_grad_accum

__all__ = [
    "CheckpointConfig",
    "Config",
    "DataConfig",
    "EvalConfig",
    "LogConfig",
    "ModelConfig",
    "OptimConfig",
    "ParallelConfig",
    "TrainConfig",
    "config_to_dict",
    "config_to_toml",
    "load_config",
    "parse_override",
    "resolve_grad_accum",
]
