"""The run's preprocessing, recovered from its data: what turns a sample as the data source
provides it ("raw": CSV features, digit pixels in 0..16, uint8 images, token ids) into what the
model was trained on, and what names its outputs (class names, a character vocabulary).

The statistics are the training split's, as the data source computed them when it built the
splits: `data/tensors.py` standardises per channel (images) or per feature (tables), MNIST with one
mean and std, image folders with the spec's per-channel mean and std after scaling to [0, 1]. They
are computed here from the raw training split (the source built again with `data.normalize=false`,
same seed, same split), and checked against the normalised split the source built: a source whose
normalisation this does not reproduce is refused rather than served wrongly.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gputrain.config import Config
from gputrain.data import DataBundle, build_data
from gputrain.data.spec import DataSpec, TaskName, example_input
from gputrain.data.tensors import TensorData
from gputrain.errors import RunError
from gputrain.use.tables import TableLayout, read_layout

_STATS_CHECK_ROWS = 256
"""Training samples on which the recomputed normalisation is compared with the source's."""


@dataclass(frozen=True, slots=True)
class Preprocessing:
    """How a run's model reads its inputs, and what its outputs mean."""

    source: str
    """data.name"""
    task: TaskName
    input_shape: tuple[int, ...]
    raw_dtype: torch.dtype
    """What the data source gives: float32 features or pixels, uint8 images, int64 token ids."""
    pixels: bool = False
    """uint8 images, scaled to [0, 1] first."""
    mean: torch.Tensor | None = None
    """Subtracted, then divided by `std`; shaped to broadcast against [batch, *input_shape]."""
    std: torch.Tensor | None = None
    table: TableLayout | None = None
    """CSV data: the training file's columns and class names."""
    class_names: tuple[str, ...] | None = None
    """Classification: the name of each output, in order."""
    vocab: tuple[str, ...] | None = None
    """Character-level text: the character of each token id."""
    vocab_size: int | None = None

    def transform(self) -> InputTransform:
        return InputTransform(self)

    def describe_input(self) -> dict[str, Any]:
        """What a model with this preprocessing inside takes (export.json)."""
        dtype = str(self.raw_dtype).removeprefix("torch.")
        meaning = {
            "csv": f"feature columns {', '.join(self.table.features)}" if self.table else "feature columns",
            "digits": "8x8 digit images, pixels 0..16 (scikit-learn's digits)",
            "mnist": "28x28 grey images, pixels scaled to [0, 1]",
            "image_folder": "RGB images as uint8 [3, H, W], resized and centre-cropped",
            "text": "character ids (see vocab)",
            "tokens": "token ids",
            "synthetic": "samples as data.name=synthetic generates them",
            "instructions": "token ids of prompt/response text (data.tokenizer)",
            "text_classes": "token ids of text (data.tokenizer), padded on the right to data.seq_len",
        }.get(self.source, f"samples as data.name={self.source} gives them")
        return {"dtype": dtype, "shape": ["batch", *self.input_shape], "meaning": meaning}

    def to_dict(self) -> dict[str, Any]:
        """Everything a deployment needs to read inputs and name outputs, as JSON."""
        out: dict[str, Any] = {"data": self.source, "task": self.task, "input": self.describe_input()}
        if self.pixels:
            out["pixels_scaled_by"] = 1 / 255
        if self.mean is not None and self.std is not None:
            out["mean"], out["std"] = self.mean.flatten().tolist(), self.std.flatten().tolist()
            out["stats_shape"] = list(self.mean.shape)
        if self.table is not None:
            out["columns"], out["label_column"] = list(self.table.features), self.table.label
        if self.class_names is not None:
            out["classes"] = list(self.class_names)
        if self.vocab is not None:
            out["vocab"] = "".join(self.vocab)
        if self.vocab_size is not None:
            out["vocab_size"] = self.vocab_size
        return out

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> Preprocessing:
        """The preprocessing `to_dict` wrote (what the transform needs, and the names), e.g. from an export."""
        stats = None
        if "mean" in saved:
            shape = saved["stats_shape"]
            stats = (torch.tensor(saved["mean"]).view(shape), torch.tensor(saved["std"]).view(shape))
        vocab = saved.get("vocab")
        return cls(
            saved["data"],
            saved["task"],
            tuple(saved["input"]["shape"][1:]),
            getattr(torch, saved["input"]["dtype"]),
            pixels="pixels_scaled_by" in saved,
            mean=stats[0] if stats else None,
            std=stats[1] if stats else None,
            class_names=tuple(saved["classes"]) if "classes" in saved else None,
            vocab=tuple(vocab) if vocab is not None else None,
            vocab_size=saved.get("vocab_size"),
        )


class InputTransform(nn.Module):
    """Raw samples → model inputs, with the very operations the data pipeline applies (so the results
    are the same bit for bit): uint8 pixels `float() / 255`, then `(x - mean) / std`."""

    def __init__(self, pre: Preprocessing) -> None:
        super().__init__()
        self.pixels = pre.pixels
        self.mean: torch.Tensor | None
        self.std: torch.Tensor | None
        self.register_buffer("mean", pre.mean)
        self.register_buffer("std", pre.std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pixels:
            x = x.float() / 255.0
        if self.mean is not None and self.std is not None:
            x = (x - self.mean) / self.std
        return x


class ServedModel(nn.Module):
    """The run's model behind its preprocessing: raw samples in, the model's outputs out."""

    def __init__(self, model: nn.Module, pre: Preprocessing) -> None:
        super().__init__()
        self.preprocess = pre.transform()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(self.preprocess(x))


def build_preprocessing(config: Config, bundle: DataBundle) -> Preprocessing:
    """The preprocessing of the run whose config is `config` and whose data `bundle` is.

    Raises:
        DataError: the run's data cannot be read again (moved, changed).
        RunError: the data source normalises in a way this cannot reproduce.
    """
    spec = bundle.spec
    sample = example_input(bundle.train)
    raw_dtype = sample.dtype if sample is not None else torch.float32
    base = Preprocessing(config.data.name, spec.task, spec.input_shape, raw_dtype, vocab_size=spec.vocab_size)
    if spec.uint8_pixels:
        mean = std = None
        if spec.pixel_mean is not None and spec.pixel_std is not None:
            view = (1, len(spec.pixel_mean), 1, 1)
            mean = torch.tensor(spec.pixel_mean, dtype=torch.float32).view(view)
            std = torch.tensor(spec.pixel_std, dtype=torch.float32).view(view)
        base = dataclasses.replace(base, pixels=True, mean=mean, std=std)
    elif config.data.normalize and raw_dtype.is_floating_point and isinstance(bundle.train, TensorData):
        base = _with_feature_stats(base, config, bundle.train)
    if config.data.name == "csv":
        assert config.data.path is not None
        base = dataclasses.replace(
            base, table=read_layout(Path(config.data.path), config.data.label_column, config.data.task)
        )
    if config.data.name == "text":
        from gputrain.data.text import char_windows, read_text

        assert config.data.path is not None
        vocab = char_windows(read_text(Path(config.data.path)), config.data.seq_len)[2]
        base = dataclasses.replace(base, vocab=tuple(vocab))
    if spec.task == "classification":
        base = dataclasses.replace(base, class_names=_class_names(base, config, spec))
    return base


def _with_feature_stats(pre: Preprocessing, config: Config, normalised: TensorData) -> Preprocessing:
    """`pre` with the training split's mean and std (module docstring), checked against `normalised`."""
    raw = build_data(dataclasses.replace(config.data, normalize=False), config.train.seed).train
    assert isinstance(raw, TensorData)
    train = raw.inputs
    if pre.source == "mnist":  # one grey channel: one mean and std (data/mnist.py)
        mean, std = train.mean(), train.std().clamp_min(1e-8)
    else:  # data/tensors.py's _standardise
        dims = (0, 2, 3) if train.dim() == 4 else (0,)
        mean, std = train.mean(dim=dims, keepdim=True), train.std(dim=dims, keepdim=True)
        std = torch.where(std > 1e-8, std, torch.ones_like(std))
    pre = dataclasses.replace(pre, mean=mean, std=std)
    with torch.no_grad():
        again = pre.transform()(train[:_STATS_CHECK_ROWS])
    if not torch.allclose(again, normalised.inputs[:_STATS_CHECK_ROWS], rtol=1e-5, atol=1e-6):
        raise RunError(
            f"data.name={pre.source}: its normalisation could not be reproduced from the training split; "
            "use and export need it (train with data.normalize=false to leave the inputs as they are)"
        )
    return pre


def _class_names(pre: Preprocessing, config: Config, spec: DataSpec) -> tuple[str, ...]:
    assert spec.num_classes is not None
    if spec.class_names is not None:
        return spec.class_names
    if pre.table is not None and pre.table.classes is not None:
        return pre.table.classes
    if pre.source == "image_folder":
        assert config.data.path is not None
        return image_folder_classes(Path(config.data.path))
    return tuple(str(i) for i in range(spec.num_classes))


def image_folder_classes(root: Path) -> tuple[str, ...]:
    """An image folder's class names, in label order, as data/image_folder.py reads them: the class
    folders of `root/train` in the split layout, else of `root`."""
    from gputrain.data.image_folder import _subfolders, scan_classes

    train = root / "train"
    return tuple(scan_classes(train if train.is_dir() and _subfolders(train) else root)[0])
