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
    from gputrain.models.plans import tp_plan_for
    from gputrain.config import load_config
    from gputrain.data.spec import DataSpec
    from gputrain.models import build_model

    torch.manual_seed(0)
    config = load_config(None, {"model.name": "gpt", "model.n_layer": 2, "model.n_head": 4, "model.d_model": 16,
                                "model.seq_len": 8, "data.name": "synthetic", "data.task": "lm", "data.seq_len": 8})
    reference = build_model(config.model, DataSpec(task="lm", input_shape=(8,), vocab_size=32))
    model = copy.deepcopy(reference)
    apply_tp(model, init_device_mesh("cpu", (2,), mesh_dim_names=("tp",)), tp_plan_for(model)(model, 2))
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


COMM_DELAY_S = 0.15


def comm_split_check(rank: int) -> dict[str, float]:
    """DDP whose gradient all-reduce finishes COMM_DELAY_S late (its comm hook completes the future
    on a timer thread): the step timer must charge the wait to comm, not to forward_backward.
    Returns the mean seconds per category over 3 sampled steps."""
    import threading

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    from gputrain.observe.breakdown import StepTimer
    from gputrain.precision import Precision
    from gputrain.train.step import StepParts, train_step

    if not dist.is_initialized():  # the trainer's runs before this one leave the group up
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))

    def late_allreduce(group, bucket):  # type: ignore[no-untyped-def]  # DDP rejects string annotations here
        # the delay runs on a timer thread: a callback on an already-finished future would run
        # inline, inside backward, and be charged to it
        late = torch.futures.Future()
        allreduce_hook(group, bucket).add_done_callback(lambda fut: threading.Timer(
            COMM_DELAY_S, lambda: late.set_result(fut.value()[0])).start())
        return late

    model.register_comm_hook(None, late_allreduce)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    timer = StepTimer(torch.device("cpu"), every=1)
    parts = StepParts(model=model, optimizer=optimizer,
                      scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
                      precision=Precision("fp32", torch.device("cpu")),
                      compute_loss=lambda m, b: m(b).square().mean(), timer=timer, time_comm=True)
    for step in range(1, 4):
        timer.begin(step)
        train_step(parts, [torch.randn(4, 8)], measure_grad_norm=False)
        timer.end()
    mean = timer.mean_seconds()
    assert mean is not None
    return mean


def nonfinite_check(rank: int, run_dir: str, strategy: str) -> dict[str, Any]:
    """Rank 1 alone poisons its gradients on step 3, which is not a logging step (the guard's flag
    check, not the norm): with on_nonfinite=skip both ranks must skip that step together."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from gputrain.data.tensors import TensorData
    from gputrain.train.trainer import Trainer

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    calls = [0]

    def step_fn(m: nn.Module, batch: Any) -> torch.Tensor:
        calls[0] += 1
        out = m(batch[0])
        if calls[0] == 3 and rank == 1:
            out.register_hook(lambda g: torch.full_like(g, float("nan")))
        return F.cross_entropy(out, batch[1])

    g = torch.Generator().manual_seed(0)
    data = TensorData(torch.randn(256, 8, generator=g), torch.randint(0, 3, (256,), generator=g))
    config = {"train.max_steps": 6, "train.epochs": 1, "train.batch_size": 16, "train.device": "cpu",
              "train.on_nonfinite": "skip", "parallel.strategy": strategy, "log.progress": "none",
              "log.tensorboard": False, "log.every_steps": 100, "checkpoint.enabled": False}
    trainer = Trainer(model, data, step_fn=step_fn, config=config, run_dir=run_dir)
    summary = trainer.fit()
    return {"nonfinite_steps": summary["train"]["nonfinite_steps"], "schedule_steps": trainer.scheduler.last_epoch,
            "finite": all(bool(torch.isfinite(p.full_tensor() if hasattr(p, "full_tensor") else p).all())
                          for p in trainer.model.parameters())}


USER_TP_CONFIG = {"train.device": "cpu", "train.batch_size": 32, "train.epochs": 1, "train.max_steps": 4,
                  "optim.name": "adamw", "optim.lr": 0.01, "log.every_steps": 1, "log.tensorboard": False,
                  "log.progress": "none", "checkpoint.enabled": False, "eval.every_epochs": 0}
"""A model of the user's own, trained by the Trainer with 4 steps of batch 32 (`user_tp_check`)."""


def user_model_and_data() -> tuple[Any, Any]:
    """The same model (seeded) and data on every process: two Linear layers the plan splits."""
    import torch
    from torch import nn

    from gputrain.data.tensors import TensorData

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10))
    g = torch.Generator().manual_seed(0)
    return model, TensorData(torch.randn(256, 16, generator=g), torch.randint(0, 10, (256,), generator=g))


def user_tp_check(rank: int, run_dirs: dict[str, str]) -> dict[str, Any]:
    """parallel.strategy=tp on a model of the user's own: its plan given to the Trainer as a dict and as a
    function (module, tp degree) -> dict, each trained in its run directory; and given none, the error."""
    import torch.nn.functional as F
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from gputrain.errors import ConfigError
    from gputrain.train.trainer import Trainer

    degrees: list[int] = []

    def plan_of(module: Any, degree: int) -> dict[str, Any]:
        degrees.append(degree)
        return {"0": ColwiseParallel(), "2": RowwiseParallel()}

    config = {**USER_TP_CONFIG, "parallel.strategy": "tp"}
    shards: dict[str, list[tuple[int, ...]]] = {}
    for name, plan in (("dict", {"0": ColwiseParallel(), "2": RowwiseParallel()}), ("function", plan_of)):
        model, data = user_model_and_data()
        trainer = Trainer(model, data, loss_fn=F.cross_entropy, config=config, run_dir=run_dirs[name], tp_plan=plan)
        trainer.fit()
        # what this rank holds of each Linear weight: the plan splits both
        shards[name] = [tuple(trainer.model[i].weight.to_local().shape) for i in (0, 2)]
    model, data = user_model_and_data()
    try:
        Trainer(model, data, loss_fn=F.cross_entropy, config=config, run_dir=run_dirs["none"]).setup()
        error = None
    except ConfigError as err:
        error = str(err)
    return {"degrees": degrees, "error": error, "shards": shards}


def dist_job(rank: int, runs: list[tuple[str, list[str]]], nonfinite_dirs: dict[str, str],
             user_tp_dirs: dict[str, str]) -> dict[str, Any]:
    """Everything the 2-rank tests need, in one pair of processes."""
    results = {"train": train_runs(rank, runs), "gpt_tp": gpt_tp_check(rank)}
    results["user_tp"] = user_tp_check(rank, user_tp_dirs)
    results["nonfinite"] = {s: nonfinite_check(rank, d, s) for s, d in nonfinite_dirs.items()}
    results["comm_split"] = comm_split_check(rank)
    return results
