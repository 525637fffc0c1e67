"""The defaults' cost, side by side with the peers: a hand loop, gputrain, Lightning, Fabric and
Accelerate train the same model on the same batches, each with what its user leaves on.

Every runner starts from the same initial weights (seeded before the model is built) and takes the
same batches in the same order: each epoch's shuffle is `BatchPlan`'s, the order gputrain itself
takes from a TensorDataset. Each uses AdamW at lr 1e-3, validates after every epoch (loss and
accuracy at least, on the same validation batches) and trains 20 epochs (`train.epochs`' default):

- hand: the loop, and after each epoch the validation loss and accuracy printed on one line;
- gputrain: `Trainer(model, TensorDataset(...), val_data=TensorDataset(...), config={"train.device":
  "cpu", "train.seed": seed}).fit()`: a progress bar, metrics.jsonl and TensorBoard every 10 steps,
  a validation (accuracy, precision, recall, F1, AUROC, loss) and a checkpoint after each epoch,
  final weights, summary.json and the final table;
- lightning: `L.Trainer(max_epochs=20, accelerator="cpu")` as it comes (progress bar, TensorBoard
  logger, a checkpoint each epoch, the sanity check, the model summary), a LightningModule that
  logs its training loss with `self.log` and its validation loss and accuracy per epoch;
- fabric: `Fabric(accelerator="cpu", devices=1)`, `setup`, `fabric.backward`, the hand loop's
  validation;
- accelerate: `Accelerator(cpu=True)`, `prepare(model, optimizer)`, `accelerator.backward`, the
  hand loop's validation.

Each run is a process of its own, one at a time, with its output on a pseudo-terminal (progress bars
draw as they do for a user); rounds alternate the runners. A run times its own set-up and training
(the framework's objects built, then fit; imports and data excluded): CPU time (user + system, all
threads, and child processes) and wall time. The table gives each runner's median and the median of
its ratios to the hand run of the same round.

    python benchmarks/peers.py [--case mlp cnn] [--rounds 5] [--runners hand gputrain ...] [--epochs 20]

Lightning, Fabric (`pip install lightning`) and Accelerate (`pip install accelerate`) are used where
installed and listed as missing otherwise; they are not gputrain dependencies.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pty
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RUNNERS = ("hand", "gputrain", "lightning", "fabric", "accelerate")
NEEDS = {"lightning": "lightning", "fabric": "lightning", "accelerate": "accelerate"}
BATCH = 64
LR = 1e-3


# ----------------------------------------------------------------------------- one run (a child)
def load_case(case: str) -> tuple[Callable[[], Any], Any, Any, Any, Any]:
    """(make_model, train inputs, train targets, val inputs, val targets)."""
    import torch
    from torch import nn

    if case == "mlp":  # overhead_cpu.py's tiny MLP, with a validation split
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(4096, 32, generator=g), torch.randint(0, 10, (4096,), generator=g)
        xv, yv = torch.randn(1024, 32, generator=g), torch.randint(0, 10, (1024,), generator=g)
        return (lambda: nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))), x, y, xv, yv
    # the default job's CNN on the bundled digits, its train and validation splits
    from gputrain.config.schema import DataConfig, ModelConfig
    from gputrain.data import build_data
    from gputrain.models import build_model

    bundle = build_data(DataConfig(), seed=0)
    train, val = bundle.train, bundle.val
    return (
        (lambda: build_model(ModelConfig(), bundle.spec)),
        train.inputs,
        train.targets,
        val.inputs,  # type: ignore[union-attr]
        val.targets,  # type: ignore[union-attr]
    )


def plan_batches(x: Any, y: Any, seed: int, epoch: int) -> Iterator[tuple[Any, Any]]:
    """The training batches of `epoch`, in the order gputrain takes them from a TensorDataset."""
    from gputrain.data.batches import BatchPlan

    plan = BatchPlan(num_samples=len(x), global_batch=BATCH, grad_accum=1, seed=seed)
    for (idx,) in plan.micro_batches(epoch):
        yield x[idx], y[idx]


def val_batches(xv: Any, yv: Any) -> list[tuple[Any, Any]]:
    return [(xv[i : i + BATCH], yv[i : i + BATCH]) for i in range(0, len(xv), BATCH)]


def validate(model: Any, batches: list[tuple[Any, Any]], epoch: int) -> float:
    """The hand-written validation: loss and accuracy over the split, one printed line."""
    import torch
    import torch.nn.functional as F

    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for xb, yb in batches:
            out = model(xb)
            loss_sum += F.cross_entropy(out, yb, reduction="sum").item()
            correct += int((out.argmax(1) == yb).sum())
            count += len(yb)
    model.train()
    print(f"epoch {epoch + 1}: val loss {loss_sum / count:.4f} accuracy {correct / count:.4f}", flush=True)
    return loss_sum / count


def train_by_hand(model: Any, optimizer: Any, backward: Any, data: tuple, seed: int, epochs: int) -> float:
    """The loop a hand-written script, Fabric and Accelerate all run: the plan's batches, AdamW, a
    validation after each epoch; only `backward` (the wrapper's, or `Tensor.backward`) differs."""
    import torch.nn.functional as F

    x, y, xv, yv = data
    val = val_batches(xv, yv)
    model.train()
    loss = float("nan")
    for epoch in range(epochs):
        for xb, yb in plan_batches(x, y, seed, epoch):
            backward(F.cross_entropy(model(xb), yb))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        loss = validate(model, val, epoch)
    return loss


def run_hand(model: Any, data: tuple, seed: int, epochs: int, run_dir: Path) -> float:
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    return train_by_hand(model, optimizer, lambda loss: loss.backward(), data, seed, epochs)


def run_gputrain(model: Any, data: tuple, seed: int, epochs: int, run_dir: Path) -> float:
    from torch.utils.data import TensorDataset

    from gputrain import Trainer

    x, y, xv, yv = data
    config = {"train.device": "cpu", "train.seed": seed, "train.epochs": epochs}
    summary = Trainer(
        model, TensorDataset(x, y), val_data=TensorDataset(xv, yv), config=config, run_dir=run_dir / "run"
    ).fit()
    return float(summary["val"]["loss"])


def run_fabric(model: Any, data: tuple, seed: int, epochs: int, run_dir: Path) -> float:
    import torch
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator="cpu", devices=1)
    model, optimizer = fabric.setup(model, torch.optim.AdamW(model.parameters(), lr=LR))
    return train_by_hand(model, optimizer, fabric.backward, data, seed, epochs)


def run_accelerate(model: Any, data: tuple, seed: int, epochs: int, run_dir: Path) -> float:
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True, project_dir=str(run_dir))
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=LR))
    return train_by_hand(model, optimizer, accelerator.backward, data, seed, epochs)


def run_lightning(model: Any, data: tuple, seed: int, epochs: int, run_dir: Path) -> float:
    import lightning as L
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, IterableDataset

    x, y, xv, yv = data

    class PlanBatches(IterableDataset):
        """The plan's batches, whole: epoch by epoch, one epoch per pass."""

        def __init__(self) -> None:
            self.epoch = 0
            self.steps = sum(1 for _ in plan_batches(x, y, seed, 0))

        def __len__(self) -> int:
            return self.steps

        def __iter__(self) -> Iterator[tuple[Any, Any]]:
            epoch, self.epoch = self.epoch, self.epoch + 1
            return plan_batches(x, y, seed, epoch)

    class Val(IterableDataset):
        def __len__(self) -> int:
            return len(val_batches(xv, yv))

        def __iter__(self) -> Iterator[tuple[Any, Any]]:
            return iter(val_batches(xv, yv))

    class Module(L.LightningModule):
        def __init__(self, net: torch.nn.Module) -> None:
            super().__init__()
            self.net = net

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            inputs, targets = batch
            loss = F.cross_entropy(self.net(inputs), targets)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            inputs, targets = batch
            out = self.net(inputs)
            self.log("val_loss", F.cross_entropy(out, targets), prog_bar=True)
            self.log("val_acc", (out.argmax(1) == targets).float().mean(), prog_bar=True)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=LR)

    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, default_root_dir=str(run_dir))
    trainer.fit(
        Module(model),
        train_dataloaders=DataLoader(PlanBatches(), batch_size=None),
        val_dataloaders=DataLoader(Val(), batch_size=None),
    )
    return float(trainer.callback_metrics["val_loss"])


RUN = {
    "hand": run_hand,
    "gputrain": run_gputrain,
    "lightning": run_lightning,
    "fabric": run_fabric,
    "accelerate": run_accelerate,
}


def child(runner: str, case: str, seed: int, epochs: int, out: Path, tree: Path) -> None:
    import torch
    from _common import cpu_and_wall  # before the tree measured is put ahead of this checkout

    sys.path.insert(0, str(tree))
    torch.set_num_threads(1)  # as overhead_cpu.py: a second OpenMP thread only adds noise here
    if runner in ("lightning", "fabric"):
        import lightning  # noqa: F401 - imported before the clock starts, as every runner's imports are
    if runner == "accelerate":
        import accelerate  # noqa: F401
    if runner == "gputrain":  # what it imports lazily, as Lightning imports it up front
        import rich.progress  # noqa: F401
        import torch.utils.tensorboard  # noqa: F401

        if importlib.util.find_spec("torchmetrics"):  # what an older tree (--before) evaluates with
            import torchmetrics.classification  # noqa: F401

        import gputrain.train.trainer  # noqa: F401
    make_model, x, y, xv, yv = load_case(case)
    # one throwaway step first: torch imports parts of itself (the optimizers' compile checks, ~1 s)
    # at the first step of any loop, and that is not what is compared here
    warm = make_model()
    optimizer = torch.optim.AdamW(warm.parameters(), lr=LR)
    torch.nn.functional.cross_entropy(warm(x[:BATCH]), y[:BATCH]).backward()
    optimizer.step()
    torch.manual_seed(seed)
    model = make_model()
    with tempfile.TemporaryDirectory() as tmp:
        val_loss, cpu, wall = cpu_and_wall(lambda: RUN[runner](model, (x, y, xv, yv), seed, epochs, Path(tmp)))
    out.write_text(json.dumps({"cpu_s": cpu, "wall_s": wall, "val_loss": val_loss}))


# ----------------------------------------------------------------------------- the comparison
def run_one(runner: str, case: str, seed: int, epochs: int, tty: bool, tree: Path) -> dict[str, float]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    cmd = [
        sys.executable,
        __file__,
        "--child",
        runner,
        "--case",
        case,
        "--seed",
        str(seed),
        "--epochs",
        str(epochs),
        "--out",
        str(out),
        "--tree",
        str(tree),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    if tty:  # the output goes to a terminal, as a user's does; read and dropped here
        master, slave = pty.openpty()
        drain = threading.Thread(target=_drain, args=(master,), daemon=True)
        drain.start()
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env)
        os.close(slave)
        drain.join(timeout=5)
    else:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        if proc.returncode != 0:
            raise SystemExit(f"{runner} on {case} failed (exit {proc.returncode}); run it alone: {' '.join(cmd)}")
        return json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 65536):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


def compare(
    case: str, runners: list[tuple[str, str, Path]], rounds: int, epochs: int, tty: bool
) -> list[dict[str, Any]]:
    """`runners`: (label, runner, gputrain checkout) triples, run in this order in every round."""
    runs: dict[str, list[dict[str, float]]] = {label: [] for label, _, _ in runners}
    for r in range(rounds + 1):  # round 0 warms the file cache and is dropped
        for label, runner, tree in runners:
            result = run_one(runner, case, seed=r, epochs=epochs, tty=tty, tree=tree)
            if r > 0:
                runs[label].append(result)
    rows = []
    hand = runs.get("hand")
    for label, _, _ in runners:
        cpu = [x["cpu_s"] for x in runs[label]]
        wall = [x["wall_s"] for x in runs[label]]
        row: dict[str, Any] = {
            "case": case,
            "runner": label,
            "cpu_s": statistics.median(cpu),
            "wall_s": statistics.median(wall),
            "val_loss": statistics.median(x["val_loss"] for x in runs[label]),
        }
        if hand is not None:
            row["cpu_ratio"] = statistics.median(a / h["cpu_s"] for a, h in zip(cpu, hand))
            row["wall_ratio"] = statistics.median(a / h["wall_s"] for a, h in zip(wall, hand))
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", nargs="+", choices=("mlp", "cnn"), default=["mlp", "cnn"])
    parser.add_argument("--runners", nargs="+", choices=RUNNERS, default=list(RUNNERS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--no-tty", action="store_true", help="send each run's output to /dev/null instead")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the gputrain checkout to run (default: this one)")
    parser.add_argument(
        "--before",
        type=Path,
        help="another gputrain checkout, run as one more runner in every "
        "round (a before/after comparison under the same load)",
    )
    parser.add_argument("--child", choices=RUNNERS, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.case[0], args.seed, args.epochs, args.out, args.tree)
        return
    names = [r for r in args.runners if r not in NEEDS or importlib.util.find_spec(NEEDS[r]) is not None]
    missing = sorted(set(args.runners) - set(names))
    runners = [(r, r, args.tree) for r in names]
    if args.before is not None:
        runners.insert(
            names.index("gputrain") + 1 if "gputrain" in names else len(runners),
            ("gputrain (before)", "gputrain", args.before),
        )
    import torch

    print(
        f"gputrain at {args.tree}; torch {torch.__version__}, 1 intra-op thread, "
        f"load average {os.getloadavg()[0]:.1f}, "
        f"{args.rounds} rounds, {args.epochs} epochs" + (f"; not installed: {', '.join(missing)}" if missing else "")
    )
    print("| case | runner | CPU s | CPU / hand | wall s | wall / hand | final val loss |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    rows = []
    for case in args.case:
        for row in compare(case, runners, args.rounds, args.epochs, tty=not args.no_tty):
            rows.append(row)
            print(
                f"| {'tiny MLP' if case == 'mlp' else 'digits CNN'} | {row['runner']} | {row['cpu_s']:.3f} | "
                f"{row.get('cpu_ratio', float('nan')):.2f} | {row['wall_s']:.3f} | "
                f"{row.get('wall_ratio', float('nan')):.2f} | {row['val_loss']:.4f} |",
                flush=True,
            )
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
