"""Tiny trained runs of every task, model family and data format, each trained once per session
(in this process: a few seconds in all) and shared by the tests of gputrain/use/."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.one_thread import one_thread  # noqa: F401  (an autouse fixture)
from tests.unit.data.files import write_image_folder, write_mnist, write_text, write_tokens

COMMON = ["train.device=cpu", "log.progress=none", "log.tensorboard=false", "train.seed=0"]
TINY_GPT = ["model.name=gpt", "model.preset=tiny", "model.d_model=32", "model.seq_len=16", "data.seq_len=16"]


def write_table(path: Path, rows: int = 240, regression: bool = False) -> Path:
    """A CSV with its label column in the middle (features a, b, then c after the label): text classes
    (cat, dog, eel) decided by a and b, or a fractional target."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 3))
    lines = ["a,b,label,c"]
    for a, b, c in x:
        label = f"{2 * a - b + 0.1 * c:.4f}" if regression else ("cat", "dog", "eel")[int(a > 0) + int(b > 0.5)]
        lines.append(f"{a:.5f},{b:.5f},{label},{c:.5f}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _runs(root: Path) -> dict[str, list[str]]:
    data = root / "data"
    data.mkdir(exist_ok=True)
    return {
        "digits_cnn": ["model.name=cnn", "model.channels=[4]", "model.hidden=16", "train.epochs=2"],
        "csv_mlp": [
            "model.name=mlp",
            "model.hidden_sizes=[16]",
            "data.name=csv",
            f"data.path={write_table(data / 'table.csv')}",
            "data.label_column=label",
            "train.epochs=3",
            "train.batch_size=16",
        ],
        "csv_regression": [
            "model.name=mlp",
            "model.hidden_sizes=[8]",
            "data.name=csv",
            f"data.path={write_table(data / 'values.csv', regression=True)}",
            "data.label_column=label",
            "train.epochs=2",
            "train.batch_size=16",
        ],
        "images_resnet": [
            "model.name=resnet18",
            "model.base_width=4",
            "data.name=image_folder",
            f"data.path={write_image_folder(data / 'images', classes=3, per_class=10)}",
            "data.image_size=16",
            "data.num_workers=0",
            "train.epochs=2",
            "train.batch_size=8",
        ],
        "mnist_mlp": [
            "model.name=mlp",
            "model.hidden_sizes=[16]",
            "data.name=mnist",
            f"data.path={write_mnist(data / 'mnist', n_train=128, n_test=32)}",
            "train.epochs=1",
            "train.batch_size=32",
        ],
        "text_gpt": [
            *TINY_GPT,
            "data.name=text",
            f"data.path={write_text(data / 'text.txt', n_chars=3000)}",
            "train.epochs=2",
            "train.batch_size=16",
        ],
        "tokens_gpt": [
            *TINY_GPT,
            "data.name=tokens",
            f"data.path={write_tokens(data / 'train.bin', 4000, vocab=50)}",
            "data.val_fraction=0.1",
            "data.test_fraction=0.1",
            "train.epochs=1",
            "train.batch_size=16",
        ],
    }


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """tiny_run(name) -> the run directory of that tiny run, trained on first use."""
    return tiny_runs(tmp_path_factory.mktemp("use-runs"))


def tiny_runs(root: Path) -> Callable[[str], Path]:
    """get(name) -> the run directory of that tiny run under `root`, trained on first use (tests
    elsewhere share these runs through their own fixtures)."""
    import torch

    from gputrain.train.trainer import Trainer

    specs = _runs(root)
    done: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in done:
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                run_dir = root / name
                # training's notes would land in the output of whichever test trains the run first
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    Trainer.from_config(None, run_dir=run_dir, overrides=[*specs[name], *COMMON]).fit()
            finally:
                torch.set_num_threads(threads)
            done[name] = run_dir
        return done[name]

    return get


def onnx_ready() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("onnx", "onnxscript", "onnxruntime"))


needs_onnx = pytest.mark.skipif(
    not onnx_ready(), reason="the export extra is not installed (pip install -e '.[export]'): ONNX export untested"
)
