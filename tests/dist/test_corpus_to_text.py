"""Issue 30's whole path, as a user runs it from the command line: a corpus (Python's own email
package) → `gputrain prepare --train-tokenizer` → `gputrain train` on one process, stopped at
step 4 → continued on 2 gloo ranks (`--nproc-per-node 2`) → `gputrain generate` speaks text and
`gputrain evaluate` reports bits per byte. The continuation on the other world size trains the same
steps as an unbroken one-process run (its losses to 1e-5). About 60 s on 2 idle cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(sysconfig.get_paths()["stdlib"]) / "email"
TRAIN = ["model.name=gpt", "model.n_layer=1", "model.n_head=2", "model.d_model=32", "model.dropout=0.0",
         "data.name=tokens", "data.seq_len=32", "data.num_workers=0", "train.batch_size=8", "train.epochs=50",
         "train.seed=0", "optim.name=sgd", "optim.lr=0.3", "log.every_steps=1", "log.tensorboard=false",
         "log.progress=none", "eval.every_epochs=0", "checkpoint.every_steps=4", "train.device=cpu",
         "parallel.strategy=ddp"]


def _gputrain(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "gputrain", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["loss"] for row in rows if "split" not in row}


@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"Python's email package is not at {CORPUS}")
def test_a_corpus_becomes_a_model_that_speaks_on_another_world_size(tmp_path: Path) -> None:
    prepared = tmp_path / "prepared"
    _gputrain("prepare", str(CORPUS), "--glob", "*.py", "--out", str(prepared), "--train-tokenizer", "300",
              "--val-fraction", "0.2", "--workers", "2", "--quiet", cwd=tmp_path)
    manifest = json.loads((prepared / "manifest.json").read_text())
    assert manifest["vocab_size"] == 300 and manifest["splits"]["val"]["bytes"] > 0

    data = [f"data.path={prepared}"]
    _gputrain("train", "--run-dir", "split", *TRAIN, *data, "train.max_steps=4", cwd=tmp_path)
    _gputrain("train", "--run-dir", "split", "--nproc-per-node", "2", *TRAIN, *data, "train.max_steps=8",
              cwd=tmp_path)
    _gputrain("train", "--run-dir", "whole", *TRAIN, *data, "train.max_steps=8", cwd=tmp_path)
    split, whole = _losses(tmp_path / "split"), _losses(tmp_path / "whole")
    assert sorted(split) == sorted(whole) == list(range(1, 9))
    assert split == pytest.approx(whole, rel=1e-5, abs=1e-6)
    summary = json.loads((tmp_path / "split" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2

    env = json.loads((tmp_path / "split" / "env.json").read_text())
    assert env["tokenizer"]["hash"] == manifest["tokenizer"]["hash"]
    said = _gputrain("generate", "split", "--prompt", "def ", "--max-new-tokens", "20", "--seed", "0", cwd=tmp_path)
    assert said.stdout.startswith("def ") and not said.stdout.strip().isdigit()  # text, not ids
    evaluated = _gputrain("evaluate", "split", "--split", "val", cwd=tmp_path)
    assert "bits_per_byte" in evaluated.stdout
