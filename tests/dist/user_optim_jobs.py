"""What tests/dist/test_user_optimizer.py runs on each of 2 gloo ranks: a user's optimizer and
scheduler under FSDP (factories, which get the sharded parameters), a resume of a third-party
optimizer class with two parameter groups through the sharded checkpoint, and an instance refused."""

from __future__ import annotations

import functools
from typing import Any

CONFIG = {"train.device": "cpu", "train.batch_size": 32, "train.epochs": 1, "train.max_steps": 6,
          "parallel.strategy": "fsdp", "log.every_steps": 1, "log.tensorboard": False, "log.progress": "none",
          "checkpoint.every_steps": 2, "eval.every_epochs": 0, "train.deterministic": True}


def _model_and_data() -> tuple[Any, Any]:
    import torch
    from torch import nn

    from gputrain.data.tensors import TensorData

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 10))
    g = torch.Generator().manual_seed(0)
    return model, TensorData(torch.randn(256, 16, generator=g), torch.randint(0, 10, (256,), generator=g))


def user_optimizer_check(rank: int, run_dirs: dict[str, str]) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from gputrain.errors import Interrupted, UsageError
    from gputrain.optim.params import weight_decay_groups
    from gputrain.train.trainer import Trainer
    from tests.unit.train.test_user_optimizer import Lion

    seen: dict[str, Any] = {}

    def adamw(params: Any) -> torch.optim.Optimizer:
        seen["names"] = list(params.names)
        seen["sharded"] = all(type(p).__name__ == "DTensor" for p in params)
        head = [p for name, p in params.named() if name.startswith("3.")]
        body = [p for name, p in params.named() if not name.startswith("3.")]
        return torch.optim.AdamW([*weight_decay_groups(body, 0.1), {"params": head, "lr": 3e-2}], lr=1e-2)

    def lion(params: Any) -> torch.optim.Optimizer:
        return Lion([{"params": params[:2], "lr": 2e-3}, {"params": params[2:], "weight_decay": 0.01}], lr=1e-3)

    one_cycle = functools.partial(torch.optim.lr_scheduler.OneCycleLR, max_lr=[1e-2, 1e-2, 3e-2], total_steps=6)
    out: dict[str, Any] = {}

    def fit(name: str, optimizer: Any, scheduler: Any = None, stop_at: int | None = None) -> Trainer:
        model, data = _model_and_data()
        calls, holder = [0], []

        def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            calls[0] += torch.is_grad_enabled()
            if calls[0] == stop_at and torch.is_grad_enabled():
                holder[0].stop.requested = "SIGTERM"  # what the signal handler does, on every rank
            return F.cross_entropy(outputs, targets)

        trainer = Trainer(model, data, loss_fn=loss_fn, config=CONFIG, run_dir=run_dirs[name], optimizer=optimizer,
                          scheduler=scheduler)
        holder.append(trainer)
        out[name] = trainer.fit()
        return trainer

    trainer = fit("adamw", adamw, one_cycle)
    out["lrs"] = [g["lr"] for g in trainer.optimizer.param_groups]
    out["seen"] = seen
    fit("lion", lion)
    try:  # stopped at step 3, saved: resumed below
        fit("lion_resumed", lion, stop_at=3)
        out["stopped"] = None
    except Interrupted as err:
        out["stopped"] = str(err)
    fit("lion_resumed", lion)
    out["lion_resumed"] = out["lion_resumed"]["status"]
    model, data = _model_and_data()  # DDP keeps the model's parameters: an instance over them trains
    ddp = Trainer(model, data, loss_fn=F.cross_entropy, config={**CONFIG, "parallel.strategy": "ddp"},
                  run_dir=run_dirs["ddp_instance"], optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    out["ddp_instance"] = ddp.fit()["status"]
    model, data = _model_and_data()
    try:
        Trainer(model, data, loss_fn=F.cross_entropy, config=CONFIG, run_dir=run_dirs["instance"],
                optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3)).setup()
        out["instance"] = None
    except UsageError as err:
        out["instance"] = str(err)
    model, data = _model_and_data()  # torch has no sharding rule for fused SGD's kernel: it would fail at step 1
    try:
        Trainer(model, data, loss_fn=F.cross_entropy, config=CONFIG, run_dir=run_dirs["fused_sgd"],
                optimizer=functools.partial(torch.optim.SGD, lr=0.1, fused=True)).setup()
        out["fused_sgd"] = None
    except UsageError as err:
        out["fused_sgd"] = str(err)
    return {k: (v if k not in ("adamw", "lion") else {"status": v["status"], "optimizer": v.get("optimizer")})
            for k, v in out.items()}
