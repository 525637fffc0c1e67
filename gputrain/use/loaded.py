"""The small builder every `use` command starts from: a run directory → its config, its data (spec,
splits, preprocessing) and its model with the chosen weights loaded, in eval mode on a device.

Training's builder (train/build.py) makes a run's every part; inference needs these few, made with
the same functions (load_config, build_data, build_model, the checkpoint readers).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from gputrain.config import Config
from gputrain.config.schema import ModelConfig
from gputrain.data import DataBundle, build_data
from gputrain.data.spec import DataSpec
from gputrain.errors import ConfigError, UsageError
from gputrain.models import build_model
from gputrain.precision import resolve_precision
from gputrain.run.layout import TOKENIZER
from gputrain.run.tokenizer import read_run_tokenizer
from gputrain.text.for_run import tokenizer_for
from gputrain.text.tokenizer import Tokenizer
from gputrain.use.options import use_device
from gputrain.use.preprocess import Preprocessing, ServedModel, build_preprocessing
from gputrain.use.run_dir import WeightsSource, choose_weights, open_run, run_config
from gputrain.use.weights import load_weights


@dataclass(slots=True)
class LoadedRun:
    run_dir: Path
    config: Config
    """The run's config.toml with the command's data overrides."""
    data: DataBundle
    pre: Preprocessing
    model: nn.Module
    """The run's model with the chosen weights, in eval mode on `device`."""
    weights: WeightsSource
    device: torch.device
    precision: str
    """train.precision resolved for this device (fp32 where the run's cannot run here)."""
    tokenizer: Tokenizer | None = None
    """The tokenizer the run keeps (RUN/tokenizer/), else its data's or model's; None: ids only."""

    def served(self) -> ServedModel:
        """The model behind its preprocessing (raw samples in), in eval mode on `device`."""
        return ServedModel(self.model, self.pre).to(self.device).eval()


def data_overrides(overrides: Iterable[str]) -> list[str]:
    """The command line's `data.key=value` overrides; any other section is refused.

    Raises:
        UsageError: an override of another section, or of data.name.
    """
    found = list(overrides)
    for text in found:
        key = text.partition("=")[0].strip()
        if not key.startswith("data."):
            raise UsageError(
                f"{text!r}: only data overrides apply to a trained run (e.g. data.path=new.csv, "
                "data.max_eval_samples=1000); its model and training settings are the run's"
            )
        if key == "data.name":
            raise UsageError(f"{text!r}: data.name is the run's; new data must be of the same kind (data.path=...)")
    return found


def load_run(
    run_dir: str | Path, *, checkpoint: str = "final", device: str = "auto", overrides: Iterable[str] = ()
) -> LoadedRun:
    """Load the run at `run_dir` for inference.

    Args:
        checkpoint: final, best, last, or a path (see use/run_dir.py).
        device: auto, cpu, cuda, cuda:N or mps.
        overrides: data overrides (`data.max_eval_samples=100`), applied to the run's data config.

    Raises:
        UsageError: not a run directory, no such weights (naming those there are), a device this
            machine lacks, weights that are not this model's, a bad override, or the run's data can no
            longer be read.
    """
    path = open_run(run_dir)
    found = data_overrides(overrides)
    config = run_config(path, found)
    weights = choose_weights(path, checkpoint)  # before the data is read: the cheap checks first
    where = use_device(device)
    kept = read_run_tokenizer(path)
    if kept is not None and config.data.tokenizer is not None:
        # the run's copy means what its ids mean, wherever data.tokenizer's file is now
        if any(text.partition("=")[0].strip() == "data.tokenizer" for text in found):
            raise UsageError(
                f"data.tokenizer: the run keeps its own tokenizer ({path / TOKENIZER}), which its token ids mean; "
                "leave data.tokenizer out"
            )
        config = dataclasses.replace(config, data=dataclasses.replace(config.data, tokenizer=str(path / TOKENIZER)))
    bundle = build_data(config.data, config.train.seed)
    model = build_trained_model(config.model, bundle.spec)
    load_weights(weights, model)
    return LoadedRun(
        run_dir=path,
        config=config,
        data=bundle,
        pre=build_preprocessing(config, bundle),
        model=model.to(where).eval(),
        weights=weights,
        device=where,
        precision=_precision(config, where),
        tokenizer=kept if kept is not None else tokenizer_for(config, bundle),
    )


def build_trained_model(config: ModelConfig, spec: DataSpec) -> nn.Module:
    """The run's model, built to receive its trained weights: without `model.weights`, the starting
    weights training loaded (the trained ones replace them, and that file may be gone by now)."""
    return build_model(dataclasses.replace(config, weights=None), spec)


def _precision(config: Config, device: torch.device) -> str:
    """The run's precision where this device runs it, else this device's default (a GPU run's bf16 on a CPU)."""
    try:
        return resolve_precision(config.train.precision, device)[0]
    except ConfigError:
        return resolve_precision("auto", device)[0]
