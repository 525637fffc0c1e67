"""A run of a user's two-group AdamW and OneCycleLR through the Trainer, as a process of its own
(`python tests/unit/train/user_optim_run.py RUN_DIR [HOLD_AT]`), for test_user_optimizer.py to
SIGKILL: with HOLD_AT the run writes RUN_DIR.held and blocks in the forward pass of that step until
it is killed (an event nobody sets: no sleep, no race with the end of the run)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import torch
import torch.nn.functional as F

from gputrain.train.state import seed_everything
from gputrain.train.trainer import Trainer
from tests.unit.train.test_user_optimizer import QUIET, Net, _data, two_group_adamw

EPOCHS = 10
STEPS = EPOCHS * 4  # 64 samples in batches of 16


def main(run_dir: Path, hold_at: int | None) -> None:
    calls = [0]

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            calls[0] += 1
            if calls[0] == hold_at:
                run_dir.with_suffix(".held").write_text(str(hold_at))
                threading.Event().wait()  # until SIGKILL
        return F.cross_entropy(outputs, targets)

    def one_cycle(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.OneCycleLR:
        max_lr = [group["lr"] for group in optimizer.param_groups]
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=max_lr, total_steps=STEPS)

    seed_everything(0)  # what a user's script does: numpy's and Python's generators are saved in checkpoints too
    config = {**QUIET, "train.epochs": EPOCHS, "checkpoint.every_steps": 10}
    Trainer(Net(), _data(), loss_fn=loss_fn, config=config, run_dir=run_dir, optimizer=two_group_adamw,
            scheduler=one_cycle).fit()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else None)
