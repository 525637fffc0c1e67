"""Work run inside the spawned ranks (importable by the spawn start method)."""

from __future__ import annotations

from typing import Any

BASE = ["model.name=mlp", "data.name=synthetic", "data.shape=[16]", "data.num_samples=400", "model.hidden_sizes=[32,32]",
        "train.batch_size=32", "train.epochs=1", "train.max_steps=4", "log.every_steps=1", "log.tensorboard=false",
        "log.progress=none", "checkpoint.enabled=false", "checkpoint.resume=never", "eval.every_epochs=0",
        "optim.name=adamw", "optim.lr=0.01", "train.device=cpu"]


def train_runs(rank: int, runs: list[tuple[str, list[str]]]) -> list[dict[str, Any]]:
    """Train each (run_dir, overrides) in turn on this rank; the process group is reused across runs."""
    from gputrain.train.trainer import Trainer

    summaries = []
    for run_dir, overrides in runs:
        trainer = Trainer.from_config(None, run_dir=run_dir, overrides=BASE + overrides)
        summaries.append(trainer.fit())
    return summaries


def gpt_tp_check(rank: int) -> list[tuple[float, float]]:
    """Train the zoo's GPT (tiny, attention split by heads) with TP=2 and unsharded, side by side on
    each rank; return (tp loss, reference loss) per step."""
    import copy

    import torch
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh

    from gputrain.distributed.tp import apply_tp
    from gputrain.config import load_config
    from gputrain.data.spec import DataSpec
    from gputrain.models import build_model

    torch.manual_seed(0)
    config = load_config(None, {"model.name": "gpt", "model.n_layer": 2, "model.n_head": 4, "model.d_model": 16,
                                "model.seq_len": 8, "data.name": "synthetic", "data.task": "lm", "data.seq_len": 8})
    reference = build_model(config.model, DataSpec(task="lm", input_shape=(8,), vocab_size=32))
    model = copy.deepcopy(reference)
    apply_tp(model, init_device_mesh("cpu", (2,), mesh_dim_names=("tp",)))
    assert model.lm_head.weight is model.wte.weight, "the tie must survive sharding"
    from torch.distributed.tensor import DTensor

    qkv = model.blocks[0].attn.c_attn.weight
    assert isinstance(qkv, DTensor) and qkv.to_local().shape == (3 * 16 // 2, 16), "attention must be split by heads"
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, reference)]
    tokens = torch.randint(32, (4, 9), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(3):
        step = []
        for m, opt in zip((model, reference), optimizers):
            logits = m(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, 32), tokens[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad()
            step.append(float(loss.detach()))
        losses.append((step[0], step[1]))
    return losses


def dist_job(rank: int, runs: list[tuple[str, list[str]]]) -> dict[str, Any]:
    """Everything the 2-rank tests need, in one pair of processes."""
    return {"train": train_runs(rank, runs), "gpt_tp": gpt_tp_check(rank)}
