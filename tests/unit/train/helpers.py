import json
from pathlib import Path

import torch.nn.functional as F

from gputrain import Trainer
from gputrain.config import load_config
from gputrain.data import build_data
from gputrain.models import build_model
from gputrain.train.state import seed_everything

TINY = {"log.progress": "none", "log.tensorboard": False, "log.every_steps": 1, "train.seed": 0}


def make_trainer(run_dir: Path, loss_fn=F.cross_entropy, **overrides) -> Trainer:
    """The digits job built by hand so a test can hook the loss."""
    config = load_config(None, {**TINY, **overrides})
    seed_everything(config.train.seed)
    bundle = build_data(config.data, config.train.seed)
    model = build_model(config.model, bundle.spec)
    return Trainer(model, bundle.train, val_data=bundle.val, test_data=bundle.test, loss_fn=loss_fn, config=config,
                   run_dir=run_dir, spec=bundle.spec, names=(config.model.name, config.data.name))


def step_rows(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if "split" not in row]


def losses(run_dir: Path) -> list[tuple[int, float]]:
    return [(row["step"], row["loss"]) for row in step_rows(run_dir)]
