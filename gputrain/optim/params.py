"""What an optimizer factory is given (`Trainer(optimizer=factory)`): the parameters the step trains.

A factory is called once the model is parallelised (FSDP, TP, pipeline stages, fp8 conversion and a
meta-device model replace the parameters), with a `TrainParams`: a plain list of those parameters,
so `functools.partial(torch.optim.AdamW, lr=1e-3)` takes it as it is, that also carries each
parameter's name and the module, so parameter groups can be made by name or by shape:

    def adamw(params):
        head = [p for name, p in params.named() if name.startswith("head.")]
        rest = [p for name, p in params.named() if not name.startswith("head.")]
        return torch.optim.AdamW([{"params": rest}, {"params": head, "lr": 3e-3}], lr=1e-3)

`weight_decay_groups` makes the commonest grouping (no decay on biases and norm scales).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn

from gputrain.checkpoint.matching import canonical_name


class TrainParams(list[nn.Parameter]):
    """The parameters the training step updates (those with `requires_grad`), in the module's order,
    as a plain list; `names[i]` is the name of `self[i]` as the user's model names it (without the
    wrapper segments DDP, torch.compile, activation checkpointing or FSDP1 put in:
    `_orig_mod.`, `_checkpoint_wrapped_module.`, ...) and `module` the module that holds them
    (under pipeline parallelism, this rank's stage: names are the stage's)."""

    def __init__(self, named: Iterable[tuple[str, nn.Parameter]], module: nn.Module) -> None:
        pairs = list(named)
        super().__init__(param for _, param in pairs)
        self.names: list[str] = [name for name, _ in pairs]
        self.module = module

    def named(self) -> list[tuple[str, nn.Parameter]]:
        """(name, parameter) pairs, like `module.named_parameters()`."""
        return list(zip(self.names, self, strict=True))


def train_params(module: nn.Module) -> TrainParams:
    """The parameters of `module` the step trains, named as the user's model names them (a tied
    parameter once, under its first name)."""
    named = ((canonical_name(name), p) for name, p in module.named_parameters() if p.requires_grad)
    return TrainParams(named, module)


def weight_decay_groups(params: Iterable[nn.Parameter], weight_decay: float) -> list[dict[str, Any]]:
    """Two parameter groups: weights of 2 or more dimensions (matrices, embeddings, convolutions)
    decay by `weight_decay`; the rest (biases, norm scales) do not, as nanoGPT, Hugging Face and
    torchtitan do (what `optim.decay=matrices` does for the config's optimizer). A sharded (DTensor)
    parameter counts the dimensions of the whole tensor. Two groups always (one may be empty), so a
    checkpoint's layout does not depend on the model. E.g.
    `optimizer=lambda params: torch.optim.AdamW(weight_decay_groups(params, 0.1), lr=1e-3)`."""
    params = list(params)
    matrices = [p for p in params if p.dim() >= 2]
    vectors = [p for p in params if p.dim() < 2]
    return [{"params": matrices, "weight_decay": weight_decay}, {"params": vectors, "weight_decay": 0.0}]
