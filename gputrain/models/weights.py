"""`model.weights`: a local file of weights loaded into the model once it is built.

Two formats, neither of which can run code when read: safetensors, and torch state dicts read with
`weights_only=True`. Files that hold a state dict under "state_dict" or "model" (Lightning, timm's
and torchvision's training scripts) and names with a "module." or "_orig_mod." prefix (DDP,
torch.compile) are read as the plain state dict they contain.

Every name must match the model's. The one difference allowed is the output layer's size (the
last layer with weights): fine-tuning ImageNet weights on 10 classes keeps the new, data-sized head.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gputrain.config.paths import check_weights_path
from gputrain.errors import ConfigError

log = logging.getLogger("gputrain")

_CONTAINER_KEYS = ("state_dict", "model")
_PREFIXES = ("module.", "_orig_mod.")


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file or a torch state dict, on the CPU.

    Raises:
        ConfigError: naming model.weights: no such file, or not a state dict of tensors.
    """
    check_weights_path(path)
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            loaded: Any = load_file(str(path), device="cpu")
        else:
            loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a damaged file, or one that would need code to unpickle
        raise ConfigError(
            "model.weights",
            f"cannot be read as safetensors or a torch state dict ({type(exc).__name__}: {str(exc)[:160]})",
            str(path),
        ) from exc
    for key in _CONTAINER_KEYS:
        if isinstance(loaded, Mapping) and isinstance(loaded.get(key), Mapping):
            loaded = loaded[key]
            break
    if not isinstance(loaded, Mapping) or not all(isinstance(t, torch.Tensor) for t in loaded.values()):
        raise ConfigError("model.weights", "holds no state dict (names mapped to tensors)", str(path))
    state = {str(name): tensor for name, tensor in loaded.items()}
    for prefix in _PREFIXES:
        if state and all(name.startswith(prefix) for name in state):
            state = {name.removeprefix(prefix): tensor for name, tensor in state.items()}
    return state


def _output_layer_names(model: nn.Module) -> set[str]:
    """The state-dict names of the last module with its own weight: the layer sized by the data's classes."""
    last = ""
    for name, module in model.named_modules():
        if isinstance(getattr(module, "weight", None), torch.Tensor):
            last = name
    prefix = f"{last}." if last else ""
    return {f"{prefix}{key}" for key in dict(model.get_submodule(last).named_parameters(recurse=False))}


def _listed(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" (and {len(names) - 3} more)" if len(names) > 3 else "")


@torch.no_grad()
def load_weights(model: nn.Module, path_text: str) -> None:
    """Copy the file's tensors into the model's parameters and buffers.

    Raises:
        ConfigError: naming model.weights: a name missing on either side, or a shape that differs
            outside the output layer.
    """
    path = Path(path_text).expanduser()
    state = read_state_dict(path)
    own = model.state_dict()
    # a tied tensor (a GPT's embedding and output layer) is saved once, under either name
    loaded_storage = {own[name].data_ptr() for name in state if name in own}
    missing = sorted(name for name in set(own) - set(state) if own[name].data_ptr() not in loaded_storage)
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        problem = "does not fit this model: " + "; ".join(
            part
            for part in (
                f"the model has {_listed(missing)}, which the file lacks" if missing else "",
                f"the file has {_listed(unexpected)}, which the model lacks" if unexpected else "",
            )
            if part
        )
        raise ConfigError("model.weights", problem, path_text, hint="is it the weights of this model.name?")
    resized = sorted(name for name in state if own[name].shape != state[name].shape)
    head = _output_layer_names(model)
    wrong = [name for name in resized if name not in head]
    if wrong:
        name = wrong[0]
        raise ConfigError(
            "model.weights",
            f"does not fit this model: {name} has shape {list(state[name].shape)} in the file and "
            f"{list(own[name].shape)} in the model",
            path_text,
            hint="is it the weights of this model.name, for images of this data's channels?",
        )
    for name, tensor in state.items():
        if name not in resized:
            own[name].copy_(tensor)
    if resized:
        log.info(
            "model.weights: %s left new, sized for this data's outputs (the file's: another size)", _listed(resized)
        )
