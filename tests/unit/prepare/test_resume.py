"""A prepare killed with SIGKILL (a real process) continues when the same command runs again and ends
with the bytes of an unbroken run: killed before its first state was saved, in the middle (tokens
written past the last saved state), and after the manifest was written but before the state was
removed. A rerun after the corpus changed is refused in one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.prepare.corpus import documents, files_of, prepare

ROOT = Path(__file__).resolve().parents[3]
DOCS = documents(150)
STATE = {".prepare-state.json", ".prepare-sources.json"}
WRITES = 1 + -(-len(DOCS) // 7) + 1
"""The records a run in batches of 7 documents writes: the first state, one a batch, the manifest."""
# The command in a process of its own, batches of 7 documents, killed (SIGKILL) just before its Nth
# write of a record (the resume state's saves, then the manifest), or with N = 0 just before it
# removes the state, the manifest written.
KILLED = """
import os, signal, sys
from gputrain.prepare import manifest, work
work.BATCH_DOCUMENTS = 7
kill_at, writes = int(sys.argv[1]), [0]
write_json, save_state = work.write_json, work._save_state
def kill():
    os.kill(os.getpid(), signal.SIGKILL)
def counted():
    writes[0] += 1
    if writes[0] == kill_at:
        kill()
def manifest_written(path, data):
    counted()
    write_json(path, data)
    if kill_at == 0:
        os.unlink = lambda path: kill()
def state_saved(out, state, first=False):
    counted()
    save_state(out, state, first=first)
work.write_json, work._save_state = manifest_written, state_saved
from gputrain.cli import main
sys.exit(main(["prepare", *sys.argv[2:]]))
"""


def _killed_run(kill_at: int, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """The run in its own process, killed. Its workers end with it: one left waiting would hold the
    captured pipes open, and this would time out."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-c", KILLED, str(kill_at), *map(str, args), "--quiet"]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory: pytest.TempPathFactory, tokenizer_json: Path) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("resume")
    corpus = root / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in DOCS), encoding="utf-8")
    out = root / "unbroken"
    code, _, err = prepare(corpus, "--out", out, "--tokenizer", tokenizer_json, *SETTINGS)
    assert code == 0, err
    return corpus, files_of(out)


SETTINGS = ("--val-fraction", "0.1", "--shard-tokens", "900", "--workers", "2")


@pytest.mark.parametrize(
    ("kill_at", "left"),
    [
        (1, {"tokenizer"}),  # the tokenizer saved, no state yet
        (9, {"tokenizer", *STATE, "part"}),  # a batch's tokens past the saved state
        (WRITES, {"tokenizer", *STATE, "bin"}),  # the shards named, no manifest yet
        (0, {"tokenizer", *STATE, "bin", "manifest.json"}),  # the state not removed yet
    ],
)
def test_killed_then_rerun_ends_with_the_unbroken_bytes(
    kill_at: int, left: set[str], unbroken: tuple[Path, dict[str, str]], tmp_path: Path, tokenizer_json: Path
) -> None:
    corpus, expected = unbroken
    out = tmp_path / "out"
    killed = _killed_run(kill_at, corpus, "--out", out, "--tokenizer", tokenizer_json, *SETTINGS)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    kinds = {p.suffix[1:] if p.suffix in (".part", ".bin") else p.name for p in out.iterdir()}
    assert kinds == left
    code, _, err = prepare(corpus, "--out", out, "--tokenizer", tokenizer_json, *SETTINGS)  # other batches
    assert code == 0, err
    assert files_of(out) == expected


def test_a_corpus_changed_since_is_refused(
    unbroken: tuple[Path, dict[str, str]], tmp_path: Path, tokenizer_json: Path
) -> None:
    corpus, _ = unbroken
    mine = tmp_path / "c.jsonl"
    mine.write_bytes(corpus.read_bytes())
    out = tmp_path / "out"
    assert _killed_run(9, mine, "--out", out, "--tokenizer", tokenizer_json, *SETTINGS).returncode == -signal.SIGKILL
    before = files_of(out)
    mine.write_bytes(corpus.read_bytes().replace(b"fox", b"cat", 1))  # the same size, other bytes
    code, stdout, err = prepare(mine, "--out", out, "--tokenizer", tokenizer_json, *SETTINGS)
    assert code == 2 and not stdout
    assert len(err.strip().splitlines()) == 1 and "a corpus that changed since prepare" in err and str(mine) in err
    assert files_of(out) == before


def test_a_worker_that_dies_is_said_and_the_rerun_continues(
    unbroken: tuple[Path, dict[str, str]], tmp_path: Path, tokenizer_json: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gputrain.prepare import encode, work

    corpus, expected = unbroken
    out = tmp_path / "out"
    real = encode.encode

    def dies_at_document_70(tokenizer, encoding, first, texts, source_bytes):  # type: ignore[no-untyped-def]
        if first <= 70 < first + len(texts):
            os._exit(9)  # as the OOM killer leaves it: no exception, no clean-up
        return real(tokenizer, encoding, first, texts, source_bytes)

    monkeypatch.setattr(work, "BATCH_DOCUMENTS", 7)
    monkeypatch.setattr(encode, "encode", dies_at_document_70)  # the forked workers run it
    monkeypatch.setattr(encode, "_can_fork", lambda: True)  # forked even where the suite left a thread running
    code, _, err = prepare(corpus, "--out", out, "--tokenizer", tokenizer_json, *SETTINGS)
    assert code == 1 and len(err.strip().splitlines()) == 1 and "worker process died" in err, err
    assert (out / ".prepare-state.json").exists() and not (out / "manifest.json").exists()
    monkeypatch.setattr(encode, "encode", real)
    code, _, err = prepare(corpus, "--out", out, "--tokenizer", tokenizer_json, *SETTINGS)
    assert code == 0, err
    assert files_of(out) == expected
