"""Model registry and families (mlp, cnn, ...)."""

from gputrain.models.registry import available_models, build_model, register_model

__all__ = ["available_models", "build_model", "register_model"]
