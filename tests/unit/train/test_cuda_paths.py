"""The logic of CUDA-only paths, run on CPU: what crosses to the device and when, what the
DataLoader pins, which GPU's RNG a checkpoint holds, gradients under CUDA graphs, and the
process-wide switches. tests/gpu and scripts/gpu_smoke.py run the same paths on a real GPU.

Where a fact needs a GPU this machine lacks (a pinned page, a CUDA generator, `set_device`), the
torch call is replaced by a recorder, and only that call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data._utils.pin_memory import pin_memory

from gputrain import Trainer
from gputrain.data.guard import GuardedBatch, _Failed, guarded_collate
from gputrain.data.tensors import TensorData
from gputrain.errors import ConfigError
from gputrain.precision import Precision
from gputrain.switches import apply_process_switches
from gputrain.train import state as state_module
from gputrain.data.batches import BatchPlan
from gputrain.data.feed import BatchFeed
from gputrain.train.state import capture_rng, restore_rng
from gputrain.train.step import StepParts, train_step


class CrossDeviceCopies(TorchDispatchMode):
    """Counts copies whose source and destination are on different devices."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default):
            source = args[1] if func is torch.ops.aten.copy_.default else args[0]
            if isinstance(out, torch.Tensor) and source.device != out.device:
                self.count += 1
        return out


def test_the_epoch_order_crosses_to_the_data_device_once_per_epoch_not_per_micro_batch() -> None:
    # The data lives on another device than the host's permutation (on a GPU: small data held there
    # for the run). "meta" stands in for that device: the same dispatch, no memory.
    device = torch.device("meta")
    data = TensorData(torch.randn(256, 4), torch.randint(0, 3, (256,))).to(device)
    plan = BatchPlan(num_samples=256, global_batch=32, grad_accum=2, seed=0)
    feed = BatchFeed(data, plan, device)
    for epoch in range(2):
        with CrossDeviceCopies() as copies:
            groups = list(feed.epoch(epoch))
        assert len(groups) == 8 and all(len(g) == 2 and g[0][0].device == device for g in groups)
        assert copies.count == 1, f"{copies.count} host-to-device copies in one epoch of 16 micro-batches"


def test_the_micro_batches_on_the_device_are_those_of_the_host_plan() -> None:
    plan = BatchPlan(num_samples=100, global_batch=20, grad_accum=2, dp_rank=1, dp_size=2, seed=3)
    host = [torch.cat(step) for step in plan.micro_batches(1, start_step=2)]
    moved = [torch.cat(step) for step in plan.micro_batches(1, start_step=2, device=torch.device("meta"))]
    assert len(host) == len(moved) == 3
    assert all(m.device.type == "meta" and m.shape == h.shape for h, m in zip(host, moved))


@pytest.fixture
def fake_pinning(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """Tensor.pin_memory on a machine without a GPU: returns a copy and records it."""
    pinned: list[torch.Tensor] = []

    def pin(self: torch.Tensor, device: Any = None) -> torch.Tensor:
        copy = self.clone()
        pinned.append(copy)
        return copy

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    return pinned


def test_the_dataloader_pin_hook_reaches_the_tensors_inside_a_guarded_batch(fake_pinning: list[torch.Tensor]) -> None:
    failed = _Failed("sample 3 (file a.png)", "OSError: truncated")
    batch = guarded_collate([(torch.ones(3), torch.tensor(1)), failed, (torch.zeros(3), torch.tensor(0))])
    out = pin_memory(batch)  # what the DataLoader's pin thread calls on every batch
    assert isinstance(out, GuardedBatch) and out.failed == [failed]
    assert len(fake_pinning) == 2
    assert out.batch[0] is fake_pinning[0] and out.batch[1] is fake_pinning[1]
    assert torch.equal(out.batch[0], torch.stack([torch.ones(3), torch.zeros(3)]))
    assert pin_memory(GuardedBatch(None, [failed])).batch is None  # a wholly unreadable batch stays named


def test_a_cuda_run_asks_its_dataloader_to_pin() -> None:
    class Rows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 64

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            return torch.full((2,), float(i)), i % 2

    plan = BatchPlan(num_samples=64, global_batch=16, grad_accum=1)
    assert BatchFeed(Rows(), plan, torch.device("cuda", 0), num_workers=0).loader.pin_memory  # type: ignore[union-attr]
    assert not BatchFeed(Rows(), plan, torch.device("cpu"), num_workers=0).loader.pin_memory  # type: ignore[union-attr]


class FakeCudaRng:
    """torch.cuda's generator calls on a machine with `count` GPUs."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.restored: list[tuple[int, int]] = []  # (device index, marker of the state given)

    def get_rng_state(self, device: torch.device) -> torch.Tensor:
        return torch.tensor([100 + torch.device(device).index], dtype=torch.uint8)

    def set_rng_state(self, new_state: torch.Tensor, device: torch.device) -> None:
        index = torch.device(device).index
        if index >= self.count:
            raise IndexError(f"cuda:{index} on a machine with {self.count} GPUs")
        self.restored.append((index, int(new_state[0])))


def test_a_checkpoint_holds_the_rng_of_the_device_it_trained_on(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCudaRng(count=8)
    monkeypatch.setattr(state_module.torch.cuda, "get_rng_state", fake.get_rng_state)
    monkeypatch.setattr(state_module.torch.cuda, "set_rng_state", fake.set_rng_state)
    saved = capture_rng(torch.device("cuda", 5))
    assert int(saved["cuda"][0]) == 105 and "cuda" not in capture_rng(torch.device("cpu"))
    fake.count = 1  # resumed on a machine with one GPU
    restore_rng(saved, torch.device("cuda", 0))
    assert fake.restored == [(0, 105)]


def test_an_older_all_devices_rng_list_resumes_on_fewer_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCudaRng(count=1)
    monkeypatch.setattr(state_module.torch.cuda, "set_rng_state", fake.set_rng_state)
    saved = {**capture_rng(), "cuda": [torch.tensor([i], dtype=torch.uint8) for i in range(8)]}  # 8 GPUs' states
    restore_rng(saved, torch.device("cuda", 0))
    fake.count = 2
    restore_rng(saved, torch.device("cuda", 1))
    assert fake.restored == [(0, 0), (1, 1)]


def _accumulating_parts(persistent: bool) -> tuple[StepParts, nn.Module]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    parts = StepParts(model=model, optimizer=optimizer, scheduler=scheduler,
                      precision=Precision("fp32", torch.device("cpu")),
                      compute_loss=lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                      params=list(model.parameters()), persistent_grads=persistent)
    return parts, model


def test_gradients_under_cuda_graphs_stay_in_their_own_buffers_and_accumulate_exactly() -> None:
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(6)]
    reference, ref_model = _accumulating_parts(persistent=False)
    graphs, model = _accumulating_parts(persistent=True)
    buffers = [p.grad for p in model.parameters()]
    assert all(b is not None and not b.any() for b in buffers)  # allocated before the first backward
    for step in range(3):
        pair = batches[2 * step: 2 * step + 2]
        train_step(graphs, pair, measure_grad_norm=False)  # 2 micro-batches of 8
        train_step(reference, [(torch.cat([a[0] for a in pair]), torch.cat([a[1] for a in pair]))],
                   measure_grad_norm=False)  # one batch of 16
        assert all(p.grad is b for p, b in zip(model.parameters(), buffers))  # the same tensors, zeroed
        assert all(not b.any() for b in buffers)
    for ours, theirs in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("strategy", ["fsdp", "hybrid", "pp", "tp"])
def test_cuda_graphs_with_a_strategy_they_cannot_replay_is_refused_with_the_reason(strategy: str) -> None:
    from gputrain.config import load_config

    with pytest.raises(ConfigError) as err:
        load_config(None, {"train.cuda_graphs": True, "parallel.strategy": strategy})
    message = str(err.value)
    assert message.startswith(f"config error: train.cuda_graphs = True: cannot be used with parallel.strategy={strategy}")
    assert "use parallel.strategy=none or ddp, or set train.cuda_graphs=false" in message
    load_config(None, {"train.cuda_graphs": True, "parallel.strategy": "ddp"})  # fine


def test_cuda_graphs_on_cpu_is_ignored_and_leaves_gradients_alone(tmp_path: Path) -> None:
    data = TensorData(torch.randn(64, 6), torch.randint(0, 3, (64,)))
    trainer = Trainer(nn.Linear(6, 3), data, config={"train.cuda_graphs": True, "train.device": "cpu",
                                                     "log.progress": "none", "log.tensorboard": False},
                      run_dir=tmp_path)
    assert not trainer.parts.step.persistent_grads


@pytest.fixture
def clean_tf32() -> Any:
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.backends.cudnn.benchmark)
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = saved


class ReplayedOutputs(nn.Module):
    """Returns its output in one buffer that each call overwrites, as a CUDA-graph replay returns
    the graph pool's memory: an output held past the next call changes under the holder."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 4)
        self.register_buffer("pool", torch.zeros(0))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        out = self.linear(inputs).detach()
        if self.pool.shape != out.shape:
            self.pool = torch.empty_like(out)
        return self.pool.copy_(out)


def test_evaluation_under_cuda_graphs_copies_each_batchs_outputs_before_the_next_replay() -> None:
    import contextlib

    from gputrain.evaluate.evaluator import EvalSpec, SplitPass, evaluate_split
    from gputrain.train.tasks import Task

    torch.manual_seed(0)
    model = ReplayedOutputs()
    batches = [(torch.randn(8, 6), torch.randint(0, 4, (8,))) for _ in range(6)]
    plain = nn.Sequential(model.linear)  # the same weights, fresh outputs every call

    def figures(net: nn.Module, graphed: bool) -> dict[str, float]:
        spec = EvalSpec(Task("classification", F.cross_entropy, 4), ["accuracy", "auroc", "loss"], contextlib.nullcontext)
        return evaluate_split(net, batches, spec, SplitPass(torch.device("cpu"), graphed=graphed))[0]

    assert figures(model, graphed=True) == figures(plain, graphed=False)


def test_precision_objects_no_longer_touch_process_wide_tf32(clean_tf32: Any) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    Precision("bf16", torch.device("cuda", 0))
    assert torch.backends.cuda.matmul.allow_tf32 is False


@pytest.mark.parametrize(("precision", "tf32"), [("bf16", True), ("tf32", True), ("fp32", False)])
def test_switches_make_the_runs_gpu_current_and_set_tf32_readably(monkeypatch: pytest.MonkeyPatch, clean_tf32: Any,
                                                                   precision: str, tf32: bool) -> None:
    current: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "set_device", current.append)  # no GPU here to make current
    # a user script that followed torch's newer advice first: the two TF32 APIs must not end up
    # in the mixed state in which reading either raises (inductor reads both)
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.backends.cudnn.conv.fp32_precision = "ieee"
    switches = apply_process_switches(torch.device("cuda", 3), precision, deterministic=False)
    assert current == [torch.device("cuda", 3)]
    assert switches.tf32 is tf32 and switches.cudnn_benchmark
    assert torch.backends.cuda.matmul.allow_tf32 is tf32 and torch.backends.cudnn.allow_tf32 is tf32
    assert torch.backends.cuda.matmul.fp32_precision == ("tf32" if tf32 else "ieee")
    assert switches.describe(torch.device("cuda", 3)) == f"tf32 {'on' if tf32 else 'off'}, cudnn.benchmark on"


class RecordingPipeline:
    """Stands in for distributed.pp.PipelineRunner: records what the schedule would run under."""

    def __init__(self) -> None:
        self.autocast_dtype: torch.dtype | None = None

    def step(self, micro_batches: list[Any]) -> torch.Tensor:
        if torch.is_autocast_enabled("cpu"):
            self.autocast_dtype = torch.get_autocast_dtype("cpu")
        return torch.tensor(1.0)


def test_the_pipeline_schedule_runs_under_the_runs_autocast() -> None:
    model = nn.Linear(2, 2)
    pipeline = RecordingPipeline()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    parts = StepParts(model=model, optimizer=optimizer, scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
                      precision=Precision("bf16", torch.device("cpu")), compute_loss=lambda m, b: m(b).sum(),
                      pipeline=pipeline)
    train_step(parts, [torch.ones(1, 2), torch.ones(1, 2)], measure_grad_norm=False)
    assert pipeline.autocast_dtype == torch.bfloat16  # bf16 stages really compute in bf16


@pytest.mark.parametrize("pipelined", [{"parallel.strategy": "pp"},
                                       {"parallel.strategy": "hybrid", "parallel.pp": 2, "parallel.dp_shard": 1}])
def test_fp16_with_a_pipeline_is_refused_for_there_is_no_loss_to_scale(pipelined: dict[str, Any]) -> None:
    from gputrain.config import load_config

    with pytest.raises(ConfigError, match=r"train.precision = 'fp16': fp16 cannot be used with pipeline parallelism"):
        load_config(None, {"train.precision": "fp16", **pipelined})
    load_config(None, {"train.precision": "bf16", **pipelined})


def test_each_rank_finds_its_gpu_also_where_it_sees_only_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    from gputrain.distributed.context import process_group_backend, rank_device

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert rank_device(3) == torch.device("cuda", 3)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # srun --gpus-per-task=1
    assert rank_device(3) == torch.device("cuda", 0)
    assert process_group_backend(torch.device("cuda", 0), cpu_collectives=True) == "cuda:nccl,cpu:gloo"
    assert process_group_backend(torch.device("cuda", 0), cpu_collectives=False) == "nccl"
    assert process_group_backend(torch.device("cpu"), cpu_collectives=True) == "gloo"


@pytest.mark.parametrize(("capability", "expected"), [((7, 0), "fp16"), ((7, 5), "fp16"), ((8, 0), "bf16"),
                                                      ((9, 0), "bf16")])
def test_auto_precision_uses_bf16_only_where_tensor_cores_have_it(monkeypatch: pytest.MonkeyPatch,
                                                                  capability: tuple[int, int], expected: str) -> None:
    from gputrain.precision import resolve_precision

    # V100 (7.0) and T4 (7.5) emulate bf16, and torch.cuda.is_bf16_supported() says yes for them
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert resolve_precision("auto", torch.device("cuda", 0))[0] == expected
