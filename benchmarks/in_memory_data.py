"""The data people already have in memory, each kind through `Trainer.fit` with `data.num_workers=auto`.

The tiny MLP (32 → 64 → 10, 4,096 samples, batch 64, 20 epochs, no validation, nothing logged to
TensorBoard, no checkpoints) on the same tensors held as: a TensorDataset of 2, 3 or 1 tensors, a
ConcatDataset of two TensorDatasets, nested Subsets of one, and two Dataset subclasses of the user's
own that return rows of the tensors (a pair, a dict). Each run is a process of its own; its figure
is the CPU time of the process and its children (loader workers) and the wall time of building the
Trainer and fitting, after a throwaway optimizer step (torch imports parts of itself at a first
step). The table gives the median of `--rounds` runs, and which path the data took: batch indexing
(in memory), or a DataLoader with N workers.

    python benchmarks/in_memory_data.py [--rounds 3] [--before OTHER_CHECKOUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
KINDS = (
    "TensorDataset(x, y)",
    "TensorDataset(x, y, w)",
    "TensorDataset(x)",
    "ConcatDataset of TensorDatasets",
    "Subset(Subset(TensorDataset))",
    "Dataset returning x[i], y[i]",
    "Dataset returning a dict",
)


def _case(kind: str) -> tuple[Any, dict[str, Any]]:
    """(the data set, the Trainer's extra arguments) of one kind, on the same tensors."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data import ConcatDataset, Dataset, Subset, TensorDataset

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4096, 32, generator=g), torch.randint(0, 10, (4096,), generator=g)

    class Pairs(Dataset):
        def __len__(self) -> int:
            return len(x)

        def __getitem__(self, i: int) -> tuple[Any, Any]:
            return x[i], y[i]

    class Records(Dataset):
        def __len__(self) -> int:
            return len(x)

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"features": x[i], "label": y[i]}

    cases: dict[str, tuple[Any, dict[str, Any]]] = {
        KINDS[0]: (TensorDataset(x, y), {}),
        KINDS[1]: (
            TensorDataset(x, y, torch.ones(4096)),
            {"step_fn": lambda m, b: (F.cross_entropy(m(b[0]), b[1], reduction="none") * b[2]).mean()},
        ),
        KINDS[2]: (TensorDataset(x), {"step_fn": lambda m, b: m(b[0]).square().mean()}),
        KINDS[3]: (ConcatDataset([TensorDataset(x[:2048], y[:2048]), TensorDataset(x[2048:], y[2048:])]), {}),
        KINDS[4]: (Subset(Subset(TensorDataset(x, y), range(4096)), range(4096)), {}),
        KINDS[5]: (Pairs(), {}),
        KINDS[6]: (Records(), {"step_fn": lambda m, b: F.cross_entropy(m(b["features"]), b["label"])}),
    }
    return cases[kind]


def child(kind: str, tree: Path) -> None:
    # first: importing _common puts this checkout at the front of sys.path, and the tree measured goes before it
    from _common import cpu_and_wall

    sys.path.insert(0, str(tree))
    import torch
    import torch.nn.functional as F
    from torch import nn

    import gputrain.train.trainer  # noqa: F401 - imported before the clock, as in peers.py
    from gputrain import Trainer

    torch.set_num_threads(1)
    data, kwargs = _case(kind)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    warm = torch.optim.AdamW(model.parameters())
    F.cross_entropy(model(torch.randn(64, 32)), torch.randint(0, 10, (64,))).backward()
    warm.step()
    model.zero_grad(set_to_none=True)
    config = {
        "train.device": "cpu",
        "log.progress": "none",
        "log.tensorboard": False,
        "train.epochs": 20,
        "checkpoint.enabled": False,
        "data.num_workers": "auto",
        "train.num_threads": 1,
    }
    with tempfile.TemporaryDirectory() as tmp:

        def fit() -> Trainer:
            trainer = Trainer(model, data, config=config, run_dir=Path(tmp) / "run", **kwargs)
            trainer.fit()
            return trainer

        trainer, cpu, wall = cpu_and_wall(fit)
    loader = trainer.parts.feed.loader
    path = "in memory" if loader is None else f"{loader.num_workers} workers"
    print(json.dumps({"cpu_s": cpu, "wall_s": wall, "path": path}))


def run_one(kind: str, tree: Path) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, __file__, "--child", kind, "--tree", str(tree)], capture_output=True, text=True, env=env
    )
    rows = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not rows:
        raise SystemExit(f"{kind} on {tree} failed:\n{done.stderr[-2000:]}")
    return json.loads(rows[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", type=Path, help="another gputrain checkout, run in the same rounds")
    parser.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--tree", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.tree)
        return
    trees = [("now", ROOT)] + ([("before", args.before)] if args.before else [])
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    print(f"load average {os.getloadavg()[0]:.1f}, {args.rounds} rounds")
    for _ in range(args.rounds):
        for kind in KINDS:
            for label, tree in trees:
                runs.setdefault((kind, label), []).append(run_one(kind, tree))
    print("| data set | " + " | ".join(f"{label}: CPU s | wall s | path" for label, _ in trees) + " |")
    print("| --- |" + " ---: | ---: | --- |" * len(trees))
    for kind in KINDS:
        cells = []
        for label, _ in trees:
            got = runs[(kind, label)]
            cells += [
                f"{statistics.median(r['cpu_s'] for r in got):.2f}",
                f"{statistics.median(r['wall_s'] for r in got):.2f}",
                got[0]["path"],
            ]
        print(f"| `{kind}` | " + " | ".join(cells) + " |")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
