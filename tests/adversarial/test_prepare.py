"""`gputrain prepare` against bad corpora, tokenizers, options and output folders: each case is one line
naming the file, field or option (and what would be right), exit 2, and not a byte written or changed
under the case's folder, also where the bad part is met in the middle of the work (what was written
by then is removed)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gputrain.prepare import work
from tests.unit.prepare.corpus import EOS, documents, prepare, write_tokenizer

DOCS = documents(60)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer(tmp_path_factory.mktemp("tokenizer") / "tokenizer.json", documents(100, seed=5))


def _tree(root: Path) -> dict[str, str]:
    """Every entry under `root`: a file's sha256, a folder as such, a link's target."""
    state = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        if path.is_symlink():
            state[key] = "link " + os.readlink(path)
        elif path.is_dir():
            state[key] = "folder"
        else:
            state[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return state


def _texts(folder: Path, count: int = 5) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, text in enumerate(DOCS[:count]):
        (folder / f"{i:02d}.txt").write_text(text)
    return folder


def _jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _parquet(path: Path, **columns: list[object]) -> Path:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path)
    return path


def _complete(root: Path, tok: Path, *extra: str) -> Path:
    """A corpus prepared into root/out."""
    corpus = _texts(root / "c")
    assert prepare(corpus, "--out", root / "out", "--tokenizer", tok, *extra)[0] == 0
    return corpus


def _no_eos_tokenizer(root: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.train_from_iterator(DOCS, trainer=trainers.BpeTrainer(vocab_size=300, show_progress=False))
    tok.save(str(root / "noeos.json"))
    return root / "noeos.json"


def _loop(root: Path) -> Path:
    corpus = _texts(root / "c")
    (corpus / "deeper").mkdir()
    (corpus / "deeper" / "back").symlink_to(corpus)
    return corpus


def _bad_line_in_the_middle(root: Path) -> Path:
    rows: list[object] = [{"text": t} for t in DOCS]
    path = _jsonl(root / "c.jsonl", rows)
    with path.open("a") as f:
        f.write("{not json\n")
    return path


def _latin1_after_good_files(root: Path) -> Path:
    corpus = _texts(root / "c", 40)
    (corpus / "zz.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
    return corpus


@dataclass(frozen=True)
class Case:
    name: str
    args: Callable[[Path, Path], list[object]]
    """(the case's folder, a tokenizer.json) -> the command's arguments after `prepare`."""
    says: tuple[str, ...]
    """What the line names."""


CASES = [
    Case("missing source", lambda r, t: [r / "nope", "--out", r / "o", "--tokenizer", t], ("nope", "no such")),
    Case(
        "jsonl: missing field",
        lambda r, t: [_jsonl(r / "c.jsonl", [{"body": "x"}]), "--out", r / "o", "--tokenizer", t],
        ("c.jsonl:1", "'text'", "--field"),
    ),
    Case(
        "jsonl: field not text",
        lambda r, t: [_jsonl(r / "c.jsonl", [{"text": 3}]), "--out", r / "o", "--tokenizer", t],
        ("c.jsonl:1", "int", "not text"),
    ),
    Case(
        "jsonl: not JSONL",
        lambda r, t: [_made(r / "c.jsonl", "hello, world\n"), "--out", r / "o", "--tokenizer", t],
        ("c.jsonl:1", "not JSON"),
    ),
    Case(
        "jsonl: a list, not an object",
        lambda r, t: [_jsonl(r / "c.jsonl", [["text"]]), "--out", r / "o", "--tokenizer", t],
        ("c.jsonl:1", "not an object"),
    ),
    Case(
        "jsonl: a bad line after shards were written",
        lambda r, t: [_bad_line_in_the_middle(r), "--out", r / "o", "--tokenizer", t, "--shard-tokens", "50"],
        (f"c.jsonl:{len(DOCS) + 1}", "not JSON"),
    ),
    Case(
        "parquet: missing column",
        lambda r, t: [_parquet(r / "c.parquet", body=["x"]), "--out", r / "o", "--tokenizer", t],
        ("c.parquet", "'text'", "--column"),
    ),
    Case(
        "parquet: column not text",
        lambda r, t: [_parquet(r / "c.parquet", text=[1, 2]), "--out", r / "o", "--tokenizer", t],
        ("c.parquet", "int64", "not text"),
    ),
    Case(
        "parquet: not Parquet",
        lambda r, t: [_made(r / "c.parquet", "a,b\n1,2\n"), "--out", r / "o", "--tokenizer", t],
        ("c.parquet", "not a Parquet file"),
    ),
    Case(
        "saved dataset of several splits",
        lambda r, t: [_made_dir(r / "dd", {"dataset_dict.json": "{}"}), "--out", r / "o", "--tokenizer", t],
        ("dd", "one split"),
    ),
    Case(
        "an empty corpus",
        lambda r, t: [_made_dir(r / "c", {"a.txt": "", "b.txt": ""}), "--out", r / "o", "--tokenizer", t],
        ("no text",),
    ),
    Case(
        "a folder without a matching file",
        lambda r, t: [_made_dir(r / "c", {"a.md": "x"}), "--out", r / "o", "--tokenizer", t],
        ("*.txt", "--glob"),
    ),
    Case(
        "a binary file among text files",
        lambda r, t: [_binary_among_texts(r), "--out", r / "o", "--tokenizer", t],
        ("03.txt", "NUL"),
    ),
    Case(
        "text not UTF-8, met after shards were written",
        lambda r, t: [_latin1_after_good_files(r), "--out", r / "o", "--tokenizer", t, "--shard-tokens", "50"],
        ("zz.txt", "not UTF-8", "byte 3"),
    ),
    Case(
        "--val-fraction 1",
        lambda r, t: [_texts(r / "c"), "--out", r / "o", "--tokenizer", t, "--val-fraction", "1"],
        ("--val-fraction",),
    ),
    Case(
        "--val-fraction negative",
        lambda r, t: [_texts(r / "c"), "--out", r / "o", "--tokenizer", t, "--val-fraction", "-0.1"],
        ("--val-fraction", "[0, 1)"),
    ),
    Case(
        "--val-fraction nan",
        lambda r, t: [_texts(r / "c"), "--out", r / "o", "--tokenizer", t, "--val-fraction", "nan"],
        ("--val-fraction",),
    ),
    Case(
        "every document drawn to val",
        lambda r, t: [_texts(r / "c", 1), "--out", r / "o", "--tokenizer", t, "--val-fraction", "0.999999"],
        ("no document went to train", "--val-fraction"),
    ),
    Case(
        "--shard-tokens 0",
        lambda r, t: [_texts(r / "c"), "--out", r / "o", "--tokenizer", t, "--shard-tokens", "0"],
        ("--shard-tokens",),
    ),
    Case(
        "--workers 0",
        lambda r, t: [_texts(r / "c"), "--out", r / "o", "--tokenizer", t, "--workers", "0"],
        ("--workers",),
    ),
    Case(
        "--train-tokenizer too small",
        lambda r, t: [_texts(r / "c"), "--out", r / "o", "--train-tokenizer", "100"],
        ("--train-tokenizer 100", "257"),
    ),
    Case("no tokenizer", lambda r, t: [_texts(r / "c"), "--out", r / "o"], ("--tokenizer", "--train-tokenizer")),
    Case(
        "--out inside a source folder",
        lambda r, t: [_texts(r / "c"), "--out", r / "c" / "o", "--tokenizer", t],
        ("--out", "inside"),
    ),
    Case(
        "--out a source file",
        lambda r, t: [_made(r / "a.txt", "x"), "--out", r / "a.txt", "--tokenizer", t],
        ("--out", "a.txt"),
    ),
    Case(
        "--out a file",
        lambda r, t: [_texts(r / "c"), "--out", _made(r / "f", "x"), "--tokenizer", t],
        ("--out", "not a folder"),
    ),
    Case(
        "--out holding foreign files",
        lambda r, t: [_texts(r / "c"), "--out", _made_dir(r / "o", {"notes.txt": "mine"}), "--tokenizer", t],
        ("--out", "notes.txt"),
    ),
    Case(
        "--out a prepared folder with a file of the user's added",
        lambda r, t: [_complete(r, t), "--out", _added(r / "out"), "--tokenizer", t],
        ("--out", "mine.txt"),
    ),
    Case(
        "a symbolic link loop in a source folder",
        lambda r, t: [_loop(r), "--out", r / "o", "--tokenizer", t],
        ("link loop",),
    ),
    Case(
        "a dangling link in a source folder",
        lambda r, t: [_dangling(r), "--out", r / "o", "--tokenizer", t],
        ("gone.txt", "link"),
    ),
    Case(
        "a file named twice",
        lambda r, t: [_texts(r / "c"), r / "c" / "00.txt", "--out", r / "o", "--tokenizer", t],
        ("00.txt", "twice"),
    ),
    Case(
        "a tokenizer that is not one",
        lambda r, t: [_texts(r / "c"), "--out", r / "o", "--tokenizer", _made(r / "tok.json", '{"version": "1"}')],
        ("tok.json", "not a tokenizers tokenizer.json"),
    ),
    Case(
        "a tokenizer that is not JSON",
        lambda r, t: [_texts(r / "c"), "--out", r / "o", "--tokenizer", _made(r / "tok.json", "\x00\x01")],
        ("tok.json",),
    ),
    Case(
        "a tokenizer that is missing",
        lambda r, t: [_texts(r / "c"), "--out", r / "o", "--tokenizer", r / "nope.json"],
        ("nope.json",),
    ),
    Case(
        "a tokenizer without an eos token",
        lambda r, t: [_texts(r / "c"), "--out", r / "o", "--tokenizer", _no_eos_tokenizer(r)],
        ("noeos.json", "end-of-document", EOS),
    ),
    Case(
        "--out being written by another prepare",
        lambda r, t: [_texts(r / "c"), "--out", _locked(r / "o"), "--tokenizer", t],
        ("--out", "another gputrain prepare"),
    ),
    Case(
        "a corpus changed since prepare",
        lambda r, t: [_changed(_complete(r, t)), "--out", r / "out", "--tokenizer", t],
        ("00.txt", "a corpus that changed since prepare"),
    ),
    Case(
        "a file added to the corpus since prepare",
        lambda r, t: [_grown(_complete(r, t)), "--out", r / "out", "--tokenizer", t],
        ("--out", "other source files"),
    ),
    Case(
        "a prepared folder of other settings",
        lambda r, t: [_complete(r, t), "--out", r / "out", "--tokenizer", t, "--seed", "3"],
        ("--out", "other settings", "seed"),
    ),
    Case(
        "a prepared folder of another tokenizer",
        lambda r, t: [_complete(r, t), "--out", r / "out", "--tokenizer", _copied_other(r, t)],
        ("other settings", "tokenizer"),
    ),
]


def _made(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


_LOCKS: list[int] = []


@pytest.fixture(autouse=True)
def _unlocked() -> Iterator[None]:
    yield
    while _LOCKS:
        os.close(_LOCKS.pop())


def _locked(out: Path) -> Path:
    """A folder another prepare holds (flock, as prepare does), not yet written into."""
    out.mkdir()
    fd = os.open(out, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    _LOCKS.append(fd)
    return out


def _made_dir(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def _binary_among_texts(root: Path) -> Path:
    corpus = _texts(root / "c")
    (corpus / "03.txt").write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00" + bytes(range(256)))
    return corpus


def _dangling(root: Path) -> Path:
    corpus = _texts(root / "c")
    (corpus / "gone.txt").symlink_to(root / "nowhere.txt")
    return corpus


def _added(out: Path) -> Path:
    (out / "mine.txt").write_text("a note of mine")
    return out


def _changed(corpus: Path) -> Path:
    first = corpus / "00.txt"
    first.write_text(first.read_text().upper())
    return corpus


def _grown(corpus: Path) -> Path:
    (corpus / "99.txt").write_text("one more document")
    return corpus


def _copied_other(root: Path, tok: Path) -> Path:
    return write_tokenizer(root / "other.json", documents(50, seed=11), vocab_size=320)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_refused_in_one_line_with_nothing_written(
    case: Case, tmp_path: Path, tokenizer: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(work, "BATCH_DOCUMENTS", 4)  # a bad part met mid-way comes after shards were written
    args = [str(a) for a in case.args(tmp_path, tokenizer)]
    before = _tree(tmp_path)
    code, stdout, err = prepare("--workers", "1", *args)
    assert code == 2, err
    assert not stdout
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for part in case.says:
        assert part in lines[0], (part, lines[0])
    assert _tree(tmp_path) == before
