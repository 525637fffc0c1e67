"""What a run directory holds, named once: every file and folder a run (or a command reading or
adding to a run) writes there, what it holds and who writes it.

Every module that reads or writes a run's file takes its name from here, so the layout is read in
one place and a rename is one line (tests/unit/run/test_layout.py keeps the names out of the rest
of the package). This module imports nothing of gputrain and no torch: config/paths.py checks
`checkpoint.resume` (with `checkpoints_folder`, below), and the CLI answers, before torch loads.

Reading a run's file goes through run/reader.py (no link out, the right kind, a bounded size, a
checked shape: run/shapes.py). What is read stays with its reader, by these names: use/run_dir.py chooses the
weights `--checkpoint` means (the use commands' policy; verifying a checkpoint needs
checkpoint/io.py, and so torch), report/rundir.py reads what a report shows, and config/paths.py
judges `checkpoint.resume` as a config field, in messages naming it.

    runs/NAME/
      config.toml            the resolved config (run/files.py, at the start); `--config` loads it
      env.json               the machine's facts and the start's device, precision and ranks (run/files.py)
      metrics.jsonl          one JSON line per logged step and evaluation (train/metrics.py, rank 0)
      tensorboard/           the same figures for TensorBoard, with train.tensorboard (train/metrics.py)
      trackers.json          the MLflow run (tracking URI, run id) and W&B run id this run logs to, so a
                             resumed run continues them (observe/trackers.py, rank 0)
      wandb/                 W&B's offline run files, with log.wandb (observe/wandb_sink.py)
      checkpoints/step-N/    a checkpoint per save (checkpoint/io.py, by way of train/checkpointer.py):
        COMMITTED              written last: the checkpoint is whole
        manifest.json          each file's SHA-256 and size
        model.safetensors      the weights (one process), or DCP shards and .metadata (sharded)
        state.pt               optimizer, scheduler, RNG and loop state
      model.safetensors      the final weights (train/trainer.py, rl/trainer.py, at the end)
      model-ema.safetensors  the EMA callback's average of the weights, at the end (train/ema.py)
      scores-SPLIT.npz       a split's saved scores (train/trainer.py at the end; `gputrain evaluate`)
      eval-NAME.json         an evaluation's record (`gputrain evaluate`, default --output-dir)
      summary.json           the result, written at every ending (run/record.py)
      error.log              a failure's traceback, rank 0 (run/record.py); error-rankN.log another rank's
      memory-rankN.json      rank N's peak memory, left where the ranks ended without meeting (run/left_memory.py)
      lr_find.json           an LR sweep's curve (`gputrain lr-find`, in a directory of its own)
      tune.json              `gputrain tune`'s measured layouts and winner (in a directory of its own)
      trace.json, profile.json, memory_snapshot.pickle
                             `gputrain profile` (observe/profiler.py); -rankN before the suffix per rank
      report.html            `gputrain report` of one run (report/build.py)
      tokenizer/             the tokenizer the run's token ids mean (run/tokenizer.py, rank 0 at the start):
        tokenizer_meta.json    its kind, hash, vocabulary size and eos id; its file(s) beside (text/tokenizer.py)
      bench-infer.json       `gputrain bench-infer`'s figures
      export/FORMAT/         `gputrain export` without -o: export.json and the files it lists

A safetensors export (use/artifacts.py) writes its weights and config under the same names as the
run's, so the folder reads like a run's for the loaders.
"""

from __future__ import annotations

import os
from pathlib import Path

# ----------------------------------------------------------------- files under fixed names

CONFIG = "config.toml"
"""The run's resolved config (`auto` kept), loadable with --config; its presence marks a run directory."""
ENV = "env.json"
"""The doctor's facts about the machine, with the start's resolved device, precision and layout as "run"."""
METRICS = "metrics.jsonl"
"""One JSON object per logged step or evaluation, appended as the run goes (rank 0)."""
SUMMARY = "summary.json"
"""The run's result and status, written at every ending (completed, stopped, interrupted, failed)."""
ERROR_LOG = "error.log"
"""Rank 0's traceback of a failure; other ranks' go to `error_log_name(rank)`."""
FINAL_WEIGHTS = "model.safetensors"
"""The weights the run ended with; also the weights file inside a one-process checkpoint."""
EMA_WEIGHTS = "model-ema.safetensors"
"""The EMA callback's average of the weights at the run's end (train/ema.py), written as FINAL_WEIGHTS is."""
LR_FIND = "lr_find.json"
"""`gputrain lr-find`'s sweep: its curve and suggestion (the only file a sweep writes)."""
TUNE = "tune.json"
"""`gputrain tune`'s candidates, figures, winner and fingerprints (the only file a tune writes)."""
REPORT = "report.html"
"""`gputrain report`'s page when it is given one run and no -o."""
BENCH_INFER = "bench-infer.json"
"""`gputrain bench-infer`'s figures."""
EXPORT = "export"
"""`gputrain export`'s folders without -o: export/FORMAT."""
EXPORT_RECORD = "export.json"
"""What an export folder holds: its format, its files (and nothing else is there) and their verification."""

TRACKERS = "trackers.json"
"""The experiment trackers' runs this run logs to (MLflow's tracking URI and run id, W&B's run id):
a resumed run continues the same ones."""

# ----------------------------------------------------------------- folders

CHECKPOINTS = "checkpoints"
"""The run's checkpoints, one `step-N` folder each."""
TENSORBOARD = "tensorboard"
"""TensorBoard's event files (train.tensorboard)."""
WANDB = "wandb"
"""Weights & Biases' run files (log.wandb): offline-run-*/ folders that `wandb sync` uploads."""
TOKENIZER = "tokenizer"
"""The tokenizer the run's ids mean, as text/tokenizer.py's `Tokenizer.save` writes it (also in a
prepared data folder and beside an export)."""

# ----------------------------------------------------------------- inside a checkpoint (checkpoint/io.py writes them)

CHECKPOINT_MARKER = "COMMITTED"
"""Written last: a checkpoint without it was cut short."""
CHECKPOINT_MANIFEST = "manifest.json"
"""Each file's SHA-256 and size, verified before a resume."""
CHECKPOINT_WEIGHTS = FINAL_WEIGHTS
"""A one-process checkpoint's weights: the same name as the run's final weights."""
CHECKPOINT_STATE = "state.pt"
"""Optimizer, scheduler, RNG and loop state."""
CHECKPOINT_PREFIX = "step-"
CHECKPOINT_GLOB = f"{CHECKPOINT_PREFIX}*"
"""Matches a checkpoint folder's name (`step_of_name` tells a real one)."""


def checkpoint_name(step: int) -> str:
    """The folder of step `step`'s checkpoint inside `checkpoints/`: `step-100`."""
    return f"{CHECKPOINT_PREFIX}{step}"


def step_of_name(name: str) -> int | None:
    """The step a checkpoint folder's name says (`step-100` → 100), or None for any other name."""
    digits = name.removeprefix(CHECKPOINT_PREFIX)
    return int(digits) if digits != name and digits.isdigit() else None


# ----------------------------------------------------------------- files named for a rank, a split, an evaluation


def error_log_name(rank: int) -> str:
    """Where rank `rank`'s traceback goes: error.log for rank 0, error-rank<N>.log for another."""
    return ERROR_LOG if rank == 0 else f"error-rank{rank}.log"


def memory_name(rank: int | str) -> str:
    """Rank `rank`'s peak memory at an ending its peers did not share (a failure): rank 0's
    summary.json takes it where it is there in time (run/left_memory.py). `"*"`: the files' pattern."""
    return f"memory-rank{rank}.json"


def scores_name(split: str) -> str:
    """A split's (or a named evaluation's) saved scores: probabilities or predictions with targets."""
    return f"scores-{split}.npz"


def eval_record_name(name: str) -> str:
    """`gputrain evaluate`'s record of one evaluation: metrics, weights, data and speed."""
    return f"eval-{name}.json"


def _per_rank(stem: str, suffix: str, rank: int | None) -> str:
    return f"{stem}{'' if rank is None else f'-rank{rank}'}{suffix}"


def trace_name(rank: int | None) -> str:
    """`gputrain profile`'s Chrome trace; `rank` where several ranks each write one."""
    return _per_rank("trace", ".json", rank)


def profile_name(rank: int | None) -> str:
    """`gputrain profile`'s facts, findings and top ops."""
    return _per_rank("profile", ".json", rank)


def memory_snapshot_name(rank: int | None) -> str:
    """`gputrain profile`'s CUDA memory history (on CUDA only)."""
    return _per_rank("memory_snapshot", ".pickle", rank)


# ----------------------------------------------------------------- the groups the code needs

RUN_DIRS = (CHECKPOINTS, TENSORBOARD, TOKENIZER, WANDB)
"""Entries a run writes as directories (checked for their kind and for links leading out)."""
RUN_FILES = (CONFIG, ENV, SUMMARY, METRICS, ERROR_LOG, FINAL_WEIGHTS, EMA_WEIGHTS, TRACKERS)
"""Entries a training run writes as regular files under fixed names: what run/files.py checks
before a run writes there, and what run/prior.py calls foreign where no run wrote them."""
RUN_FILE_PATTERNS = (
    "error-rank*.log",
    memory_name("*"),
    scores_name("*"),
    "trace*.json",
    "profile*.json",
    "memory_snapshot*.pickle",
)
"""Files a run writes under names of these forms (a rank's, a split's, a profile's)."""
REPORTED_FILES = (CONFIG, METRICS, SUMMARY, LR_FIND, TUNE)
"""What identifies a directory to `gputrain report` as a run's: one of these at least (lr_find.json
alone: an LR sweep's directory). Unlike RUN_FILES it has the sweep's file, and leaves out what
every run that wrote anything also has one of these beside (env.json, error.log, the weights)."""


# ----------------------------------------------------------------- reading it (checkpoint.resume, before torch loads)


def is_checkpoint_dir(path: Path) -> bool:
    """Whether `path` is a checkpoint itself: its marker or manifest is there (whether it is whole
    is checkpoint/io.py's verification)."""
    return any(os.path.lexists(path / name) for name in (CHECKPOINT_MARKER, CHECKPOINT_MANIFEST))


def checkpoints_folder(path: Path) -> Path | None:
    """The checkpoints folder whose latest checkpoint `checkpoint.resume=PATH` means: PATH when it
    holds step-N checkpoints, PATH/checkpoints for a run directory; None where PATH is a checkpoint
    itself or none of these."""
    if is_checkpoint_dir(path):
        return None
    for root in (path, path / CHECKPOINTS):
        if root.is_dir() and any(p.is_dir() for p in root.glob(CHECKPOINT_GLOB)):
            return root
    return None
