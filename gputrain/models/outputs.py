"""What a model returns, as the loss and the metrics read it."""

from __future__ import annotations

from typing import Any


def model_logits(outputs: Any) -> Any:
    """A model's outputs as losses and metrics read them: the tensor itself, or the `.logits` of a
    Hugging Face ModelOutput."""
    logits = getattr(outputs, "logits", None)
    return logits if logits is not None else outputs
