"""Every strategy with every built-in model docs/distributed.md lists for it, end to end on 2 gloo
ranks: training, validation each epoch, the test split, the epoch checkpoint, the final weights
and summary.json. Equivalence with one process is tests/dist/test_equivalence.py's job; this one
asks that each documented combination runs to its end and leaves whole files behind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from tests.dist.harness import run_ranks

QUICK = ["train.epochs=2", "train.max_steps=4", "train.batch_size=32", "train.device=cpu", "log.progress=none",
         "log.tensorboard=false", "checkpoint.every_epochs=1", "train.grad_accum=2"]
IMAGES = ["data.name=digits", "data.val_fraction=0.05", "data.test_fraction=0.05"]
TOKENS = ["data.name=synthetic", "data.task=lm", "data.seq_len=16", "data.num_samples=256", "model.name=gpt",
          "model.n_layer=2", "model.n_head=2", "model.d_model=16", "data.vocab_size=64"]
MODELS = {
    "mlp": [*IMAGES, "model.name=mlp", "model.hidden_sizes=[32]"],
    "cnn": [*IMAGES, "model.name=cnn", "model.channels=[4,8]", "model.hidden=16"],
    "resnet18": [*IMAGES, "model.name=resnet18", "model.base_width=8"],
    "gpt": TOKENS,
}
STRATEGIES = {
    "ddp": ["parallel.strategy=ddp"],
    "fsdp": ["parallel.strategy=fsdp"],
    "hybrid": ["parallel.strategy=hybrid", "parallel.dp_replicate=1", "parallel.dp_shard=2"],
    "tp": ["parallel.strategy=tp"],
    "pp": ["parallel.strategy=pp", "parallel.pp_schedule=gpipe"],
}
# what docs/distributed.md says each strategy takes
SUPPORTED = {"ddp": ["mlp", "cnn", "resnet18", "gpt"], "fsdp": ["mlp", "cnn", "resnet18", "gpt"],
             "hybrid": ["mlp", "cnn", "resnet18", "gpt"], "tp": ["mlp", "gpt"], "pp": ["mlp", "gpt"]}
CASES = [(s, m) for s, models in SUPPORTED.items() for m in models]


def _matrix(rank: int, root: str) -> dict[str, str]:
    """Each case in turn on this rank (the process group is reused); the outcome per case."""
    from gputrain.train.trainer import Trainer

    outcomes = {}
    for strategy, model in CASES:
        name = f"{strategy}-{model}"
        try:
            Trainer.from_config(None, run_dir=Path(root) / name, overrides=QUICK + MODELS[model] + STRATEGIES[strategy]
                                ).fit()
            outcomes[name] = "ok"
        except Exception as err:  # noqa: BLE001 - every case is reported, then the next one runs
            outcomes[name] = f"{type(err).__name__}: {err}"
    return outcomes


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, str]]]:
    root = tmp_path_factory.mktemp("matrix")
    return root, run_ranks(_matrix, str(root), timeout_s=600)


@pytest.mark.parametrize(("strategy", "model"), CASES)
def test_every_documented_combination_runs_to_its_end(matrix: tuple[Path, list[dict[str, Any]]], strategy: str,
                                                       model: str) -> None:
    root, outcomes = matrix
    name = f"{strategy}-{model}"
    assert [o[name] for o in outcomes] == ["ok", "ok"]
    run = root / name
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["global_step"] == 4 and summary["world_size"] == 2
    assert summary["val"] and summary["test"]  # both splits evaluated after sharded training
    weights = load_file(str(run / "model.safetensors"))  # written by the ranks from their shards or stages
    assert weights and all(t.numel() > 0 for t in weights.values())
    assert (run / "checkpoints" / "step-4" / "COMMITTED").is_file()
