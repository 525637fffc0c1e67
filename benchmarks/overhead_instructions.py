"""Instructions per training step under valgrind's callgrind: a noise-free overhead figure.

Wall and CPU time on a shared 2-core machine swing by 2x between runs; instruction counts do not.
The tiny MLP (32 → 64 → 10, batch 64, AdamW, in-memory data) is trained through `Trainer.fit`
for N and M steps in separate processes; the difference divided by M - N is the instructions one
step costs, the loop's set-up cancelled out. Pass a second checkout to compare two versions
(e.g. before and after a refactor) in one sitting:

    python benchmarks/overhead_instructions.py [--other /path/to/other/checkout] [--guard stop|off] [--hand]
                                               [--callbacks K]

`--callbacks K` also counts the same run with K callbacks whose hooks do nothing (issue 29: what the
Trainer's callback dispatch costs a step), as instructions and as a share of the step's.

Needs valgrind (Debian: `apt-get install valgrind`); each run takes a minute or two.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RUN = """
import sys, tempfile
sys.path.insert(0, sys.argv[1])
import torch, torch.nn.functional as F
from torch import nn
torch.set_num_threads(1)
from gputrain import Callback, Trainer
from gputrain.data.tensors import TensorData

class NoOp(Callback):  # every hook overridden, doing nothing: the dispatch alone is what is counted
    def on_fit_start(self, trainer): pass
    def on_step_end(self, trainer, step, metrics): pass
    def on_eval_end(self, trainer, split, metrics): pass
    def on_checkpoint(self, trainer, path): pass
    def on_train_end(self, trainer, status): pass
    def on_fit_end(self, trainer, summary): pass

g = torch.Generator().manual_seed(0)
data = TensorData(torch.randn(4096, 32, generator=g), torch.randint(0, 10, (4096,), generator=g))
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
with tempfile.TemporaryDirectory() as run_dir:
    config = {"train.device": "cpu", "train.batch_size": 64, "train.max_steps": int(sys.argv[2]),
              "train.epochs": 10**6, "log.every_steps": 10**6, "log.progress": "none", "log.tensorboard": False,
              "checkpoint.enabled": False, "eval.every_epochs": 0, "train.on_nonfinite": sys.argv[3]}
    callbacks = [NoOp() for _ in range(int(sys.argv[4]))]
    Trainer(model, data, loss_fn=F.cross_entropy, config=config, run_dir=run_dir, callbacks=callbacks).fit()
"""


# the same training written by hand, as a user would: AdamW as torch builds it by default, batches
# indexed from the in-memory tensors in a shuffled order, no check, no logging
HAND = """
import sys
import torch, torch.nn.functional as F
from torch import nn
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
x, y = torch.randn(4096, 32, generator=g), torch.randint(0, 10, (4096,), generator=g)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
steps, done = int(sys.argv[2]), 0
while done < steps:
    order = torch.randperm(4096)
    for i in range(0, 4096 - 63, 64):
        idx = order[i:i + 64]
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        done += 1
        if done == steps:
            break
"""


def instructions(tree: Path | None, steps: int, guard: str, callbacks: int = 0) -> int:
    """Instructions of a whole process that trains `steps` steps with the gputrain of `tree`, or
    with the hand-written loop where `tree` is None."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as script:
        script.write(RUN if tree is not None else HAND)
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}  # the same dict orders every run
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                          script.name, str(tree or ROOT), str(steps), guard, str(callbacks)], capture_output=True,
                         text=True, env=env)
    os.unlink(script.name)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if found is None:
        raise SystemExit(f"callgrind gave no count for {tree}:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def per_step(tree: Path | None, short: int, long: int, guard: str, callbacks: int = 0) -> float:
    return (instructions(tree, long, guard, callbacks) - instructions(tree, short, guard, callbacks)) / (long - short)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", type=Path, help="a second checkout to compare with this one")
    parser.add_argument("--guard", choices=("stop", "off"), default="stop", help="train.on_nonfinite")
    parser.add_argument("--steps", type=int, nargs=2, default=(20, 420), metavar=("N", "M"))
    parser.add_argument("--hand", action="store_true", help="also count the hand-written loop's step")
    parser.add_argument("--callbacks", type=int, default=0, metavar="K",
                        help="also count the run with K no-op callbacks")
    args = parser.parse_args()
    short, long = args.steps
    ours = per_step(ROOT, short, long, args.guard)
    print(f"this checkout: {ours:,.0f} instructions per step (tiny MLP, guard {args.guard}, steps {short}→{long})")
    if args.hand:
        hand = per_step(None, short, long, args.guard)
        print(f"hand-written loop: {hand:,.0f} instructions per step; gputrain / hand = {ours / hand:.4f}, "
              f"gputrain adds {ours - hand:,.0f} instructions per step")
    if args.callbacks:
        with_them = per_step(ROOT, short, long, args.guard, args.callbacks)
        print(f"with {args.callbacks} no-op callbacks: {with_them:,.0f} instructions per step, "
              f"{with_them - ours:+,.0f} a step ({100 * (with_them - ours) / ours:+.2f}% of the step)")
    if args.other is not None:
        theirs = per_step(args.other, short, long, args.guard)
        print(f"{args.other}: {theirs:,.0f} instructions per step; this / that = {ours / theirs:.4f}")


if __name__ == "__main__":
    main()
