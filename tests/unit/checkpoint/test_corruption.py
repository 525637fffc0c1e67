"""Damaged checkpoints are caught by the checksums before any state is applied, and resume falls
back to the previous valid one (issue 7, figure 3)."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from gputrain.checkpoint import CorruptCheckpoint, find_resumable, load_checkpoint, save_checkpoint
from gputrain.errors import RunError
from tests.unit.reliability.chaos import REPO, TINY, compare_runs

FILES = ["model.safetensors", "state.pt", "manifest.json", "COMMITTED"]


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """checkpoints/step-4 and step-8, as the trainer writes them (weights + optimizer/RNG state)."""
    root = tmp_path_factory.mktemp("pristine") / "checkpoints"
    for step in (4, 8):
        model = _model(step)
        optimizer = torch.optim.AdamW(model.parameters())
        model(torch.randn(3, 6)).sum().backward()
        optimizer.step()
        save_checkpoint(root, step, model, {"optimizer": optimizer.state_dict(), "rng": torch.get_rng_state(),
                                            "loop": {"global_step": step}})
    return root


def damage(path: Path, rng: random.Random) -> str:
    """Damage one checkpoint directory in one of the ways disks and interrupted copies do."""
    kind = rng.choice(["truncate", "bitflip", "delete", "no_marker"])
    name = "COMMITTED" if kind == "no_marker" else rng.choice(FILES)
    file = path / name
    if kind in ("delete", "no_marker"):
        file.unlink()
    elif kind == "truncate":
        data = file.read_bytes()
        file.write_bytes(data[:rng.randrange(len(data))])
    else:
        data = bytearray(file.read_bytes())
        offset = rng.randrange(len(data))
        data[offset] ^= 1 << rng.randrange(8)
        file.write_bytes(bytes(data))
    return f"{kind} {name}"


def test_100_damaged_checkpoints_are_all_detected_before_any_state_is_applied(
        pristine: Path, tmp_path: Path, gputrain_warnings: list[str]) -> None:
    rng = random.Random(3)
    kinds: dict[str, int] = {}
    for trial in range(100):
        root = tmp_path / f"t{trial}" / "checkpoints"
        shutil.copytree(pristine, root)
        how = damage(root / "step-8", rng)
        kinds[how.split()[0]] = kinds.get(how.split()[0], 0) + 1
        model = _model(99)
        before = [p.detach().clone() for p in model.parameters()]
        with pytest.raises(CorruptCheckpoint, match="step-8"):
            load_checkpoint(root / "step-8", model)
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())), f"{how}: weights were applied"
        gputrain_warnings.clear()
        assert find_resumable(root) == root / "step-4", how
        warnings = list(gputrain_warnings)
        assert len(warnings) == 1 and "\n" not in warnings[0], warnings
        assert warnings[0].startswith("skipping damaged checkpoint: ") and str(root / "step-8") in warnings[0]
        load_checkpoint(root / "step-4", model)  # the fallback itself is intact
    assert min(kinds.values()) >= 15, kinds  # every kind of damage was exercised


def test_no_valid_checkpoint_is_an_error_never_a_restart(pristine: Path, tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    shutil.copytree(pristine, root)
    (root / "step-8" / "state.pt").write_bytes(b"")
    (root / "step-4" / "COMMITTED").unlink()
    with pytest.raises(RunError) as err:
        find_resumable(root)
    message = str(err.value)
    assert message.startswith("no valid checkpoint to resume from: ")
    assert "step-8: state.pt does not match its checksum" in message
    assert "step-4: incomplete (no COMMITTED marker)" in message
    assert "checkpoint.resume=never" in message


def test_only_unfinished_temporaries_means_a_fresh_start(tmp_path: Path) -> None:
    (tmp_path / "checkpoints" / ".step-4.tmp-123").mkdir(parents=True)
    assert find_resumable(tmp_path / "checkpoints") is None


def _cli(run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gputrain", "train", "--run-dir", str(run_dir), *TINY],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_cli_resume_skips_a_damaged_latest_checkpoint(reference_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(reference_run, run_dir)
    _as_if_killed(run_dir)  # a complete run is never trained again: this one was stopped before its end
    latest = sorted((run_dir / "checkpoints").iterdir(), key=lambda p: int(p.name[5:]))[-1]
    data = bytearray((latest / "model.safetensors").read_bytes())
    data[len(data) // 2] ^= 0x10
    (latest / "model.safetensors").write_bytes(bytes(data))
    done = _cli(run_dir)
    assert done.returncode == 0, done.stderr
    warning = [line for line in done.stderr.splitlines() if "damaged" in line]
    assert warning == [f"WARNING: skipping damaged checkpoint: {latest}: model.safetensors does not match its "
                       "checksum"], done.stderr
    assert "resumed from" in done.stdout + done.stderr
    assert compare_runs(reference_run, run_dir) == []  # redoing the lost steps gives the same run

    _as_if_killed(run_dir)
    for path in (run_dir / "checkpoints").iterdir():
        (path / "state.pt").write_bytes(b"\0" * 16)
    log_before = (run_dir / "metrics.jsonl").read_bytes()
    failed = _cli(run_dir)
    assert failed.returncode == 1
    assert "no valid checkpoint to resume from" in failed.stderr and "Traceback" not in failed.stderr
    assert (run_dir / "metrics.jsonl").read_bytes() == log_before  # nothing restarted
    assert not (run_dir / "model.safetensors").exists()
    summary = run_dir / "summary.json"
    assert not summary.exists() or json.loads(summary.read_text())["status"] == "failed"


def _as_if_killed(run_dir: Path) -> None:
    """What a run killed before its end leaves: no summary, no final weights."""
    (run_dir / "summary.json").unlink()
    (run_dir / "model.safetensors").unlink()
