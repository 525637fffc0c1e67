"""Every examples/*.toml loads, and its data section reads a real file of the kind it names."""

from __future__ import annotations

from pathlib import Path

import pytest

from gputrain.config import load_config
from gputrain.data import build_data
from tests.unit.data.files import write_image_folder, write_mnist, write_text, write_tokens

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
EXPECTED = {"digits_cnn", "mnist_cnn", "image_folder_resnet18", "csv_mlp", "text_char_gpt", "gpt2_124m_tokens",
            "resnet50_synthetic"}


def test_the_promised_examples_exist() -> None:
    assert EXPECTED <= {p.stem for p in EXAMPLES.glob("*.toml")}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_loads(name: str) -> None:
    config = load_config(EXAMPLES / f"{name}.toml")
    assert config.model.name in name.replace("_", " ") or config.model.name == "gpt"


def _stand_in(name: str, root: Path) -> Path:
    """A small real file in the format the example's data.path names."""
    if name == "mnist_cnn":
        return write_mnist(root / "mnist", n_train=40, n_test=10, gz=True)
    if name == "image_folder_resnet18":
        return write_image_folder(root / "images", classes=2, per_class=5, fmt="jpg")
    if name == "csv_mlp":
        (root / "table.csv").write_text("x1,x2,label\n" + "".join(f"{i},{i % 3},{i % 2}\n" for i in range(50)))
        return root / "table.csv"
    if name == "text_char_gpt":
        return write_text(root / "shakespeare.txt", n_chars=30_000)
    (root / "owt").mkdir()
    write_tokens(root / "owt" / "train.bin", 30_000, vocab=50257)
    write_tokens(root / "owt" / "val.bin", 5_000, vocab=50257, seed=1)
    return root / "owt"


@pytest.mark.parametrize("name", ["mnist_cnn", "image_folder_resnet18", "csv_mlp", "text_char_gpt",
                                  "gpt2_124m_tokens"])
def test_example_reads_its_kind_of_file(name: str, tmp_path: Path) -> None:
    config = load_config(EXAMPLES / f"{name}.toml", [f"data.path={_stand_in(name, tmp_path)}"])
    bundle = build_data(config.data, seed=0)
    assert len(bundle.train) > 0 and bundle.val is not None and len(bundle.val) > 0
    if config.model.name == "gpt":
        assert bundle.spec.input_shape == (config.data.seq_len,)
