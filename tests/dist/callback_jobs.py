"""What each rank runs in tests/dist/test_callbacks.py: Trainer callbacks on 2 FSDP gloo ranks."""

from __future__ import annotations

from typing import Any

CONFIG = {
    "train.device": "cpu",
    "train.batch_size": 16,
    "train.epochs": 2,
    "parallel.strategy": "fsdp",
    "optim.name": "adamw",
    "optim.lr": 0.05,
    "log.every_steps": 3,
    "log.tensorboard": False,
    "log.progress": "none",
    "eval.every_epochs": 0,
    "checkpoint.every_epochs": 0,
}
"""8 steps of batch 16 (4 an epoch), logged at steps 3, 6 and 8."""


def _model_and_data() -> tuple[Any, Any]:
    import torch
    from torch import nn

    from gputrain.data.tensors import TensorData

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    g = torch.Generator().manual_seed(0)
    return model, TensorData(torch.randn(64, 6, generator=g), torch.randint(0, 3, (64,), generator=g))


def callbacks_job(rank: int, dirs: dict[str, str]) -> dict[str, Any]:
    """Three runs: an EMA checked against the hand-computed average of this rank's shards; a stop asked
    on rank 1 alone at a step that is not logged (both ranks must stop together, at the next logging
    step); a run interrupted at step 3 and resumed, its EMA against the unbroken run's."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.tensor import DTensor

    from gputrain import EMA, Callback, Trainer
    from gputrain.errors import Interrupted

    def trainer(run_dir: str, callbacks: list[Any]) -> Trainer:
        model, data = _model_and_data()
        return Trainer(model, data, loss_fn=F.cross_entropy, config=CONFIG, run_dir=run_dir, callbacks=callbacks)

    class Shards(Callback):
        def on_fit_start(self, trainer: Trainer) -> None:
            self.after = [self.local(trainer)]

        def on_step_end(self, trainer: Trainer, step: int, metrics: Any) -> None:
            self.after.append(self.local(trainer))

        @staticmethod
        def local(trainer: Trainer) -> dict[str, torch.Tensor]:
            return {n: p.to_local().detach().clone() for n, p in trainer.model.named_parameters()}

    out: dict[str, Any] = {}
    ema, shards = EMA(decay=0.8), Shards()
    t = trainer(dirs["ema"], [ema, shards])
    t.fit()
    out["sharded"] = all(isinstance(p, DTensor) for p in t.model.parameters())
    expected = shards.after[0]
    for after in shards.after[1:]:
        expected = {n: torch.lerp(expected[n], after[n], 0.2) for n in expected}
    averaged = list(ema.averaged().values())
    out["ema_exact"] = len(shards.after) == 9 and all(
        torch.equal(a, e) for a, e in zip(averaged, expected.values(), strict=True)
    )

    class StopOnRank1(Callback):
        def on_step_end(self, trainer: Trainer, step: int, metrics: Any) -> None:
            self.seen = step
            if step == 5 and rank == 1:  # neither logged nor an epoch's end: the ranks agree at step 6
                trainer.request_stop("rank 1 had enough")

    stop = StopOnRank1()
    summary = trainer(dirs["stop"], [stop]).fit()
    out["stop"] = (summary["status"], summary["global_step"], summary.get("stop_reason"), stop.seen)

    whole = EMA(decay=0.9)
    trainer(dirs["whole"], [whole]).fit()

    class Kill(Callback):
        def on_step_end(self, trainer: Trainer, step: int, metrics: Any) -> None:
            if step == 3:  # a logging step: both ranks stop there, as for a signal to each
                trainer.stop.requested = "SIGTERM"

    try:
        trainer(dirs["broken"], [EMA(decay=0.9), Kill()]).fit()
        out["interrupted"] = False
    except Interrupted:
        out["interrupted"] = True
    again = EMA(decay=0.9)
    trainer(dirs["broken"], [again]).fit()
    out["resumed_exact"] = again.updates == whole.updates == 8 and all(
        torch.equal(a, b) for a, b in zip(again.averaged().values(), whole.averaged().values(), strict=True)
    )
    return out
