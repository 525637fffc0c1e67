"""A run's model on new inputs (use/inputs.py), as CSV rows: one per input, named by its file or line.

Classification gives each class's probability (`p_<class>`, softmax of the model's outputs) and the
predicted class, or, for images and with `top_k`, the k most probable classes and their probabilities.
Regression gives the predicted values, under the run's label column name.
"""

from __future__ import annotations

import csv
import io
import itertools
from collections.abc import Iterator
from pathlib import Path

import torch

from gputrain.data.csv_table import is_number
from gputrain.precision import Precision
from gputrain.run.output import head
from gputrain.switches import apply_process_switches
from gputrain.use.inputs import InputBatch, read_inputs
from gputrain.use.loaded import LoadedRun

IMAGE_TOP_K = 5
"""Classes listed per image when --top-k is not given."""


def prediction_rows(
    loaded: LoadedRun, path: Path, *, top_k: int | None = None, batch_size: int = 256
) -> Iterator[list[str]]:
    """The header, then one row per input at `path`.

    Args:
        top_k: list the k most probable classes instead of every class's probability (default:
            IMAGE_TOP_K for image inputs, every class for rows).

    Raises:
        UsageError (DataError): the inputs do not match the model (naming what it reads).
    """
    apply_process_switches(loaded.device, loaded.precision, loaded.config.train.deterministic)  # as the run had them
    pre = loaded.pre
    served = loaded.served()
    batches = read_inputs(path, pre, batch_size)
    first = next(batches)
    if top_k is None and pre.class_names is not None and _are_images(path):
        top_k = IMAGE_TOP_K
    yield _header(loaded, top_k)
    for batch in itertools.chain((first,), batches):
        outputs = _outputs(served, batch, loaded)
        for name, out in zip(batch.names, outputs):
            yield [name, *_cells(loaded, out, top_k)]


def _are_images(path: Path) -> bool:
    return path.is_dir() or path.suffix.lower() not in (".csv", ".npy")


@torch.no_grad()
def _outputs(served: torch.nn.Module, batch: InputBatch, loaded: LoadedRun) -> torch.Tensor:
    """The model's outputs for a batch, float32 on the host: probabilities (classification) or values."""
    with Precision(loaded.precision, loaded.device).autocast():
        outputs = served(batch.raw.to(loaded.device)).float()
    if loaded.pre.task == "classification":
        outputs = outputs.softmax(dim=-1)
    return outputs.reshape(len(batch.raw), -1).cpu()


def _header(loaded: LoadedRun, top_k: int | None) -> list[str]:
    pre = loaded.pre
    if pre.class_names is None:
        width = loaded.data.spec.num_model_outputs
        name = pre.table.label if pre.table is not None else "prediction"
        return ["input", *([name] if width == 1 else [f"{name}_{i}" for i in range(width)])]
    if top_k is not None:
        k = min(top_k, len(pre.class_names))
        return ["input", *[f"{what}{i + 1}" for i in range(k) for what in ("class", "p")]]
    return ["input", "predicted", *[f"p_{name}" for name in pre.class_names]]


def _cells(loaded: LoadedRun, out: torch.Tensor, top_k: int | None) -> list[str]:
    names = loaded.pre.class_names
    if names is None:
        return [_number(v) for v in out.tolist()]
    if top_k is not None:
        probs, classes = out.topk(min(top_k, len(names)))
        return [cell for c, p in zip(classes.tolist(), probs.tolist()) for cell in (names[c], _number(p))]
    return [names[int(out.argmax())], *[_number(p) for p in out.tolist()]]


def _number(value: float) -> str:
    return f"{value:.9g}"  # 9 significant digits: a float32 reads back exactly


def written_by_predict(path: Path) -> bool:
    """Whether the CSV at `path` reads as predict's own output (run/output.py's recognizer: -o replaces
    nothing else): its header is one predict writes (`input`, then `predicted` and `p_<class>`
    columns, `class1,p1,...`, or the predicted values' columns, whose first row is numbers)."""
    rows = list(itertools.islice(csv.reader(io.StringIO(head(path, 1 << 16).decode("utf-8", "replace"))), 2))
    if not rows or len(rows[0]) < 2 or rows[0][0] != "input":
        return False
    columns = rows[0][1:]
    if columns[0] == "predicted":
        return all(c.startswith("p_") for c in columns[1:])
    if columns == [f"{what}{i // 2 + 1}" for i, what in zip(range(len(columns)), itertools.cycle(("class", "p")))]:
        return True
    return len(rows) > 1 and len(rows[1]) == len(rows[0]) and all(is_number(cell) for cell in rows[1][1:])
