"""Every example in examples/ as a newcomer meets it: its config validates, its data can be had (built
in, shipped in the repository, made by a script or command of the repository, or, for a data set of
the user's, a file of the format it names), and one step of it runs as written, only made small
(train.max_steps=1, a smaller batch). The nanoGPT examples hold exactly the settings they claim."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from gputrain.cli import main
from gputrain.config import load_config
from gputrain.config.schema import ppo_defaults
from tests.unit.data.files import write_image_folder, write_mnist, write_tokens

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SCRIPT = EXAMPLES / "text_data" / "shakespeare.py"

DATA = {
    "digits_cnn": "built in",
    "resnet50_synthetic": "built in",
    "rl_cartpole": "built in",
    "rl_pendulum": "built in",
    "instructions_gpt": "shipped",
    "text_classes_gpt": "shipped",
    "text_char_gpt": "script",
    "text_char_gpt_gpu": "script",
    "corpus_bpe_gpt": "prepare",
    "csv_mlp": "yours",
    "mnist_cnn": "yours",
    "image_folder_resnet18": "yours",
    "gpt2_124m_tokens": "yours",
}
"""How each example's data is had; a new example must say (test_every_example_says_how_its_data_is_had)."""

SMALL: dict[str, list[str]] = {
    "resnet50_synthetic": ["data.num_samples=8", "train.batch_size=2", "train.compile=false"],
    "gpt2_124m_tokens": [
        "data.seq_len=32",
        "train.batch_size=2",
        "train.micro_batch_size=1",
        "train.compile=false",
        "train.precision=fp32",
        "data.max_eval_samples=2",
    ],
    "image_folder_resnet18": ["train.batch_size=2", "data.image_size=32", "data.num_workers=0"],
    "text_char_gpt_gpu": ["train.batch_size=2"],
    "mnist_cnn": ["train.batch_size=8"],
    "csv_mlp": ["train.batch_size=8"],
}
"""Per example, what makes one step of it small (beside QUICK): the settings that size it, nothing else."""

QUICK = [
    "train.max_steps=1",
    "train.device=cpu",
    "log.progress=none",
    "log.tensorboard=false",
    "checkpoint.enabled=false",
    "eval.max_batches=1",
]


SPACES = {"sweep_digits"}
"""Search spaces for `gputrain sweep`, not configs: checked by the sweep's own reader (below)."""


def test_every_example_says_how_its_data_is_had() -> None:
    assert {p.stem for p in EXAMPLES.glob("*.toml")} - SPACES == set(DATA)


@pytest.mark.parametrize("name", sorted(SPACES))
def test_each_search_space_example_is_checked_as_gputrain_sweep_checks_it(name: str) -> None:
    from gputrain.sweep.space import check_space, read_space

    path = EXAMPLES / f"{name}.toml"
    check_space(read_space(path), str(path), None, [])  # raises UsageError naming the key where wrong


@pytest.mark.parametrize("name", sorted(DATA))
def test_example_validates(name: str) -> None:
    config = load_config(EXAMPLES / f"{name}.toml", defaults=ppo_defaults if name.startswith("rl_") else None)
    if DATA[name] == "shipped":
        assert (ROOT / config.data.path).is_file(), config.data.path  # type: ignore[operator]


def test_the_shakespeare_script_writes_the_text_offline(tmp_path: Path) -> None:
    """Without a network the script writes its stand-in (and says so), keeps it on a second run, and
    the examples read it."""
    out = tmp_path / "shakespeare.txt"
    for expected in ("stand-in", "kept"):
        run = subprocess.run(
            [sys.executable, str(SCRIPT), "--offline", "--out", str(out)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        assert expected in run.stdout, run.stdout
    assert len(out.read_text(encoding="utf-8")) > 100_000


def _data_of(name: str, root: Path) -> list[str]:
    """The data.path overrides that point an example at data made as its comment says (or, for data of
    the user's, a small file of the format it names)."""
    kind = DATA[name]
    if kind == "script":
        out = root / "shakespeare.txt"
        subprocess.run(
            [sys.executable, str(SCRIPT), "--offline", "--out", str(out)], check=True, timeout=120, capture_output=True
        )
        return [f"data.path={out}"]
    if kind == "prepare":
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        assert (
            main(
                [
                    "prepare",
                    str(stdlib / "email"),
                    str(stdlib / "asyncio"),
                    "--glob",
                    "*.py",
                    "--val-fraction",
                    "0.1",
                    "--out",
                    str(root / "email-bpe"),
                    "--train-tokenizer",
                    "2048",
                ]
            )
            == 0
        )
        return [f"data.path={root / 'email-bpe'}"]
    if name == "mnist_cnn":
        return [f"data.path={write_mnist(root / 'mnist', n_train=40, n_test=10, gz=True)}"]
    if name == "image_folder_resnet18":
        return [f"data.path={write_image_folder(root / 'images', classes=2, per_class=6, fmt='jpg')}"]
    if name == "csv_mlp":
        (root / "table.csv").write_text("x1,x2,label\n" + "".join(f"{i},{i % 3},{i % 2}\n" for i in range(60)))
        return [f"data.path={root / 'table.csv'}"]
    if name == "gpt2_124m_tokens":
        (root / "owt").mkdir()
        write_tokens(root / "owt" / "train.bin", 4_000, vocab=50257)
        write_tokens(root / "owt" / "val.bin", 1_000, vocab=50257, seed=1)
        return [f"data.path={root / 'owt'}"]
    return []


@pytest.mark.parametrize("name", sorted(n for n in DATA if not n.startswith("rl_")))
def test_one_step_of_each_example(name: str, tmp_path: Path) -> None:
    from gputrain import Trainer

    overrides = [*QUICK, *SMALL.get(name, []), *_data_of(name, tmp_path)]
    summary: dict[str, Any] = Trainer.from_config(
        EXAMPLES / f"{name}.toml", run_dir=tmp_path / "run", overrides=overrides
    ).fit()
    assert summary["status"] == "completed" and summary["global_step"] == 1


@pytest.mark.parametrize("name", ["rl_cartpole", "rl_pendulum"])
def test_one_iteration_of_each_rl_example(name: str, tmp_path: Path) -> None:
    from gputrain.rl.trainer import PPOTrainer

    rl = load_config(EXAMPLES / f"{name}.toml", defaults=ppo_defaults).rl.resolved()
    overrides = [
        f"rl.total_timesteps={rl.batch_size}",
        "log.progress=none",
        "log.tensorboard=false",
        "train.device=cpu",
    ]
    summary = PPOTrainer(EXAMPLES / f"{name}.toml", run_dir=tmp_path / "run", overrides=overrides).fit()
    assert summary["global_step"] == 1


def test_the_python_example_runs(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "own_optimizer_and_callbacks.py"),
            "--run-dir",
            str(tmp_path / "run"),
            "--steps",
            "2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 0, run.stderr[-2000:]


# nanoGPT's config/train_shakespeare_char.py, and the CPU command of its README on top of it
NANOGPT = {
    "model.n_layer": 6,
    "model.n_head": 6,
    "model.d_model": 384,
    "data.seq_len": 256,
    "model.seq_len": 256,
    "train.batch_size": 64,
    "model.dropout": 0.2,
    "optim.lr": 1e-3,
    "train.max_steps": 5000,
    "optim.min_lr": 1e-4,
    "optim.betas": [0.9, 0.99],
    "optim.warmup_steps": 100,
    "model.bias": False,
    "train.clip_grad_norm": 1.0,
    "optim.weight_decay": 0.1,
    "eval.every_steps": 250,
    "eval.max_batches": 200,
    "optim.schedule": "warmup_cosine",
    "train.grad_accum": 1,
}
NANOGPT_CPU = {
    **NANOGPT,
    "data.seq_len": 64,
    "model.seq_len": 64,
    "train.batch_size": 12,
    "model.n_layer": 4,
    "model.n_head": 4,
    "model.d_model": 128,
    "train.max_steps": 2000,
    "model.dropout": 0.0,
    "eval.max_batches": 20,
}


# nanoGPT's train.py defaults, which config/train_gpt2.py keeps but for the batch (12 × 40 accumulated)
NANOGPT_GPT2 = {
    "model.bias": False,
    "model.dropout": None,
    "data.seq_len": 1024,
    "train.batch_size": 480,
    "train.micro_batch_size": 12,
    "optim.lr": 6e-4,
    "optim.min_lr": 6e-5,
    "optim.betas": [0.9, 0.95],
    "optim.weight_decay": 0.1,
    "optim.warmup_steps": 2000,
    "train.max_steps": 600000,
    "train.clip_grad_norm": 1.0,
}


@pytest.mark.parametrize(
    ("name", "settings"),
    [("text_char_gpt_gpu", NANOGPT), ("text_char_gpt", NANOGPT_CPU), ("gpt2_124m_tokens", NANOGPT_GPT2)],
)
def test_the_nanogpt_examples_hold_its_settings(name: str, settings: dict[str, Any]) -> None:
    config = load_config(EXAMPLES / f"{name}.toml")
    for key, value in settings.items():
        section, field = key.split(".")
        got = getattr(getattr(config, section), field)
        assert (list(got) if isinstance(got, tuple) else got) == value, key


def _script() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("shakespeare_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shakespeare_script_without_a_network_says_so_and_writes_the_stand_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import urllib.error
    import urllib.request

    def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise urllib.error.URLError("Name or service not known")

    script = _script()
    monkeypatch.setattr(urllib.request, "urlopen", unreachable)
    out = tmp_path / "data" / "shakespeare.txt"
    assert script.main(["--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "could not download" in said and "Name or service not known" in said and script.URL in said
    assert out.read_text(encoding="utf-8") == script.stand_in()


def test_the_shakespeare_script_refuses_what_is_not_tiny_shakespeare(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import io
    import urllib.request

    script = _script()
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: io.BytesIO(b"<html>a captive portal</html>"))
    out = tmp_path / "shakespeare.txt"
    assert script.main(["--out", str(out)]) == 1
    assert "not Tiny Shakespeare's 1,115,394" in capsys.readouterr().err
    assert not out.exists()
