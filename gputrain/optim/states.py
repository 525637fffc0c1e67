"""How much state each optimizer keeps per parameter: what the memory estimates count."""

from __future__ import annotations

_STATES = {"adam": 2, "adamw": 2, "nadam": 2, "adamax": 2, "adadelta": 2, "adagrad": 1, "rmsprop": 1, "sgd": 0}
"""Tensors the size of a parameter: Adam's two moments, Adagrad's sum of squares, RMSprop's mean square."""


def optimizer_states_per_param(name: str, momentum: float = 0.0) -> int:
    """fp32 tensors of optimizer state per parameter (momentum adds SGD's and RMSprop's buffer)."""
    extra = 1 if name in ("sgd", "rmsprop") and momentum > 0 else 0
    return _STATES.get(name, 2) + extra
