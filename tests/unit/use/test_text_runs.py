"""A token-id run that keeps its tokenizer: a tiny GPT trained a few steps on a .bin of a BPE's ids
with data.tokenizer keeps the tokenizer in its run directory (hash in env.json), generate reads and
writes text with it (also once the user's file is gone), evaluate reports perplexity and bits per
byte equal to hand-computed ones, export copies it beside the model, and continuing the run with a
tokenizer that changed is refused before anything is written."""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gputrain.cli import main
from gputrain.errors import UsageError
from gputrain.run.layout import ENV, TOKENIZER
from gputrain.text import Tokenizer, load_tokenizer, train_bpe
from gputrain.train.trainer import Trainer
from gputrain.use.evaluate import evaluate_run, prepared_split_size
from gputrain.use.generate import Sampling, generate
from gputrain.use.loaded import load_run
from tests.unit.text.corpus import bpe, corpus, write_token_file
from tests.unit.use.conftest import COMMON, TINY_GPT


def _train(run_dir: Path, tokenizer_path: Path, data: Path, steps: int = 3) -> dict:
    overrides = [
        *TINY_GPT,
        *COMMON,
        "data.name=tokens",
        f"data.path={data}",
        f"data.tokenizer={tokenizer_path}",
        "data.val_fraction=0.1",
        "data.test_fraction=0.1",
        f"train.max_steps={steps}",
        "train.batch_size=8",
    ]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return Trainer.from_config(None, run_dir=run_dir, overrides=overrides).fit()


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Tokenizer, Path]:
    """(run directory, its tokenizer, the user's saved tokenizer folder) of a tiny GPT trained 3 steps."""
    root = tmp_path_factory.mktemp("bpe-run")
    tok = bpe()
    user_file = tok.save(root / "user")
    run_dir = root / "run"
    _train(run_dir, user_file, write_token_file(tok, root / "train.bin"))
    return run_dir, tok, user_file


def test_the_run_keeps_its_tokenizer_with_its_hash(bpe_run) -> None:
    run_dir, tok, _ = bpe_run
    kept = load_tokenizer(run_dir / TOKENIZER)
    assert kept.hash == tok.hash and kept.kind == "bpe"
    env = json.loads((run_dir / ENV).read_text())
    assert env["tokenizer"] == {"dir": TOKENIZER, "kind": "bpe", "hash": tok.hash, "vocab_size": 300, "eos_id": 0}
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"


def test_generate_speaks_text_through_the_kept_tokenizer(bpe_run, tmp_path, capsys, monkeypatch) -> None:
    run_dir, tok, _ = bpe_run
    prompt = "def insort(a, x"
    args = ["generate", str(run_dir), "--prompt", prompt, "--max-new-tokens", "12", "--temperature", "0"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    loaded = load_run(run_dir, device="cpu")
    ids = tok.encode(prompt)
    new = [int(t[0]) for t in generate(loaded.model, ids, Sampling(12, 0.0), allowed=tok.vocab_size)]
    assert out == tok.decode(ids + new) + "\n"  # the text of the whole, streamed token by token
    assert "the run's bpe tokenizer, 300 tokens" in err
    # two samples: each the text of prompt and continuation
    assert main([*args, "--num-samples", "2"]) == 0
    assert capsys.readouterr().out == f"{tok.decode(ids + new)}\n---\n{tok.decode(ids + new)}\n"


def test_the_run_speaks_without_the_users_file(bpe_run, tmp_path, capsys) -> None:
    """The run's copy is what it reads: the user's tokenizer moved away changes nothing."""
    run_dir, _, user_file = bpe_run
    moved = tmp_path / "moved"
    shutil.move(user_file, moved)
    try:
        assert main(["generate", str(run_dir), "--prompt", "import", "--max-new-tokens", "3"]) == 0
        assert capsys.readouterr().out.startswith("import")
        with pytest.raises(UsageError, match="keeps its own tokenizer"):
            load_run(run_dir, device="cpu", overrides=[f"data.tokenizer={moved}"])
    finally:
        shutil.move(moved, user_file)


def test_evaluate_gives_perplexity_and_bits_per_byte_of_new_text(bpe_run, tmp_path) -> None:
    run_dir, tok, _ = bpe_run
    text = corpus()[0]
    path = tmp_path / "held.txt"
    path.write_text(text, encoding="utf-8")
    result = evaluate_run(run_dir, device="cpu", overrides=[f"data.path={path}"], out_dir=tmp_path / "out")
    # by hand: the text's ids in windows of seq_len (+1 shifted), the mean token cross-entropy
    loaded = load_run(run_dir, device="cpu")
    ids = torch.tensor(tok.encode(text))
    T = 16
    count = (len(ids) - 1) // T
    x, y = ids[: count * T].view(count, T), ids[1 : count * T + 1].view(count, T)
    with torch.no_grad():
        loss = F.cross_entropy(loaded.model(x).flatten(0, 1).double(), y.flatten()).item()
    expected_bpb = loss * len(ids) / (len(text.encode("utf-8")) * math.log(2))
    assert result.metrics["loss"] == pytest.approx(loss, rel=1e-5)
    assert result.metrics["perplexity"] == pytest.approx(math.exp(loss), rel=1e-5)
    assert result.metrics["bits_per_byte"] == pytest.approx(expected_bpb, rel=1e-5)
    assert result.record["text"] == {"tokens": len(ids), "bytes": len(text.encode("utf-8"))}


def test_a_prepared_folders_manifest_gives_a_splits_bytes(tmp_path: Path) -> None:
    manifest = {"splits": {"val": {"tokens": 100, "bytes": 420, "documents": 3, "shards": []}}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    size = prepared_split_size(str(tmp_path), "val")
    assert size is not None and (size.tokens, size.bytes) == (100, 420)
    assert prepared_split_size(str(tmp_path), "test") is None
    assert prepared_split_size(str(tmp_path / "none"), "val") is None


def test_export_copies_the_tokenizer_beside_the_model(bpe_run, tmp_path) -> None:
    run_dir, tok, _ = bpe_run
    out = tmp_path / "export"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["export", str(run_dir), "--format", "safetensors", "-o", str(out), "--device", "cpu"]) == 0
    record = json.loads((out / "export.json").read_text())
    assert {"tokenizer.json", "tokenizer_meta.json"} <= set(record["files"]) <= set(record["checksums"])
    assert record["tokenizer"]["hash"] == tok.hash
    assert load_tokenizer(out).hash == tok.hash


def test_continuing_with_a_changed_tokenizer_is_refused(tmp_path: Path) -> None:
    """The user's tokenizer.json replaced by another at the same path: the checkpoint's ids would
    mean other text. Refused in one line; nothing of the run changes."""
    tok = bpe()
    user = tok.save(tmp_path / "user") / "tokenizer.json"
    run_dir = tmp_path / "run"
    _train(run_dir, user, write_token_file(tok, tmp_path / "train.bin"), steps=2)
    before = {p: p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}
    other = train_bpe(corpus()[:3], 300)
    shutil.copy(other.save(tmp_path / "other") / "tokenizer.json", user)
    with pytest.raises(UsageError, match="would mean other text") as err:
        _train(run_dir, user, tmp_path / "train.bin", steps=4)
    assert "\n" not in str(err.value)
    assert {p: p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()} == before


def test_streamed_text_never_cuts_a_character() -> None:
    """Byte-level tokens split '東京' into pieces of characters: the stream holds each back until
    it is whole, and what it gives adds up to the text of all the ids."""
    from gputrain.use.generate import Tokenizer as RunTokenizer
    from gputrain.use.preprocess import Preprocessing

    tok = bpe()
    pre = Preprocessing("tokens", "lm", (16,), torch.int64, vocab_size=tok.vocab_size)
    speaker = RunTokenizer.of(pre, tok)
    prompt, new = tok.encode("x = "), tok.encode("'東京'\nnaïve 🙂")
    assert len(new) > len("'東京'\nnaïve 🙂")  # some characters are several tokens
    stream = speaker.stream(prompt)
    pieces = [stream.add(i) for i in new]
    pieces.append(stream.end())
    assert not any("\ufffd" in piece for piece in pieces)
    assert speaker.decode_prompt(prompt) + "".join(pieces) == tok.decode(prompt + new)
    assert speaker.continuation(prompt, new) == "'東京'\nnaïve 🙂"


def test_an_hf_model_directory_gives_the_run_its_own_tokenizer(tmp_path: Path, capsys) -> None:
    """model.name=hf from a local directory holding config.json and tokenizer.json: the run keeps the
    directory's tokenizer (no data.tokenizer given) and generate speaks text through it."""
    transformers = pytest.importorskip("transformers")
    tok = bpe()
    model_dir = tmp_path / "model"
    sizes = {"n_layer": 1, "n_head": 2, "n_embd": 16, "n_positions": 32, "vocab_size": tok.vocab_size}
    transformers.GPT2Config(**sizes).save_pretrained(model_dir)
    shutil.copy(tok.save(tmp_path / "user") / "tokenizer.json", model_dir / "tokenizer.json")
    overrides = [
        *COMMON,
        "model.name=hf",
        f"model.hf_config={model_dir}",
        "data.name=tokens",
        f"data.path={write_token_file(tok, tmp_path / 'train.bin')}",
        "data.seq_len=16",
        "train.max_steps=2",
        "train.batch_size=8",
    ]
    run_dir = tmp_path / "run"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        Trainer.from_config(None, run_dir=run_dir, overrides=overrides).fit()
    assert load_tokenizer(run_dir / TOKENIZER).hash == tok.hash
    assert json.loads((run_dir / ENV).read_text())["tokenizer"]["hash"] == tok.hash
    assert main(["generate", str(run_dir), "--prompt", "import os", "--max-new-tokens", "4", "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("import os") and "the run's hf tokenizer, 300 tokens" in err


def test_the_python_api_takes_a_tokenizer(tmp_path: Path) -> None:
    """Trainer(model, data, tokenizer=...) keeps it as from_config does; without one, nothing is kept."""
    from torch import nn

    from gputrain.data.tensors import TensorData

    tok = bpe()
    data = TensorData(torch.randint(0, tok.vocab_size, (32, 8)), torch.randint(0, tok.vocab_size, (32, 8)))
    config = {"train.device": "cpu", "log.progress": "none", "log.tensorboard": False}
    config |= {"train.max_steps": 1, "train.batch_size": 8}

    def lm() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Embedding(tok.vocab_size, 8), nn.Linear(8, tok.vocab_size))

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        Trainer(lm(), data, loss_fn=loss, config=config, run_dir=tmp_path / "with", tokenizer=tok).fit()
        Trainer(lm(), data, loss_fn=loss, config=config, run_dir=tmp_path / "without").fit()
    assert load_tokenizer(tmp_path / "with" / TOKENIZER).hash == tok.hash
    assert not (tmp_path / "without" / TOKENIZER).exists()
    assert "tokenizer" not in json.loads((tmp_path / "without" / ENV).read_text())
