"""gputrain predict: new CSV rows, images and arrays through the run's own preprocessing; the
probabilities are the model's on the samples as training prepared them."""

from __future__ import annotations

import csv
import dataclasses
import io

import numpy as np
import pytest
import torch
from PIL import Image

from gputrain.cli import main
from gputrain.data import build_data
from gputrain.data.pixels import pixel_scaler
from gputrain.use.loaded import load_run


def _raw_split(loaded, split: str = "test"):
    """A split as the data source gives it before normalisation (the same seeded split)."""
    return getattr(
        build_data(dataclasses.replace(loaded.config.data, normalize=False), loaded.config.train.seed), split
    )


def _read(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_csv_rows_give_the_models_probabilities_whatever_the_column_order(tiny_run, tmp_path, capsys) -> None:
    run_dir = tiny_run("csv_mlp")
    loaded = load_run(run_dir, device="cpu")
    raw = _raw_split(loaded).inputs.tolist()
    lines = ["c,a,b"] + [f"{r[2]!r},{r[0]!r},{r[1]!r}" for r in raw]  # no label column, columns reordered
    (tmp_path / "rows.csv").write_text("\n".join(lines) + "\n")
    assert main(["predict", str(run_dir), str(tmp_path / "rows.csv"), "--device", "cpu"]) == 0
    rows = _read(capsys.readouterr().out)
    with torch.no_grad():
        expected = loaded.model(loaded.data.test.inputs).softmax(-1)
    assert [r["input"] for r in rows] == [f"line {i + 2}" for i in range(len(raw))]
    got = torch.tensor([[float(r[f"p_{name}"]) for name in ("cat", "dog", "eel")] for r in rows])
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)
    assert [r["predicted"] for r in rows] == [("cat", "dog", "eel")[int(i)] for i in expected.argmax(-1)]


def test_regression_rows_give_values_under_the_label_name(tiny_run, tmp_path) -> None:
    run_dir = tiny_run("csv_regression")
    loaded = load_run(run_dir, device="cpu")
    raw = _raw_split(loaded).inputs[:5].tolist()
    (tmp_path / "rows.csv").write_text("a,b,c\n" + "".join(f"{a!r},{b!r},{c!r}\n" for a, b, c in raw))
    assert main(["predict", str(run_dir), str(tmp_path / "rows.csv"), "-o", str(tmp_path / "out.csv")]) == 0
    rows = _read((tmp_path / "out.csv").read_text())
    with torch.no_grad():
        expected = loaded.model(loaded.data.test.inputs[:5])[:, 0]
    torch.testing.assert_close(torch.tensor([float(r["label"]) for r in rows]), expected, rtol=1e-6, atol=1e-7)


def test_an_image_folder_gives_the_top_classes_as_the_model_ranks_them(tiny_run, tmp_path, capsys) -> None:
    run_dir = tiny_run("images_resnet")
    loaded = load_run(run_dir, device="cpu")
    test = loaded.data.test
    files = test.files[:4]
    for i, file in enumerate(files):  # the held-out images, copied into a folder of new inputs
        (tmp_path / "new" / str(i)).mkdir(parents=True)
        Image.open(file).save(tmp_path / "new" / str(i) / f"img{i}.png")
    assert main(["predict", str(run_dir), str(tmp_path / "new"), "--top-k", "2", "--device", "cpu"]) == 0
    rows = _read(capsys.readouterr().out)
    images = torch.stack([test[i][0] for i in range(4)])
    with torch.no_grad():
        probs = loaded.model(pixel_scaler(loaded.data.spec, torch.device("cpu"))([images])[0]).softmax(-1)
    top = probs.topk(2)
    names = loaded.pre.class_names
    assert [r["class1"] for r in rows] == [names[int(i)] for i in top.indices[:, 0]]
    torch.testing.assert_close(torch.tensor([float(r["p1"]) for r in rows]), top.values[:, 0], rtol=1e-5, atol=1e-6)
    assert set(rows[0]) == {"input", "class1", "p1", "class2", "p2"}


def test_a_npy_array_of_raw_digits_is_normalised_as_in_training(tiny_run, tmp_path, capsys) -> None:
    run_dir = tiny_run("digits_cnn")
    loaded = load_run(run_dir, device="cpu")
    np.save(tmp_path / "x.npy", _raw_split(loaded).inputs[:6].numpy())
    assert main(["predict", str(run_dir), str(tmp_path / "x.npy"), "--device", "cpu"]) == 0
    rows = _read(capsys.readouterr().out)
    with torch.no_grad():
        expected = loaded.model(loaded.data.test.inputs[:6]).softmax(-1)
    got = torch.tensor([[float(r[f"p_{k}"]) for k in range(10)] for r in rows])
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)


def test_a_grey_image_file_is_read_as_a_digit(tiny_run, tmp_path, capsys) -> None:
    """An 8x8 grey PNG of a held-out digit (its 0..16 counts scaled to 0..255) reads back as that very
    digit: its probabilities are the model's on the test sample."""
    run_dir = tiny_run("digits_cnn")
    loaded = load_run(run_dir, device="cpu")
    digit = _raw_split(loaded).inputs[0, 0]
    grey = (digit * 255 / 16).round().to(torch.uint8).numpy()
    Image.fromarray(grey, "L").save(tmp_path / "digit.png")
    assert main(["predict", str(run_dir), str(tmp_path / "digit.png"), "--top-k", "1"]) == 0
    row = _read(capsys.readouterr().out)[0]
    with torch.no_grad():
        probs = loaded.model(loaded.data.test.inputs[:1]).softmax(-1)[0]
    assert row["class1"] == str(int(probs.argmax())) and float(row["p1"]) == pytest.approx(float(probs.max()), 1e-6)


def test_mnist_png_files_give_the_models_probabilities_on_the_test_images(tiny_run, tmp_path, capsys) -> None:
    run_dir = tiny_run("mnist_mlp")
    loaded = load_run(run_dir, device="cpu")
    raw = _raw_split(loaded).inputs[:3, 0]  # grey in [0, 1], as the IDX bytes / 255
    for i, image in enumerate(raw):
        Image.fromarray((image * 255).round().to(torch.uint8).numpy(), "L").save(tmp_path / f"{i}.png")
    assert main(["predict", str(run_dir), str(tmp_path), "--top-k", "3", "--device", "cpu"]) == 0
    rows = _read(capsys.readouterr().out)
    with torch.no_grad():
        top = loaded.model(loaded.data.test.inputs[:3]).softmax(-1).topk(3)
    assert [r["input"] for r in rows] == [str(tmp_path / f"{i}.png") for i in range(3)]
    got = torch.tensor([[float(r[f"p{k}"]) for k in (1, 2, 3)] for r in rows])
    torch.testing.assert_close(got, top.values, rtol=1e-6, atol=1e-7)
    assert [r["class1"] for r in rows] == [str(int(i)) for i in top.indices[:, 0]]


@pytest.mark.parametrize(
    ("run", "content", "name", "message"),
    [
        ("csv_mlp", "a,b\n1,2\n", "x.csv", "no column 'c'; the model reads the columns a, b, c"),
        ("digits_cnn", None, "x.npy", "an array of float32 [2, 3, 8, 8]; the model reads 1-channel 8x8 images"),
        ("digits_cnn", "a,b\n1,2\n", "x.csv", "not trained on CSV data"),
        ("text_gpt", "a\n", "x.csv", "use gputrain generate"),
        ("csv_mlp", "", "x.png", "images, but this run was not trained on images"),
    ],
)
def test_inputs_that_do_not_fit_the_model_say_what_it_reads(
    tiny_run, tmp_path, capsys, run: str, content: str | None, name: str, message: str
) -> None:
    path = tmp_path / name
    if content is None:
        np.save(path, np.zeros((2, 3, 8, 8), dtype=np.float32))  # three channels where the model has one
    else:
        path.write_text(content)
    assert main(["predict", str(tiny_run(run)), str(path), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
