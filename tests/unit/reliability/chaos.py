"""Real `gputrain train` processes to kill, and exact comparisons of what they leave behind.

Shared by the reliability tests (few trials) and `scripts/kill_resume.py` /
`scripts/kill_during_save.py` (the published figures).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[3]

# A tiny deterministic CPU run: digits, a small MLP, every step logged (so progress can be watched).
TINY = ["model.name=mlp", "model.hidden_sizes=[32]", "train.device=cpu", "train.deterministic=true",
        "train.epochs=2", "train.batch_size=64", "optim.schedule=cosine", "log.every_steps=1",
        "log.progress=plain", "log.tensorboard=false", "checkpoint.every_steps=4", "checkpoint.keep_last=2"]
SPEED_KEYS = {"samples_per_s", "tokens_per_s"}


def start_train(run_dir: Path, overrides: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """Launch `python -m gputrain train` on this checkout; output goes to <run_dir>.log."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    log = open(run_dir.with_suffix(".log"), "ab")  # noqa: SIM115 - closed with the process
    return subprocess.Popen([sys.executable, "-m", "gputrain", "train", "--run-dir", str(run_dir), *overrides],
                            cwd=REPO, env=full_env, stdout=log, stderr=subprocess.STDOUT)


def run_train(run_dir: Path, overrides: list[str], env: dict[str, str] | None = None, timeout: float = 300
              ) -> int:
    proc = start_train(run_dir, overrides, env)
    return proc.wait(timeout=timeout)


def logged_step(run_dir: Path) -> int:
    """The highest training step in metrics.jsonl (0 if none yet)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    step = 0
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if "split" not in record:
            step = max(step, record["step"])
    return step


def kill_at_step(proc: subprocess.Popen, run_dir: Path, step: int, sig: int = signal.SIGKILL,
                 timeout: float = 300) -> int | None:
    """Send `sig` once metrics.jsonl shows `step`; return the step seen then, or None if the run ended first."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        seen = logged_step(run_dir)
        if seen >= step:
            proc.send_signal(sig)
            proc.wait(timeout=timeout)
            return seen
        time.sleep(0.002)
    proc.wait(timeout=timeout)
    return None


def train_log(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl without the timing fields, which differ between any two runs."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in SPEED_KEYS} for line in lines]


def last_checkpoint_state(run_dir: Path) -> tuple[str, dict[str, Any]]:
    from gputrain.checkpoint import list_checkpoints

    path = list_checkpoints(run_dir / "checkpoints")[0]
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
    state["loop"].pop("train_time_s")  # wall time, not training state
    return path.name, state


def differences(a: Any, b: Any, where: str = "") -> list[str]:
    """Every place two nested structures of tensors and plain values differ (bit for bit)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a, b))
        return [] if same else [where or "tensor"]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"]
        return [d for k in a for d in differences(a[k], b[k], f"{where}.{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{where}: length {len(a)} vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r} vs {b!r}"]


def compare_runs(reference: Path, resumed: Path) -> list[str]:
    """What differs between an unbroken run and a killed-and-resumed one: per-step log (losses, LR,
    grad norm, evaluations), final weights, and the last checkpoint's optimizer, schedule, RNG,
    loop counters (data position) and scaler."""
    problems = []
    ref_log, res_log = train_log(reference), train_log(resumed)
    if ref_log != res_log:
        first = next((i for i, (x, y) in enumerate(zip(ref_log, res_log)) if x != y), min(len(ref_log), len(res_log)))
        problems.append(f"metrics.jsonl differs from line {first + 1}: "
                        f"{ref_log[first] if first < len(ref_log) else None} vs "
                        f"{res_log[first] if first < len(res_log) else None}")
    if (reference / "model.safetensors").read_bytes() != (resumed / "model.safetensors").read_bytes():
        problems.append("model.safetensors differs")
    ref_name, ref_state = last_checkpoint_state(reference)
    res_name, res_state = last_checkpoint_state(resumed)
    if ref_name != res_name:
        problems.append(f"last checkpoint {ref_name} vs {res_name}")
    problems += [f"checkpoint state{d}" for d in differences(ref_state, res_state)]
    return problems
