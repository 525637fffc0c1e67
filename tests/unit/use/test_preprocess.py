"""The run's preprocessing, recovered: raw samples through it are, bit for bit, what the data pipeline
fed the model; and it survives the trip through preprocess.json."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gputrain.data import build_data
from gputrain.data.pixels import pixel_scaler
from gputrain.errors import RunError
from gputrain.use.loaded import load_run
from gputrain.use.preprocess import Preprocessing, build_preprocessing


@pytest.mark.parametrize("name", ["digits_cnn", "csv_mlp", "mnist_mlp", "images_resnet", "text_gpt"])
def test_raw_samples_become_exactly_what_training_fed_the_model(tiny_run, name: str) -> None:
    loaded = load_run(tiny_run(name), device="cpu")
    config = loaded.config
    raw = build_data(dataclasses.replace(config.data, normalize=False), config.train.seed).test
    if name == "images_resnet":
        samples = torch.stack([raw[i][0] for i in range(len(raw))])
        seen = pixel_scaler(loaded.data.spec, torch.device("cpu"))([samples])[0]
    else:
        samples, seen = raw.inputs, loaded.data.test.inputs
    with torch.no_grad():
        assert torch.equal(loaded.pre.transform()(samples), seen)
    again = Preprocessing.from_dict(loaded.pre.to_dict())
    with torch.no_grad():
        assert torch.equal(again.transform()(samples), seen)


def test_names_come_from_the_data(tiny_run) -> None:
    assert load_run(tiny_run("csv_mlp"), device="cpu").pre.class_names == ("cat", "dog", "eel")
    assert load_run(tiny_run("images_resnet"), device="cpu").pre.class_names == ("class_0", "class_1", "class_2")
    text = load_run(tiny_run("text_gpt"), device="cpu").pre
    assert text.vocab is not None and "".join(text.vocab) == " .abcdefghijklmnopqrstuvwxyz"


def test_a_normalisation_that_cannot_be_reproduced_is_refused(tiny_run) -> None:
    loaded = load_run(tiny_run("csv_mlp"), device="cpu")
    train = loaded.data.train
    shifted = dataclasses.replace(loaded.data, train=type(train)(train.inputs + 1.0, train.targets))
    with pytest.raises(RunError, match="normalisation could not be reproduced"):
        build_preprocessing(loaded.config, shifted)
