"""Tokenizers that are not what they claim, and run directories whose kept tokenizer is not a folder
of the run's own (issue 30): each through the real command line (gputrain.cli.main in this process),
answered by exit 2 and one line naming the path, with nothing written (no run directory made; a
run's files left as they were)."""

from __future__ import annotations

import base64
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gputrain.cli import main
from tests.adversarial.helpers import fingerprint
from tests.unit.text.corpus import bpe, write_token_file

TRAIN = [
    "model.name=gpt",
    "model.preset=tiny",
    "model.d_model=32",
    "model.seq_len=16",
    "data.seq_len=16",
    "data.name=tokens",
    "train.max_steps=2",
    "train.batch_size=8",
    "train.device=cpu",
    "log.progress=none",
    "log.tensorboard=false",
]


def _small_ids(path: Path) -> Path:
    """A .bin whose ids are all below 100 (a model of data.vocab_size=100 could read them)."""
    np.random.default_rng(0).integers(0, 100, 4000).astype(np.uint16).tofile(path)
    return path


def _bad_json(tmp: Path) -> Path:
    (tmp / "tokenizer.json").write_text("{not json")
    return tmp / "tokenizer.json"


def _json_not_tokenizer(tmp: Path) -> Path:
    (tmp / "tokenizer.json").write_text(json.dumps({"vocab": {"a": 0}}))
    return tmp / "tokenizer.json"


def _model_not_readable(tmp: Path) -> Path:
    (tmp / "tokenizer.json").write_text(json.dumps({"model": 3}))
    return tmp / "tokenizer.json"


def _empty(tmp: Path) -> Path:
    (tmp / "tokenizer.json").write_bytes(b"")
    return tmp / "tokenizer.json"


def _folder_without(tmp: Path) -> Path:
    (tmp / "model").mkdir()
    (tmp / "model" / "config.json").write_text("{}")
    return tmp / "model"


def _tiktoken_bad_line(tmp: Path) -> Path:
    lines = [base64.b64encode(bytes([b])) + b" " + str(b).encode() for b in range(256)]
    lines[7] = b"!!notbase64 7"
    (tmp / "cl100k_base.tiktoken").write_bytes(b"\n".join(lines) + b"\n")
    return tmp / "cl100k_base.tiktoken"


def _tiktoken_unknown_name(tmp: Path) -> Path:
    lines = [base64.b64encode(bytes([b])) + b" " + str(b).encode() for b in range(256)]
    (tmp / "mine.tiktoken").write_bytes(b"\n".join(lines) + b"\n")
    return tmp / "mine.tiktoken"


def _tiktoken_bad_settings(tmp: Path) -> Path:
    path = _tiktoken_unknown_name(tmp)
    (tmp / "mine.json").write_text(json.dumps({"pattern": 3, "special_tokens": {"<|endoftext|>": "x"}}))
    return path


def _passwd_link(tmp: Path) -> Path:
    (tmp / "tokenizer.json").symlink_to("/etc/passwd")
    return tmp / "tokenizer.json"


def _fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "tokenizer.json")
    return tmp / "tokenizer.json"


def _saved_changed(tmp: Path) -> Path:
    folder = bpe().save(tmp)
    data = json.loads((folder / "tokenizer.json").read_text())
    data["model"]["vocab"]["zz"] = 299
    (folder / "tokenizer.json").write_text(json.dumps(data))
    return folder


def _saved_record_not_json(tmp: Path) -> Path:
    folder = bpe().save(tmp)
    (folder / "tokenizer_meta.json").write_text("{")
    return folder


def _tokenizer_json_a_folder(tmp: Path) -> Path:
    (tmp / "model" / "tokenizer.json").mkdir(parents=True)
    return tmp / "model"


def _tiktoken_shared_rank(tmp: Path) -> Path:
    lines = [base64.b64encode(bytes([b])) + b" " + str(b).encode() for b in range(256)]
    lines.append(base64.b64encode(b"ab") + b" 5")
    (tmp / "r50k_base.tiktoken").write_bytes(b"\n".join(lines) + b"\n")
    return tmp / "r50k_base.tiktoken"


def _special_on_a_rank(tmp: Path) -> Path:
    path = _tiktoken_unknown_name(tmp)
    (tmp / "mine.json").write_text(json.dumps({"pattern": r"\S+|\s+", "special_tokens": {"<|endoftext|>": 7}}))
    return path


def _config_not_json(tmp: Path) -> Path:
    folder = tmp / "model"
    folder.mkdir()
    shutil.copy(bpe().save(tmp / "u") / "tokenizer.json", folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text("{eos")
    return folder


def _missing(tmp: Path) -> Path:
    return tmp / "nowhere" / "tokenizer.json"


TRAIN_CASES: list[tuple[str, Callable[[Path], Path], list[str], str]] = [
    ("not JSON", _bad_json, [], r"{path}: not JSON \(.*\), so not a tokenizer.json"),
    ("JSON, not a tokenizer", _json_not_tokenizer, [], r'{path}: JSON without a tokenizer\'s "model": .*'),
    ("a model the library cannot read", _model_not_readable, [], r"{path}: not a tokenizer the tokenizers library .*"),
    ("an empty file", _empty, [], r"{path}: is empty, not a tokenizer.json"),
    ("a folder without tokenizer.json", _folder_without, [], r"{path}: a directory without a tokenizer.json .*"),
    ("a .tiktoken line not base64", _tiktoken_bad_line, [], r"{path}: line 8 \(.*\) is not '<base64 token> <rank>'.*"),
    ("a .tiktoken without its pattern", _tiktoken_unknown_name, [], r"{path}: a .tiktoken file holds no split .*"),
    ("a .tiktoken's settings of wrong types", _tiktoken_bad_settings, [], r".*mine.json: must be .*"),
    ("a link to /etc/passwd", _passwd_link, [], r"{path}: not JSON \(.*\), so not a tokenizer.json"),
    ("a FIFO", _fifo, [], r"{path}: is a FIFO \(named pipe\), not a tokenizer.json"),
    ("a saved folder changed since", _saved_changed, [], r"{path}: its tokenizer files' hash .* changed since .*"),
    ("a saved record not JSON", _saved_record_not_json, [], r".*tokenizer_meta.json: not JSON .*"),
    ("tokenizer.json a folder", _tokenizer_json_a_folder, [], r"{path}/tokenizer.json: is a directory, not a .*"),
    ("two .tiktoken tokens of one rank", _tiktoken_shared_rank, [], r"{path}: two tokens share a rank"),
    ("a special token on a rank", _special_on_a_rank, [], r"{path}: special token id 7 is also a rank of the file"),
    ("a tokenizer_config.json not JSON", _config_not_json, [], r"{path}/tokenizer_config.json: not JSON .*"),
    ("nothing there", _missing, [], r"config error: data.tokenizer = '{path}': no such file or directory; .*"),
    (
        "more tokens than the model's vocabulary",
        lambda tmp: bpe().save(tmp),
        ["data.vocab_size=100"],
        r"data.tokenizer {path}: 300 tokens, but data.vocab_size = 100: the model could not embed ids 100..299; .*",
    ),
    (
        "a character-level source",
        lambda tmp: bpe().save(tmp),
        ["data.name=text"],
        r"config error: data.tokenizer = '{path}': data.name=text is character-level .*",
    ),
    (
        "a source of no token ids",
        lambda tmp: bpe().save(tmp),
        ["data.name=digits", "model.name=mlp", "data.seq_len=128"],
        r"data.tokenizer: data.name=digits gives the model no token ids, .*",
    ),
]


@pytest.mark.parametrize(("make", "extra", "pattern"), [c[1:] for c in TRAIN_CASES], ids=[c[0] for c in TRAIN_CASES])
def test_train_refuses_a_tokenizer_that_is_not_one(tmp_path, capsys, make, extra, pattern) -> None:
    import re

    path = make(tmp_path)
    data = _small_ids(tmp_path / "train.bin")
    run_dir = tmp_path / "run"
    args = ["train", *TRAIN, f"data.path={data}", f"data.tokenizer={path}", *extra, "--run-dir", str(run_dir)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert re.fullmatch("gputrain train: " + pattern.format(path=re.escape(str(path))), err) or re.fullmatch(
        pattern.format(path=re.escape(str(path))), err
    ), err
    assert not run_dir.exists()


@pytest.fixture(scope="module")
def kept_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny run that keeps its BPE tokenizer."""
    root = tmp_path_factory.mktemp("kept")
    tok = bpe()
    folder = tok.save(root / "user")
    run_dir = root / "run"
    args = ["train", *TRAIN, f"data.path={write_token_file(tok, root / 'train.bin')}", f"data.tokenizer={folder}"]
    assert main([*args, "--run-dir", str(run_dir)]) == 0
    return run_dir


def _tokenizer_a_file(run: Path, outside: Path) -> None:
    shutil.rmtree(run / "tokenizer")
    (run / "tokenizer").write_text("not a folder")


def _tokenizer_a_link_out(run: Path, outside: Path) -> None:
    shutil.move(run / "tokenizer", outside / "tokenizer")
    (run / "tokenizer").symlink_to(outside / "tokenizer")


def _file_a_link_to_passwd(run: Path, outside: Path) -> None:
    (run / "tokenizer" / "tokenizer.json").unlink()
    (run / "tokenizer" / "tokenizer.json").symlink_to("/etc/passwd")


def _file_changed(run: Path, outside: Path) -> None:
    path = run / "tokenizer" / "tokenizer.json"
    data = json.loads(path.read_text())
    data["model"]["vocab"]["zz"] = 299
    path.write_text(json.dumps(data))


def _record_without_hash(run: Path, outside: Path) -> None:
    (run / "tokenizer" / "tokenizer_meta.json").write_text(json.dumps({"kind": "bpe"}))


def _record_a_fifo(run: Path, outside: Path) -> None:
    (run / "tokenizer" / "tokenizer_meta.json").unlink()
    os.mkfifo(run / "tokenizer" / "tokenizer_meta.json")


RUN_CASES: list[tuple[str, Callable[[Path, Path], None], str]] = [
    ("tokenizer/ a file", _tokenizer_a_file, r"{run}/tokenizer: is a regular file, where a run keeps a directory; .*"),
    ("tokenizer/ a link out", _tokenizer_a_link_out, r"{run}/tokenizer: a symbolic link leading out of the run .*"),
    (
        "tokenizer.json a link to /etc/passwd",
        _file_a_link_to_passwd,
        r"{run}/tokenizer/tokenizer.json: a symbolic link leading out of the run directory \(to /etc/passwd\).*",
    ),
    ("tokenizer.json changed", _file_changed, r"{run}/tokenizer: its tokenizer files' hash .* changed since .*"),
    (
        "a record that is a FIFO",
        _record_a_fifo,
        r"{run}/tokenizer/tokenizer_meta.json: is a FIFO \(named pipe\), where a run keeps a regular file; .*",
    ),
    ("a record without its hash", _record_without_hash, r'{run}/tokenizer/tokenizer_meta.json: not a saved .*"hash"\)'),
]


@pytest.mark.parametrize(("spoil", "pattern"), [c[1:] for c in RUN_CASES], ids=[c[0] for c in RUN_CASES])
@pytest.mark.parametrize("command", ["generate", "evaluate"])
def test_the_use_commands_refuse_a_kept_tokenizer_that_is_not_the_runs(
    kept_run, tmp_path, capsys, spoil, pattern, command
) -> None:
    import re

    run = tmp_path / "run"
    shutil.copytree(kept_run, run, symlinks=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    spoil(run, outside)
    before = fingerprint(run)
    extra = ["--prompt", "def"] if command == "generate" else ["--device", "cpu"]
    assert main([command, str(run), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert re.fullmatch(f"gputrain {command}: " + pattern.format(run=re.escape(str(run))), err), err
    assert fingerprint(run) == before


def test_train_refuses_a_run_directory_whose_tokenizer_is_a_file(tmp_path, capsys) -> None:
    tok = bpe()
    run = tmp_path / "run"
    run.mkdir()
    (run / "tokenizer").write_text("mine")
    data = write_token_file(tok, tmp_path / "train.bin")
    args = ["train", *TRAIN, f"data.path={data}", f"data.tokenizer={tok.save(tmp_path / 'u')}", "--run-dir", str(run)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "tokenizer is a regular file, where the run keeps a directory" in err, err
    assert sorted(p.name for p in run.iterdir()) == ["tokenizer"]
