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

from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[3]

# A tiny deterministic CPU run: digits, a small MLP, every step logged (so progress can be watched).
TINY = ["model.name=mlp", "model.hidden_sizes=[32]", "train.device=cpu", "train.deterministic=true",
        "train.epochs=2", "train.batch_size=64", "optim.schedule=cosine", "log.every_steps=1",
        "log.progress=plain", "log.tensorboard=false", "checkpoint.every_steps=4", "checkpoint.keep_last=2",
        "checkpoint.max_overhead=0"]  # every 4th step saved, however cheap the steps
# The same run on two gloo ranks (DDP; the global batch, and so the optimisation, stays the same).
TINY_2_RANKS = ["--nproc-per-node", "2", *TINY, "parallel.strategy=ddp", "parallel.timeout_s=30"]
# measured speed and memory: they differ between any two runs (see observe/speed.py::record_fields)
SPEED_KEYS = {"samples_per_s", "tokens_per_s", "step_time_s", "achieved_flops", "mfu", "mfu_formula",
              "peak_memory_bytes"}


def start_train(run_dir: Path, overrides: list[str], env: dict[str, str] | None = None,
                mark_stops: bool = False) -> subprocess.Popen:
    """Launch `python -m gputrain train` on this checkout; output goes to <run_dir>.log. The run gets a
    process group of its own, so a signal can reach all of it (a launcher and its ranks) at once.
    `mark_stops`: each signal the run's stop handler has taken adds a line to `stops_file(run_dir)`,
    so a test knows when a signal has been handled, not only sent (one process: the handler is
    wrapped in the process before the command runs, which is otherwise the same)."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    log = open(run_dir.with_suffix(".log"), "ab")  # noqa: SIM115 - closed with the process
    command = ["-c", _MARKING_STOPS, str(stops_file(run_dir))] if mark_stops else ["-m", "gputrain"]
    return subprocess.Popen([sys.executable, *command, "train", "--run-dir", str(run_dir), *overrides],
                            cwd=REPO, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


_MARKING_STOPS = """
import runpy, sys
from gputrain.run.signals import StopRequest
marks, handle = sys.argv.pop(1), StopRequest._handle
def marking(self, signum, frame):
    try:
        handle(self, signum, frame)
    finally:
        with open(marks, "a") as out:
            out.write(f"{signum}\\n")
StopRequest._handle = marking
sys.argv[0] = "gputrain"
runpy.run_module("gputrain", run_name="__main__", alter_sys=True)
"""


def stops_file(run_dir: Path) -> Path:
    return run_dir.with_suffix(".stops")


def stops_handled(run_dir: Path) -> int:
    """How many signals the run's stop handler has taken (a run started with `mark_stops`)."""
    path = stops_file(run_dir)
    return len(path.read_text().splitlines()) if path.exists() else 0


def second_signal_during_a_save(proc: subprocess.Popen, run_dir: Path, sig: int = signal.SIGTERM) -> str:
    """Once a save is under way, send `sig`; once the run has taken it, send it again. Returns the name
    of the checkpoint that save was writing (`step-N`). The run must have been started with
    `mark_stops` and with slow saves (SAVE_DELAY_ENV), so that the save is still going on meanwhile."""
    checkpoints = run_dir / "checkpoints"
    wait_until(lambda: proc.poll() is not None or bool(list(checkpoints.glob(".step-*.tmp-*"))), what="a save")
    (tmp,) = checkpoints.glob(".step-*.tmp-*")
    proc.send_signal(sig)
    # two signals sent before the first is handled could reach Python's handler as one
    wait_until(lambda: proc.poll() is not None or stops_handled(run_dir) == 1, what="the first signal handled")
    proc.send_signal(sig)
    return tmp.name[1:].split(".tmp-")[0]


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
    """Send `sig` to the run's whole process group (as a terminal's Ctrl-C, or a node dying, reaches every
    process of a job) once metrics.jsonl shows `step`; return the step seen then, or None if the run
    ended first."""
    wait_until(lambda: proc.poll() is not None or logged_step(run_dir) >= step, timeout, f"step {step}")
    if proc.poll() is None:
        seen = logged_step(run_dir)
        os.killpg(proc.pid, sig)
        proc.wait(timeout=timeout)
        return seen
    return None


def train_log(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl without the timing fields, which differ between any two runs."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in SPEED_KEYS and not k.startswith("time_")}
            for line in lines]


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


# ----------------------------------------------------------------------- crash while saving
SAVE_DELAY_ENV = "GPUTRAIN_TEST_SAVE_PHASE_DELAY_S"


def save_phase(checkpoints: Path) -> str:
    """Where an interrupted save stood, from what it left on disk."""
    olds = list(checkpoints.glob(".step-*.old-*"))
    if olds:
        return "between the two renames of a re-save"
    tmps = [p for p in checkpoints.glob(".step-*.tmp-*") if p.is_dir()]
    if not tmps:
        return "no save open (committed, or training)"
    files = {p.name for p in tmps[0].iterdir()}
    for needed, phase in (("COMMITTED", "marker written, before the rename"), ("manifest.json", "manifest written"),
                          ("state.pt", "weights and state written"), ("model.safetensors", "weights written")):
        if needed in files:
            return phase
    return "directory created, nothing written"


def kill_during_save(run_dir: Path, overrides: list[str], target_step: int, delay_s: float, offset_s: float
                     ) -> dict[str, Any] | None:
    """Run with each save phase slowed by `delay_s`; once step `target_step` is logged and the next
    save has opened its temporary directory, wait `offset_s` and SIGKILL. Returns what was left."""
    proc = start_train(run_dir, overrides, env={SAVE_DELAY_ENV: str(delay_s)})
    checkpoints = run_dir / "checkpoints"
    wait_until(lambda: proc.poll() is not None or logged_step(run_dir) >= target_step, what=f"step {target_step}")
    wait_until(lambda: proc.poll() is not None or bool(list(checkpoints.glob(".step-*.tmp-*"))), what="a save",
               poll_s=0.001)
    time.sleep(offset_s)  # the moment inside the save to kill at: what it left is recorded, whichever phase
    if proc.poll() is not None:
        return None
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    return {"killed_at_step": logged_step(run_dir), "phase": save_phase(checkpoints)}


def check_after_crash(run_dir: Path) -> tuple[list[str], Path | None]:
    """No partial file at a final path; return (problems, the checkpoint a resume will use)."""
    from gputrain.checkpoint import CorruptCheckpoint, find_resumable, verify_checkpoint

    problems = []
    for path in (run_dir / "checkpoints").glob("step-*"):
        try:
            verify_checkpoint(path)
        except CorruptCheckpoint as err:
            problems.append(f"partial checkpoint at a final path: {err}")
    for name in ("model.safetensors", "summary.json"):
        if (run_dir / name).exists():
            problems.append(f"{name} exists although the run never finished")
    return problems, find_resumable(run_dir / "checkpoints")


def resumed_from(run_dir: Path, checkpoint: Path) -> bool:
    """Whether the run's console output says it resumed from `checkpoint` (the console wraps lines)."""
    text = "".join(run_dir.with_suffix(".log").read_text().split())
    return f"resumedfrom{checkpoint}(step{checkpoint.name[5:]})" in text


# ----------------------------------------------------------------------- a signal at a known point
def stop_at(run_dir: Path, overrides: list[str], at: str, sig: int = signal.SIGTERM, ranks: int = 1,
            timeout: float = 300) -> int:
    """Run until every rank is held at `at` (gputrain/run/hold.py: "val:38", "test", "final-save",
    "checkpoint:36"), send `sig` to the command (the launcher, with several ranks: it passes the
    signal on), and return its exit code. The ranks wait for the signal there: no sleep, no race."""
    mark = run_dir.with_suffix(".held")
    proc = start_train(run_dir, overrides, env={"GPUTRAIN_TEST_HOLD_AT": at, "GPUTRAIN_TEST_HOLD_MARK": str(mark)})
    wait_until(lambda: proc.poll() is not None or (mark.exists() and len(mark.read_text().split()) >= ranks),
               timeout, f"the run held at {at}")
    assert proc.poll() is None, f"the run ended before {at}: {run_dir.with_suffix('.log').read_text()[-2000:]}"
    proc.send_signal(sig)
    return proc.wait(timeout=timeout)
