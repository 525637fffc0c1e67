"""gputrain: PyTorch-native training, fast on one GPU and scaled out on torch.distributed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gputrain import known_warnings

known_warnings.install()  # before transformers or torchao load: their known-harmless lines

__version__ = "0.1.0"
__all__ = ["EMA", "Callback", "Config", "StopOnMetric", "Trainer", "__version__"]

if TYPE_CHECKING:
    from gputrain.config import Config
    from gputrain.train.callbacks import Callback
    from gputrain.train.ema import EMA
    from gputrain.train.stop_on_metric import StopOnMetric
    from gputrain.train.trainer import Trainer


def __getattr__(name: str) -> Any:
    # Lazy so `import gputrain` (and `gputrain doctor`) stays cheap.
    if name == "Trainer":
        from gputrain.train.trainer import Trainer

        return Trainer
    if name == "Config":
        from gputrain.config import Config

        return Config
    if name == "Callback":
        from gputrain.train.callbacks import Callback

        return Callback
    if name == "EMA":
        from gputrain.train.ema import EMA

        return EMA
    if name == "StopOnMetric":
        from gputrain.train.stop_on_metric import StopOnMetric

        return StopOnMetric
    raise AttributeError(name)
