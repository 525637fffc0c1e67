"""`evaluate`: a run's model on one of its splits or on new labelled data, with the run's metrics.

The figures come from training's own `Evaluator` (evaluate/evaluator.py), built with the run's task,
`eval.metrics` and evaluation batch size, so the final weights on the test split give exactly the
test metrics the run reported. Under torchrun every rank loads the whole model and evaluates its
share of the data; the metrics and the kept scores are combined (plain DDP's evaluation).

A language model's figures are its mean token loss and perplexity (exp of it), and bits per byte
(loss × tokens / (bytes × ln 2)) where the text's UTF-8 bytes are known: a prepared folder's split
(its manifest.json), or a text file given as new data and read through the run's tokenizer.

Written beside the run's own files (or to `out_dir`): `eval-<name>.json` (the metrics, which
weights, which data) and `scores-<name>.npz` (evaluate/scores.py: per-sample probabilities or
predictions, for the report). The name is the split's (`test`), with the weights' kind where they
are not the final ones (`test-best`) and `-custom` where data overrides rebuilt the split
(`test-custom`), or the new data file's stem (`new` for data.path=new.csv).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from gputrain.config import Config, load_config, resolve_grad_accum
from gputrain.data.pixels import pixel_scaler_for
from gputrain.distributed.context import DistContext, env_world, init_distributed, rank_device
from gputrain.errors import UsageError
from gputrain.evaluate.evaluator import EvalSpec, Evaluator, resolve_metrics
from gputrain.evaluate.layout import eval_layout
from gputrain.evaluate.metrics import bits_per_byte
from gputrain.evaluate.scores import Scores, is_scores_file, save_scores
from gputrain.precision import Precision
from gputrain.run.files import write_json
from gputrain.run.layout import CONFIG, eval_record_name, scores_name
from gputrain.run.output import Owner, check_output_file, check_output_folder, json_record, make_folder, marked, shared
from gputrain.switches import apply_process_switches
from gputrain.train.tasks import resolve_task
from gputrain.use.loaded import LoadedRun, data_overrides, load_run
from gputrain.use.new_data import TextSize, check_new_data_overrides, read_new_data
from gputrain.use.options import use_device

log = logging.getLogger("gputrain")

SPLITS = ("test", "val", "train")
EVAL_RECORD = json_record("evaluate", "name", "split", "weights", "metrics", "samples")
"""Recognizes an eval-<name>.json evaluate wrote (run/output.py)."""
DEFAULT_EVAL_BATCH = 256
"""Samples per forward pass where the run's batch is unknown (train.batch_size=auto, never resolved)."""


@dataclass(frozen=True, slots=True)
class EvalResult:
    name: str
    metrics: dict[str, float]
    record: dict[str, Any]
    """What eval-<name>.json holds."""
    scores: Scores | None
    files: list[Path]
    """What was written (rank 0; none elsewhere)."""


def evaluate_run(
    run_dir: str | Path,
    *,
    checkpoint: str = "final",
    device: str = "auto",
    split: str = "test",
    overrides: Iterable[str] = (),
    name: str | None = None,
    batch_size: int | None = None,
    out_dir: str | Path | None = None,
) -> EvalResult:
    """Evaluate the run at `run_dir` (module docstring).

    Args:
        split: test, val or train: the run's own split (ignored when the overrides name new data).
        overrides: data overrides; `data.path=...` names new data, read whole.
        name: the files' name (default: module docstring).
        batch_size: samples per forward pass (default: the run's evaluation batch).

    Raises:
        UsageError: a bad run directory, weights, split, override, or data that does not fit the model.
    """
    overrides = data_overrides(overrides)
    new = check_new_data_overrides(overrides)
    dist, where = _join(device)
    loaded = load_run(run_dir, checkpoint=checkpoint, device=where, overrides=() if new else overrides)
    config = loaded.config
    apply_process_switches(loaded.device, loaded.precision, config.train.deterministic)  # as the run had them
    transform: Callable[[Any], Any] | None
    size: TextSize | None = None
    if new:
        data_config = load_config(loaded.run_dir / CONFIG, overrides).data
        data, size = read_new_data(loaded.pre, data_config, loaded.tokenizer)
        name = name or _stem(Path(data_config.val_path or data_config.path or "new"))
        transform = _preprocess_on(loaded)
    else:
        data = _split(loaded, split)
        name = name or _split_name(split, loaded, custom=bool(overrides))
        data_config = config.data
        size = prepared_split_size(data_config.path, split) if loaded.pre.task == "lm" else None
        transform = pixel_scaler_for(loaded.data.spec, data, loaded.device)  # as training evaluates
    _check_name(name)
    # where the files go, judged on every rank alike before the evaluation: never over the inputs,
    # another run's files or a file gputrain did not write
    out = Path(out_dir) if out_dir is not None else loaded.run_dir
    option = "--output-dir" if out_dir is not None else "--output-dir (default)"
    owner = Owner.of(
        runs=[loaded.run_dir],
        designated=[eval_record_name("*"), scores_name("*")],
        inputs=[loaded.weights.path, data_config.path, data_config.val_path],
    )
    if out_dir is not None:  # a folder of the user's takes the two files beside theirs, not through a link
        check_output_folder(out, option, owner, shared)
    check_output_file(out / eval_record_name(name), option, owner, EVAL_RECORD)
    check_output_file(out / scores_name(name), option, owner, is_scores_file)
    task = resolve_task(loaded.model, data, spec=loaded.data.spec, loss_fn=None, step_fn=None)
    layout = eval_layout(dist, loaded.device, batch_size or _run_eval_batch(config))  # the whole model on each rank
    spec = EvalSpec(
        task, resolve_metrics(config.eval.metrics, task.kind), Precision(loaded.precision, loaded.device).autocast
    )
    evaluator = Evaluator(
        loaded.model, loaded.model, spec, layout, batch_transform=transform, on_error=data_config.on_error
    )
    start = time.perf_counter()
    result = evaluator.evaluate(data, name, keep_scores=True)
    metrics, scores = result.metrics, result.scores
    if size is not None and "loss" in metrics and size.bytes:
        metrics["bits_per_byte"] = bits_per_byte(metrics["loss"], size.tokens, size.bytes)
    record = {
        "name": name,
        "split": None if new else split,
        "data": {"name": data_config.name, "path": data_config.val_path or data_config.path, "new": new},
        "weights": loaded.weights.to_dict(),
        "samples": len(data),  # type: ignore[arg-type]
        "skipped": result.skipped,
        "metrics": metrics,
        "device": str(loaded.device),
        "precision": loaded.precision,
        "world_size": dist.world_size,
        "wall_s": round(time.perf_counter() - start, 3),
        "scores": scores_name(name) if scores is not None else None,
        "text": {"tokens": size.tokens, "bytes": size.bytes} if size is not None else None,
        **marked("evaluate"),
    }
    files = _write(out, option, name, record, scores, dist)
    return EvalResult(name, metrics, record, scores, files)


PREPARED_MANIFEST = "manifest.json"
"""A prepared data folder's record (`gputrain prepare`): each split's tokens and UTF-8 bytes."""
_MANIFEST_LIMIT = 64 << 20


def prepared_split_size(data_path: str | None, split: str) -> TextSize | None:
    """The tokens and text bytes of `split` of a prepared folder at `data_path`, from its manifest;
    None where data_path is not one, or its manifest does not say (bits per byte are then left out)."""
    manifest = Path(data_path) / PREPARED_MANIFEST if data_path else None
    if manifest is None or not manifest.is_file() or manifest.stat().st_size > _MANIFEST_LIMIT:
        return None
    try:
        entry = json.loads(manifest.read_bytes()).get("splits", {}).get(split, {})
    except (OSError, ValueError, AttributeError, RecursionError):
        return None
    tokens, size = (entry.get("tokens"), entry.get("bytes")) if isinstance(entry, dict) else (None, None)
    if type(tokens) is not int or type(size) is not int or tokens <= 0 or size <= 0:
        return None
    return TextSize(tokens, size)


def _run_eval_batch(config: Config) -> int:
    """Training's evaluation batch: its micro-batch (the global batch over the accumulation steps).
    config.toml records the batch that ran; `auto` is left only in a run that stopped before deciding it."""
    batch = config.train.batch_size
    if not isinstance(batch, int):
        return DEFAULT_EVAL_BATCH
    return max(1, batch // resolve_grad_accum(config, 1))


def _join(device: str) -> tuple[DistContext, str]:
    """This process's place in a torchrun job (one process: world size 1), and its device: under
    torchrun on GPUs, each rank its own."""
    where = use_device(device)
    _, world, local_rank = env_world()
    if world > 1 and where.type == "cuda":
        where = rank_device(local_rank)
    return init_distributed(where), str(where)


def _split(loaded: LoadedRun, split: str) -> Dataset:
    if split not in SPLITS:
        raise UsageError(f"--split {split!r}: choose from {', '.join(SPLITS)}")
    data = getattr(loaded.data, split)
    if data is None:
        held = [s for s in SPLITS if getattr(loaded.data, s) is not None]
        raise UsageError(
            f"the run's data has no {split} split (data.{split}_fraction = 0?); it has {', '.join(held)}; "
            "or evaluate new data with data.path=..."
        )
    return data


def _split_name(split: str, loaded: LoadedRun, custom: bool) -> str:
    weights = loaded.weights
    name = split
    if weights.kind == "path":
        name = f"{split}-step-{weights.step}" if weights.step is not None else f"{split}-{_stem(weights.path)}"
    elif weights.kind != "final":
        name = f"{split}-{weights.kind}"
    # the split rebuilt differently (data.max_eval_samples=...) is not the run's own: never replace
    # the scores-test.npz training wrote, which the report reads
    return f"{name}-custom" if custom else name


def _stem(path: Path) -> str:
    stem = path.name if path.is_dir() or not path.suffix else path.stem
    return re.sub(r"[^A-Za-z0-9._-]+", "_", stem).strip("._") or "new"


def _check_name(name: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise UsageError(f"--name {name!r}: use letters, digits, '.', '_' and '-' (it names eval-<name>.json)")


def _preprocess_on(loaded: LoadedRun) -> Callable[[Any], Any]:
    """New data's batch function: the run's preprocessing of the inputs, on the device."""
    transform = loaded.pre.transform().to(loaded.device)

    @torch.no_grad()
    def apply(batch: Any) -> Any:
        return [transform(batch[0]), *batch[1:]]

    return apply


def _write(
    out_dir: Path, option: str, name: str, record: dict[str, Any], scores: Scores | None, dist: DistContext
) -> list[Path]:
    if not dist.is_main:
        return []
    make_folder(out_dir, option)
    files = [out_dir / eval_record_name(name)]
    write_json(files[0], record)
    if scores is not None:
        files.append(out_dir / scores_name(name))
        save_scores(files[1], scores)
    return files
