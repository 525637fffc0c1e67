"""The anatomy of a training step, counted on the CPU: gputrain's real step against a hand loop.

What a GPU step costs beyond its arithmetic is decided on the host: how many ops it dispatches
(most of them a kernel launch on a GPU; views and no-op casts are not), how often it waits for
the device (a host sync), and whether torch.compile really runs (frames compiled, graph breaks,
recompiles, compiled regions run). All of that can be counted without a GPU, so a bug like issue
28's "compile never ran" (a dispatch mode on step 1 made dynamo run the forwards eagerly for good)
shows here, not on a rare GPU.

For each model, eager and compiled, both loops train the same model (same weights, data, batch
order, precision (fp32, or bf16 autocast in both), fused AdamW, gradient clipping or none, the
same compile scope: gputrain's `compile_in_place`, the whole model as nanoGPT compiles it) for
a few steps, each step inside a `record_function` range, under
torch.profiler (which, unlike a TorchDispatchMode, leaves dynamo's compiled code running; under a
dispatch mode dynamo runs a compiled frame eagerly). Per step, from step 3 on:

- **ops**: aten ops called from the host (Python, autograd's engine, compiled code), not the ops
  they call inside (`aten::linear` counts, its `aten::addmm` does not); ops fused by inductor
  into one kernel are not aten ops and are not counted (a compiled region counts as the ops it
  still dispatches, its extern kernels: matmuls, convolutions);
- **syncs**: ops the host calls that make it wait for a device's result (`SYNC_OPS`: `.item()`,
  `bool()`, `float()` of a tensor, `aten::equal`, `aten::nonzero`, ...). A CPU has no device to
  wait for, but these are the same calls. Not seen on a CPU: a `.cpu()`/`.tolist()` of a tensor
  (a copy on a GPU, nothing on a CPU) and `torch.cuda.synchronize` (the loop calls it at an
  epoch's end only); `benchmarks/gpu_proof.py`'s pipeline part counts those on a GPU;
- **regions**: compiled regions run (dynamo's "Torch-Compiled Region" ranges): one per compiled
  frame a step runs; fewer than the hand loop's means something ran eagerly;
- **frames / graphs / breaks / recompiles**: torch._dynamo's counters (frames compiled, unique
  graphs, graph breaks); a recompile is any frame compiled after step 2.

On a GPU (`--device cuda`, benchmarks/gpu_proof.py's anatomy part) two counts are added per step:
- **launches**: kernel launches the host made (the profiler's CUDA runtime and driver events:
  `cudaLaunchKernel`, inductor's Triton kernels' `cuLaunchKernel`, a CUDA graph's one
  `cudaGraphLaunch`), what the host pays per step whatever the kernels do;
- **device syncs**: the calls that made the host wait for the GPU, as torch's sync debug mode
  ("warn") reports them, `.cpu()` and pageable copies included, which the CPU count cannot see.

gputrain runs `Trainer.fit` on the model and data (build_training's parts, as `gputrain train`
builds them), with the GPU's non-finite guard (the
device-side one, device_guard.py: on a CPU a run gets the host guard, one read a step, because there
the read waits for nothing) and logging every `--log-every` steps: the guard's flag and the loss
are read on logging steps only. The hand loop is nanoGPT's: forward, loss, backward, step,
zero_grad, schedule step.

    python benchmarks/step_anatomy.py [--cases mlp gpt-tiny ...] [--steps 8] [--no-compile]
        [--clip 1.0] [--precision bf16]

`measure` and `violations` are what tests/unit/train/test_step_anatomy.py and
tests/adversarial/test_step_anatomy.py assert on; ALLOWED_EXTRA names every op gputrain's quiet
step may dispatch beyond the hand loop's, and why. For compiled runs the hand loop is also run
with its blocks compiled one by one (gputrain's scope under FSDP, TP, activation checkpointing or a
pipeline; its only scope before issue 28), to show what the scope costs.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import platform
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gputrain.data.batches import BatchPlan
from gputrain.data.tensors import TensorData

STEP = "anatomy::step"
SYNC_OPS = frozenset({
    "aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::equal", "aten::allclose",
    "aten::nonzero", "aten::masked_select", "aten::_unique2", "aten::unique_consecutive",
})
"""Ops the host calls whose result it must wait for on a GPU: a Python number (`.item()`, `bool()`,
`float()` of a tensor), a comparison answered on the host, an output whose size is the data's.
Counted where the host calls them (outermost aten ops), not where a CPU kernel reads a number
inside itself (the CPU's fused AdamW reads each step count so; on a GPU that is one kernel)."""
COMPILED_REGION = "Torch-Compiled Region"
LAUNCH_MARKS = ("LaunchKernel", "LaunchCooperativeKernel", "cudaGraphLaunch")
"""Substrings of the CUDA runtime/driver calls that launch work: cudaLaunchKernel(ExC), cuLaunchKernel(Ex)
(inductor's Triton kernels), a cooperative launch, a CUDA graph's replay."""
SYNC_WARNING = "called a synchronizing CUDA operation"
"""torch.cuda.set_sync_debug_mode("warn")'s per-call warning (the mode also warns, once, that it is a
prototype: not counted)."""


GUARD = "the non-finite guard (device_guard.py)"
TOKENS = "the LM's token-level loss (train/token_loss.py)"
ALLOWED_EXTRA: dict[str, tuple[int, str]] = {
    # op: (most per quiet step beyond the hand loop's, with one micro-batch a step, why)
    "aten::_amp_foreach_non_finite_check_and_unscale_": (1, f"{GUARD}: one flag from every gradient and the loss"),
    "aten::add_": (1, f"{GUARD}: counts the masked steps (the sticky flag)"),
    "aten::add": (1, f"{GUARD}, where the step measured the gradient norm (clipping): checks loss + norm, not "
                     "every gradient"),
    "aten::eq": (1, f"{GUARD}: keeps the first masked step's loss (with where)"),
    "aten::where": (1, f"{GUARD}: keeps the first masked step's loss"),
    "aten::_foreach_sub_": (2, "torch's fused AdamW given the guard's flag as found_inf: takes each group's step "
                               "counts back where it is set"),
    "aten::to": (4, "casts to the dtype and device a tensor has already, no kernel: the guard's loss.float(), the "
                    "fused AdamW's found_inf.to(device) once a group, the LM loss's .float() (fp32 logits)"),
    "aten::_fused_adamw_": (1, "the second parameter group (optim decay_groups: two groups always, weight decay "
                               "on matrices only, as nanoGPT's); the hand loop has one"),
    "aten::_foreach_add_": (1, "the second parameter group's step counts"),
    "aten::detach": (1, "forward_backward's loss.detach() (a view, no kernel)"),
    "aten::flatten": (2, "the LM loss flattens where nanoGPT's views (views, no kernel)"),
}
"""The ops gputrain's quiet step may dispatch beyond the hand loop's, each named; every other
extra op is a finding. On a GPU the guard's five are kernels (the flag check, add_, eq, where and
the step counts' _foreach_sub_), the second group's two as well; the rest launch nothing."""

LAUNCH_HANDFUL = 10
"""Kernel launches gputrain's quiet step may make beyond the hand loop's on a GPU: ALLOWED_EXTRA's
kernels (the guard's flag check, add_, eq, where and two _foreach_sub_, the second parameter group's
fused AdamW and step counts: 8, each one multi-tensor launch at these parameter counts), and two to
spare for the clip's add and a fill the CUDA guard's flag may need. The others are views or casts."""

TOKEN_EXTRA: dict[str, tuple[int, str]] = {
    # a language model's loss is summed over its valid (not -100) tokens and divided by the global
    # batch's count of them (one all-reduce of it on several ranks), where nanoGPT's averages per
    # micro-batch: seven small kernels on scalars and the label mask per step
    "aten::ne": (1, f"{TOKENS}: marks the micro-batch's valid labels"),
    "aten::sum": (1, f"{TOKENS}: counts them"),
    "aten::clamp": (1, f"{TOKENS}: the step's scale 1 / max(count, 1)"),
    "aten::reciprocal": (1, f"{TOKENS}: the step's scale 1 / max(count, 1)"),
    "aten::mul": (2, f"{TOKENS}: each micro-batch's summed loss times the scale, forward and backward"),
    "aten::gt": (1, f"{TOKENS}: the step's loss is NaN where the global batch has no valid token (with div)"),
    "aten::div": (1, f"{TOKENS}: the step's loss is NaN where the global batch has no valid token"),
}
"""Beyond ALLOWED_EXTRA, for a language model (a case with an lm spec: gputrain normalises its loss
over tokens)."""

PER_MICRO_BATCH = {"aten::detach": 1, "aten::flatten": 2, "aten::to": 1}
"""Of ALLOWED_EXTRA, what each micro-batch adds (the loss's detach, the LM loss's flattens and cast)."""
TOKEN_PER_MICRO_BATCH = {"aten::ne": 1, "aten::sum": 1, "aten::mul": 2}
"""Of TOKEN_EXTRA, what each micro-batch adds (its count, its loss times the scale and back)."""


def launch_handful(tokens: bool) -> int:
    """LAUNCH_HANDFUL, and for a language model TOKEN_EXTRA's ops too: each is a kernel on a GPU (on
    scalars and the label mask), the price of normalising the loss over the global batch's tokens."""
    return LAUNCH_HANDFUL + (sum(count for count, _ in TOKEN_EXTRA.values()) if tokens else 0)

ACCUMULATION_EXTRA: dict[str, tuple[int, str]] = {
    # op: (most per micro-batch beyond the hand loop's, with train.grad_accum > 1, why)
    "aten::mul": (2, "each micro-batch's loss times 1/accum, and its backward, where nanoGPT's divides by accum "
                     "(the hand loop's div, forward and backward: the same kernels)"),
    "aten::add": (1, "the micro-batches' losses summed on the device (the step's mean loss, read on logging "
                     "steps)"),
}


@dataclasses.dataclass(frozen=True)
class Case:
    """A model and its data, built the same way for both loops."""

    name: str
    make_model: Callable[[], nn.Module]
    data: TensorData
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    """The hand loop's loss (gputrain's comes from its task: the same function, see `_extra`)."""
    batch: int = 16
    spec: Any = None
    """gputrain's DataSpec where the data alone does not tell the task (a language model)."""


def _seeded(build: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        torch.manual_seed(0)
        return build()

    return make


def mlp_case() -> Case:
    g = torch.Generator().manual_seed(0)
    data = TensorData(torch.randn(1024, 32, generator=g), torch.randint(0, 10, (1024,), generator=g))
    return Case("mlp", _seeded(lambda: nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))), data,
                F.cross_entropy)


def _gpt_case(name: str, model: dict[str, Any], seq_len: int, vocab: int, batch: int) -> Case:
    from gputrain.config.schema import ModelConfig
    from gputrain.data.spec import DataSpec
    from gputrain.models import build_model

    spec = DataSpec(task="lm", input_shape=(seq_len,), vocab_size=vocab)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (64 * batch, seq_len + 1), generator=g)
    data = TensorData(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:  # nanoGPT's
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    config = ModelConfig(name="gpt", **model)
    return Case(name, _seeded(lambda: build_model(config, spec)), data, loss, batch=batch, spec=spec)


def gpt_tiny_case() -> Case:
    """gputrain's `tiny` preset (2 layers, d=64) at a short context."""
    return _gpt_case("gpt-tiny", {"preset": "tiny", "dropout": 0.0}, seq_len=32, vocab=256, batch=4)


def gpt2_shaped_case() -> Case:
    """GPT-2 124M's block (d=768, 12 heads, GPT-2's vocabulary) with 2 layers, at T=64."""
    model = {"n_layer": 2, "n_head": 12, "d_model": 768, "dropout": 0.0}
    return _gpt_case("gpt2-2layer", model, seq_len=64, vocab=50304, batch=2)


def resnet_case(variant: str) -> Case:
    from gputrain.config.schema import ModelConfig
    from gputrain.data.spec import DataSpec
    from gputrain.models import build_model

    spec = DataSpec(task="classification", input_shape=(3, 32, 32), num_classes=10)
    g = torch.Generator().manual_seed(0)
    data = TensorData(torch.randn(256, 3, 32, 32, generator=g), torch.randint(0, 10, (256,), generator=g))
    config = ModelConfig(name=variant)
    return Case(variant, _seeded(lambda: build_model(config, spec)), data, F.cross_entropy, batch=8, spec=spec)


CASES: dict[str, Callable[[], Case]] = {
    "mlp": mlp_case,
    "gpt-tiny": gpt_tiny_case,
    "gpt2-2layer": gpt2_shaped_case,
    "resnet18": lambda: resnet_case("resnet18"),
    "resnet50": lambda: resnet_case("resnet50"),
}


@dataclasses.dataclass
class StepCount:
    """What one step did (see the module docstring)."""

    ops: collections.Counter
    syncs: collections.Counter
    regions: int
    frames: int
    """Frames dynamo compiled during this step."""
    graphs: int
    breaks: int
    launches: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    """Kernel launches by the op or compiled region that made them (on a GPU; none on a CPU)."""
    device_syncs: int = 0
    """Host waits the sync debug mode reported (on a GPU)."""

    @property
    def n_launches(self) -> int:
        return sum(self.launches.values())

    @property
    def n_ops(self) -> int:
        return sum(self.ops.values())

    @property
    def n_syncs(self) -> int:
        return sum(self.syncs.values())


@dataclasses.dataclass
class Anatomy:
    """Every step of one run of one loop; steps[0] is step 1."""

    loop: str
    case: str
    compiled: bool
    log_every: int
    steps: list[StepCount]
    frames: int
    """Frames compiled over the whole run; graphs, breaks likewise."""
    graphs: int
    breaks: int
    break_reasons: list[str]
    accum: int = 1
    """Micro-batches a step."""
    device: str = "cpu"

    tokens: bool = False
    """A language model: gputrain's loss is normalised over the global batch's tokens (TOKEN_EXTRA)."""

    def after_warmup(self) -> list[tuple[int, StepCount]]:
        return [(i + 1, s) for i, s in enumerate(self.steps) if i >= 2]

    def logging(self, step: int) -> bool:
        """Whether gputrain logged at `step`: every `log_every` steps and the last (metrics.py's `due`)."""
        return self.loop == "gputrain" and (step % self.log_every == 0 or step == len(self.steps))

    @property
    def recompiles(self) -> int:
        """Frames compiled after step 2."""
        return sum(s.frames for _, s in self.after_warmup())

    def ops_per_step(self) -> int:
        """The most ops of a step after warm-up (all such steps dispatch the same ops)."""
        return max(s.n_ops for _, s in self.after_warmup())

    def syncs(self, logging: bool) -> int:
        """The most syncs of a step after warm-up, logging steps or the others."""
        return max((s.n_syncs for i, s in self.after_warmup() if self.logging(i) == logging), default=0)

    def device_syncs(self, logging: bool) -> int:
        """The most host waits the sync debug mode saw in a step after warm-up (a GPU's)."""
        return max((s.device_syncs for i, s in self.after_warmup() if self.logging(i) == logging), default=0)

    def launches_per_step(self) -> int:
        """The most kernel launches of a quiet step after warm-up (a GPU's)."""
        return max((s.n_launches for i, s in self.after_warmup() if not self.logging(i)), default=0)

    def regions_per_step(self) -> int:
        return min(s.regions for _, s in self.after_warmup())

    def quiet_step(self) -> StepCount:
        """A non-logging step after warm-up."""
        return next(s for i, s in self.after_warmup() if not self.logging(i))


class _Recorder:
    """Opens one profiler range a step: `next()` ends the current step and starts the next; the
    dynamo counters are read at each boundary."""

    def __init__(self, device_syncs: Callable[[], int] = lambda: 0) -> None:
        self.bounds: list[tuple[int, int, int, int]] = []
        self._range: Any = None
        self._device_syncs = device_syncs

    def next(self) -> None:
        from torch._dynamo.utils import counters

        if self._range is not None:
            self._range.__exit__(None, None, None)
        self.bounds.append((counters["frames"]["total"], counters["stats"]["unique_graphs"],
                            sum(counters["graph_break"].values()), self._device_syncs()))
        self._range = torch.profiler.record_function(f"{STEP}:{len(self.bounds)}")
        self._range.__enter__()

    def close(self) -> None:
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None


@contextlib.contextmanager
def _fresh_dynamo() -> Iterator[None]:
    """Each run compiles from nothing and counts from zero."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield


def _step_of(event: Any) -> int | None:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith(STEP + ":"):
            return int(parent.name.rsplit(":", 1)[1])
        parent = parent.cpu_parent
    return None


def _outermost(event: Any, names: Callable[[str], bool]) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if names(parent.name):
            return False
        parent = parent.cpu_parent
    return True


def _on_host(event: Any) -> bool:
    return str(getattr(event, "device_type", "CPU")).endswith("CPU")


def _launcher(event: Any) -> str:
    """What made a launch: the outermost aten op or compiled region above it, else the call's name."""
    found = event.name
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::") or parent.name.startswith(COMPILED_REGION):
            found = parent.name
        parent = parent.cpu_parent
    return found


def _launches(events: list[Any], steps: int) -> list[collections.Counter]:
    """Kernel launches per step, by what made them (`_launcher`): each runtime/driver launch call in
    the step's range (by time, on the host's side: runtime calls need not nest under the step's range)."""
    ranges = sorted((e.time_range.start, e.time_range.end, int(e.name.rsplit(":", 1)[1]))
                    for e in events if e.name.startswith(STEP + ":") and _on_host(e))
    launches: list[collections.Counter] = [collections.Counter() for _ in range(steps)]
    for event in events:
        if not (_on_host(event) and any(mark in event.name for mark in LAUNCH_MARKS)):
            continue
        for start, end, step in ranges:
            if start <= event.time_range.start < end and step <= steps:
                launches[step - 1][_launcher(event)] += 1
                break
    return launches


def _count(prof: Any, recorder: _Recorder, steps: int) -> list[StepCount]:
    """Split the profile's events by step range."""
    ops: list[collections.Counter] = [collections.Counter() for _ in range(steps)]
    syncs: list[collections.Counter] = [collections.Counter() for _ in range(steps)]
    regions = [0] * steps
    events = list(prof.events())
    for event in events:
        name = event.name
        if not _on_host(event):  # a GPU's copy of a range or op (kernels, annotations)
            continue
        is_aten = name.startswith("aten::")
        if not (is_aten or name.startswith(COMPILED_REGION)):
            continue
        step = _step_of(event)
        if step is None or step > steps:
            continue
        if name.startswith(COMPILED_REGION):
            regions[step - 1] += 1
            continue
        if _outermost(event, lambda n: n.startswith("aten::")):
            ops[step - 1][name] += 1
            if name in SYNC_OPS:
                syncs[step - 1][name] += 1
    launches = _launches(events, steps)
    bounds = recorder.bounds
    counts = []
    for i in range(steps):
        # bounds[i] is read when step i+1 starts, bounds[i+1] when it ends
        (f0, g0, b0, s0), (f1, g1, b1, s1) = bounds[i], bounds[i + 1]
        counts.append(StepCount(ops[i], syncs[i], regions[i], f1 - f0, g1 - g0, b1 - b0, launches[i], s1 - s0))
    return counts


@contextlib.contextmanager
def _sync_warnings(device: torch.device) -> Iterator[Callable[[], int]]:
    """On CUDA, torch's sync debug mode in "warn": yields a count of the host waits it reported so far."""
    if device.type != "cuda":
        yield lambda: 0
        return
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield lambda: sum(SYNC_WARNING in str(w.message) for w in caught)
        finally:
            torch.cuda.set_sync_debug_mode(0)


def _profiled(run: Callable[[_Recorder], None], case: Case, loop: str, compiled: bool, steps: int,
              log_every: int, device: torch.device) -> Anatomy:
    from torch._dynamo.utils import counters

    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with _fresh_dynamo(), _sync_warnings(device) as device_syncs, torch.profiler.profile(activities=activities) as prof:
        recorder = _Recorder(device_syncs)
        try:
            run(recorder)
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # after the last step's range: not counted as a step's
        finally:
            recorder.close()
    frames, graphs, breaks, _ = recorder.bounds[-1]
    reasons = sorted(str(r) for r in counters["graph_break"])
    return Anatomy(loop, case.name, compiled, log_every, _count(prof, recorder, steps), frames, graphs, breaks,
                   reasons, device=device.type)


def hand_loop(case: Case, compiled: bool, steps: int, log_every: int = 4, clip: float | None = None,
              scope: str = "model", precision: str = "fp32", accum: int = 1, device: str = "cpu") -> Anatomy:
    """The hand loop: plain PyTorch on the same model, data order and fused AdamW, compiled as
    nanoGPT and gpu_gpt2.py compile it: `torch.compile` of the whole model's forward (`scope`
    "blocks": each block of the stack instead, distributed/compiling.py's)."""
    from gputrain.distributed.compiling import compile_in_place

    on = torch.device(device)
    model = case.make_model().to(on)
    if compiled and scope == "model":  # nanoGPT's own call, not gputrain's
        model.forward = types.MethodType(torch.compile(type(model).forward), model)  # type: ignore[method-assign]
    elif compiled:
        compile_in_place(model, scope="blocks")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    plan = BatchPlan(num_samples=len(case.data), global_batch=case.batch, grad_accum=accum, seed=0)
    inputs, targets = case.data.inputs.to(on), case.data.targets.to(on)  # on the GPU, as gputrain's are

    def autocast() -> contextlib.AbstractContextManager[Any]:
        if precision == "bf16":
            return torch.autocast(on.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def run(recorder: _Recorder) -> None:
        model.train()
        order = iter(plan.micro_batches(0, device=on))
        recorder.next()
        for _ in range(steps):
            for idx in next(order):  # nanoGPT's accumulation: each micro-batch's loss / accum
                with autocast():
                    loss = case.loss(model(inputs[idx]), targets[idx])
                (loss / accum if accum > 1 else loss).backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            recorder.next()

    return _profiled(run, case, "hand", compiled, steps, log_every, on)


@contextlib.contextmanager
def _device_guard_on_cpu() -> Iterator[None]:
    """The GPU's guard on CPU tensors (device_guard.ON_CPU: what the tests of the GPU path set)."""
    from gputrain.train import device_guard

    before, device_guard.ON_CPU = device_guard.ON_CPU, True
    try:
        yield
    finally:
        device_guard.ON_CPU = before


def gputrain_loop(case: Case, compiled: bool, steps: int, log_every: int = 4, clip: float | None = None,
                  precision: str = "fp32", accum: int = 1, device: str = "cpu",
                  callbacks: tuple[Any, ...] = ()) -> Anatomy:
    """`Trainer.fit` on the same model and data, as `gputrain train` builds it (fp32, fused AdamW,
    the device-side non-finite guard), logging every `log_every` steps; with `callbacks`, their
    hooks' work counts in the step that ran them."""
    from gputrain import Trainer

    on = torch.device(device)

    def run(recorder: _Recorder) -> None:
        guard = _device_guard_on_cpu() if on.type == "cpu" else contextlib.nullcontext()
        with tempfile.TemporaryDirectory() as run_dir, guard:
            config = {"train.device": device, "train.precision": precision, "train.compile": compiled,
                      "train.batch_size": case.batch, "train.max_steps": steps, "train.epochs": 10**6,
                      "train.seed": 0, "log.every_steps": log_every, "log.progress": "none",
                      "log.tensorboard": False, "checkpoint.enabled": False, "eval.every_epochs": 0,
                      "train.clip_grad_norm": clip, "train.grad_accum": accum}
            trainer = Trainer(case.make_model(), case.data, config=config, run_dir=run_dir, spec=case.spec,
                              loss_fn=None if case.spec is not None else F.cross_entropy, callbacks=callbacks)
            assert trainer.optimizer.defaults.get("fused"), "the anatomy compares fused AdamW with fused AdamW"
            recorder.next()
            summary = trainer.fit(on_step=recorder.next)
        assert summary["global_step"] == steps, summary

    return _profiled(run, case, "gputrain", compiled, steps, log_every, on)


def measure(case: Case, loop: str, compiled: bool, steps: int = 6, log_every: int = 4,
            clip: float | None = None, precision: str = "fp32", accum: int = 1, device: str = "cpu",
            callbacks: tuple[Any, ...] = ()) -> Anatomy:
    """One loop's anatomy: `loop` is "hand" or "gputrain"; `clip`: both clip the gradients' norm
    (train.clip_grad_norm; the hand loop's `clip_grad_norm_`); `precision`: fp32, or bf16 (both
    under autocast); `accum`: micro-batches per step (train.grad_accum); `device`: cpu, or cuda
    (kernel launches and the sync debug mode's host waits counted too); `callbacks`: gputrain's
    Trainer(callbacks=...)."""
    if loop == "hand":
        anatomy = hand_loop(case, compiled, steps, log_every, clip, precision=precision, accum=accum, device=device)
    else:
        anatomy = gputrain_loop(case, compiled, steps, log_every, clip, precision=precision, accum=accum,
                                device=device, callbacks=callbacks)
    anatomy.accum = accum
    anatomy.tokens = loop == "gputrain" and getattr(case.spec, "task", None) == "lm"
    return anatomy


def extra_ops(ours: Anatomy, hand: Anatomy) -> tuple[collections.Counter, collections.Counter]:
    """(ops gputrain's quiet step dispatches beyond the hand loop's, ops it dispatches fewer of)."""
    a, b = ours.quiet_step().ops, hand.quiet_step().ops
    return a - b, b - a


def allowed_extra(op: str, accum: int = 1, tokens: bool = False) -> int:
    """How many more `op`s than the hand loop's gputrain's quiet step may dispatch (`tokens`: a
    language model's, whose loss is normalised over tokens)."""
    allowed = ALLOWED_EXTRA.get(op, (0, ""))[0] + PER_MICRO_BATCH.get(op, 0) * (accum - 1)
    if tokens:
        allowed += TOKEN_EXTRA.get(op, (0, ""))[0] + TOKEN_PER_MICRO_BATCH.get(op, 0) * (accum - 1)
    if accum > 1:
        allowed += ACCUMULATION_EXTRA.get(op, (0, ""))[0] * accum
    return allowed


def violations(ours: Anatomy, hand: Anatomy) -> list[str]:
    """Where gputrain's step does more than the hand loop's (empty: the invariants hold): compiled
    regions, frames, graphs and graph breaks equal to the hand loop's, no frame compiled after
    step 2, no sync on a quiet (non-logging) step, and no op beyond ALLOWED_EXTRA."""
    found = []
    if ours.regions_per_step() != hand.regions_per_step():
        # fewer: something ran eagerly; more: a narrower compile scope (blocks), the code between them eager
        why = "something ran eagerly" if ours.regions_per_step() < hand.regions_per_step() else "a narrower scope"
        found.append(f"compiled regions run per step: {ours.regions_per_step()} against the hand loop's "
                     f"{hand.regions_per_step()} ({why})")
    for what in ("frames", "graphs", "breaks"):
        if getattr(ours, what) != getattr(hand, what):
            found.append(f"{what}: {getattr(ours, what)} against the hand loop's {getattr(hand, what)}"
                         + (f" ({'; '.join(ours.break_reasons)})" if what == "breaks" else ""))
    if ours.recompiles or hand.recompiles:
        found.append(f"frames compiled after step 2: gputrain {ours.recompiles}, hand loop {hand.recompiles}")
    quiet_syncs = [(i, s.syncs) for i, s in ours.after_warmup() if not ours.logging(i) and s.syncs]
    if quiet_syncs:
        found.append(f"syncs on non-logging steps: {quiet_syncs}")
    device_syncs = [(i, s.device_syncs) for i, s in ours.after_warmup() if not ours.logging(i) and s.device_syncs]
    if device_syncs:
        found.append(f"syncs on non-logging steps (sync debug mode): {device_syncs}")
    more, _ = extra_ops(ours, hand)
    beyond = {op: n for op, n in more.items() if n > allowed_extra(op, ours.accum, ours.tokens)}
    if beyond:
        found.append(f"ops beyond the hand loop's and the documented extras: {beyond}")
    return found


def _fmt(counter: collections.Counter) -> str:
    return ", ".join(f"{n.removeprefix('aten::')}×{c}" for n, c in sorted(counter.items())) or "—"


def row(ours: Anatomy, hand: Anatomy) -> str:
    more, fewer = extra_ops(ours, hand)
    mode = "compiled" if ours.compiled else "eager"
    return (
        f"| {ours.case} | {mode} | {hand.ops_per_step()} | {ours.ops_per_step()} | {hand.syncs(False)} | "
        f"{ours.syncs(False)} / {ours.syncs(True)} | {hand.regions_per_step()} / {ours.regions_per_step()} | "
        f"{hand.frames} / {ours.frames} | {hand.graphs} / {ours.graphs} | {hand.breaks} / {ours.breaks} | "
        f"{hand.recompiles} / {ours.recompiles} | +{_fmt(more)}; −{_fmt(fewer)} |"
    )


HEADER = (
    "| model | mode | ops/step hand | ops/step gputrain | syncs hand | syncs gputrain quiet / logging | "
    "compiled regions/step hand / gputrain | frames hand / gputrain | graphs | graph breaks | "
    "recompiles after step 2 | gputrain's extra ops (quiet step) |\n"
    "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
)


CUDA_HEADER = (
    "| model | mode | kernel launches/step hand | gputrain | host waits/step hand | gputrain quiet / logging | "
    "ops/step hand / gputrain | compiled regions/step hand / gputrain | graphs hand / gputrain |\n"
    "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
)


def cuda_row(ours: Anatomy, hand: Anatomy) -> str:
    """A GPU's counts: launches and the sync debug mode's host waits, beside the ops."""
    mode = "compiled" if ours.compiled else "eager"
    return (
        f"| {ours.case} | {mode} | {hand.launches_per_step()} | {ours.launches_per_step()} | "
        f"{hand.device_syncs(False)} | {ours.device_syncs(False)} / {ours.device_syncs(True)} | "
        f"{hand.ops_per_step()} / {ours.ops_per_step()} | {hand.regions_per_step()} / {ours.regions_per_step()} | "
        f"{hand.graphs} / {ours.graphs} |"
    )


def summary(ours: Anatomy, hand: Anatomy) -> dict[str, Any]:
    """The figures of one model and mode, both loops (gpu_proof.py's anatomy part keeps these)."""
    more, fewer = extra_ops(ours, hand)
    quiet_launches = ours.quiet_step().launches - hand.quiet_step().launches
    return {
        "case": ours.case, "compiled": ours.compiled, "device": ours.device,
        "launches_per_step": {"hand": hand.launches_per_step(), "gputrain": ours.launches_per_step()},
        "extra_launches_quiet_step": dict(quiet_launches),
        "host_waits_per_step": {"hand": hand.device_syncs(False), "gputrain_quiet": ours.device_syncs(False),
                                "gputrain_logging": ours.device_syncs(True)},
        "ops_per_step": {"hand": hand.ops_per_step(), "gputrain": ours.ops_per_step()},
        "syncing_ops": {"hand": hand.syncs(False), "gputrain_quiet": ours.syncs(False),
                        "gputrain_logging": ours.syncs(True)},
        "regions_per_step": {"hand": hand.regions_per_step(), "gputrain": ours.regions_per_step()},
        "graphs": {"hand": hand.graphs, "gputrain": ours.graphs},
        "breaks": {"hand": hand.breaks, "gputrain": ours.breaks},
        "recompiles": {"hand": hand.recompiles, "gputrain": ours.recompiles},
        "extra_ops": dict(more), "fewer_ops": dict(fewer), "violations": violations(ours, hand),
    }


def compile_seconds(case: Case, scope: str, device: str = "cpu") -> float:
    """Seconds the first compiled forward and backward of one micro-batch take beyond an eager one:
    what `scope` ("model" or "blocks", distributed/compiling.py's) costs to compile, cold."""
    from gputrain.distributed.compiling import compile_in_place

    on = torch.device(device)
    model = case.make_model().to(on)
    idx = torch.arange(case.batch)
    inputs, targets = case.data.inputs[idx].to(on), case.data.targets[idx].to(on)

    def step() -> float:
        start = time.perf_counter()
        case.loss(model(inputs), targets).backward()
        if on.type == "cuda":
            torch.cuda.synchronize(on)
        return time.perf_counter() - start

    step()  # eager, warm
    eager = step()
    # inductor's on-disk caches off: a cold compile, as a new graph (or a new torch) costs it
    with _fresh_dynamo(), torch._inductor.config.patch(force_disable_caches=True):
        compile_in_place(model, scope=scope)  # type: ignore[arg-type]
        return step() - eager


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["mlp", "gpt-tiny", "gpt2-2layer", "resnet18"],
                        choices=sorted(CASES))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--log-every", type=int, default=4)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--clip", type=float, default=None,
                        help="both loops clip the gradients' norm to this (train.clip_grad_norm; clip_grad_norm_)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--accum", type=int, default=1, help="micro-batches per step (train.grad_accum)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: also kernel launches and host waits (sync debug mode) per step")
    parser.add_argument("--compile-time", action="store_true",
                        help="also the seconds a cold compile takes, whole model against block by block")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("step_anatomy.py: --device cuda: no CUDA device here (torch "
                         f"{torch.__version__}); run it on a GPU machine, or without --device")
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} thread(s), {time.strftime('%Y-%m-%d %H:%M')}; steps 3..{args.steps}, "
          f"logging every {args.log_every}, {args.precision}, grad_accum {args.accum}"
          + (f", clip_grad_norm {args.clip}" if args.clip else "") + f", {args.device}")
    print(HEADER)
    scopes: list[str] = []
    gpu_rows: list[str] = []
    for name in args.cases:
        case = CASES[name]()
        for compiled in (False,) if args.no_compile else (False, True):
            hand = measure(case, "hand", compiled, args.steps, args.log_every, args.clip, args.precision, args.accum,
                           args.device)
            ours = measure(case, "gputrain", compiled, args.steps, args.log_every, args.clip, args.precision,
                           args.accum, args.device)
            print(row(ours, hand), flush=True)
            gpu_rows.append(cuda_row(ours, hand))
            if compiled:  # the scope's cost: blocks one by one (under FSDP, TP, AC, PP) against the whole model
                blocks = hand_loop(case, True, args.steps, args.log_every, args.clip, "blocks", args.precision,
                                   args.accum, args.device)
                seconds = ""
                if args.compile_time:
                    whole_s, blocks_s = (compile_seconds(case, s, args.device) for s in ("model", "blocks"))
                    seconds = f" {whole_s:.1f} | {blocks_s:.1f} |"
                scopes.append(f"| {name} | {blocks.regions_per_step()} | {blocks.ops_per_step()} | "
                              f"{blocks.graphs} | {hand.regions_per_step()} | {hand.ops_per_step()} | "
                              f"{hand.graphs} | {hand.breaks} |{seconds}")
            for problem in violations(ours, hand):
                print(f"  VIOLATION ({name}, {'compiled' if compiled else 'eager'}): {problem}")
            for anatomy in (hand, ours):
                for reason in anatomy.break_reasons:
                    print(f"  graph break ({anatomy.loop}): {reason}")
    if scopes:
        print("\nCompile scope, hand loop: block by block (gputrain's under FSDP/TP/AC/PP) or the whole model "
              "(nanoGPT's; gputrain's otherwise)\n")
        timed = " compile s, whole | compile s, blocks |" if args.compile_time else ""
        print("| model | regions/step, blocks | ops/step, blocks | graphs, blocks | regions/step, whole | "
              "ops/step, whole | graphs, whole | graph breaks, whole |" + timed + "\n"
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if timed else ""))
        print("\n".join(scopes))
    if args.device == "cuda":
        print(f"\nOn {torch.cuda.get_device_name()}: kernel launches and host waits per step\n")
        print(CUDA_HEADER)
        print("\n".join(gpu_rows))


if __name__ == "__main__":
    main()
