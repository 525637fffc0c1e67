"""GPT size presets, and the context-length rule that ties `data.seq_len` to the model.

Kept apart from the model code so the config can check sizes without importing the models.
"""

from __future__ import annotations

from typing import Any, Literal

from gputrain.errors import ConfigError

GPTPreset = Literal["tiny", "gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1.5b"]

GPT_PRESETS: dict[str, dict[str, int]] = {
    # tiny: for tests and smoke runs on a CPU
    "tiny": {"n_layer": 2, "n_head": 2, "d_model": 64, "seq_len": 128},
    # the four published GPT-2 sizes (Radford et al. 2019; nanoGPT's table)
    "gpt2-124m": {"n_layer": 12, "n_head": 12, "d_model": 768, "seq_len": 1024},
    "gpt2-350m": {"n_layer": 24, "n_head": 16, "d_model": 1024, "seq_len": 1024},
    "gpt2-774m": {"n_layer": 36, "n_head": 20, "d_model": 1280, "seq_len": 1024},
    "gpt2-1.5b": {"n_layer": 48, "n_head": 25, "d_model": 1600, "seq_len": 1024},
}
# Without a preset: nanoGPT's character-level Shakespeare model; the context is the data's seq_len.
GPT_CUSTOM_DEFAULTS: dict[str, int] = {"n_layer": 6, "n_head": 6, "d_model": 384}


def gpt_size(model: Any, name: str) -> int | None:
    """The effective `model.<name>`: the explicit value, else the preset's, else the custom default.

    `seq_len` is None when neither the config nor the preset gives one (the data decides).
    """
    explicit = getattr(model, name)
    if explicit is not None:
        return explicit
    if model.preset is not None:
        return GPT_PRESETS[model.preset].get(name)
    return GPT_CUSTOM_DEFAULTS.get(name)


def check_gpt_context(model: Any, data_seq_len: int) -> None:
    """`data.seq_len` must fit in the model's context (learned positions stop there).

    Raises:
        ConfigError: naming data.seq_len and model.seq_len.
    """
    context = gpt_size(model, "seq_len")
    if context is not None and data_seq_len > context:
        source = "model.seq_len" if model.seq_len is not None else f"model.preset={model.preset}'s context"
        raise ConfigError(
            "data.seq_len",
            f"is longer than the model's context ({source} = {context})",
            data_seq_len,
            hint=f"use data.seq_len <= {context}, or raise model.seq_len",
        )
