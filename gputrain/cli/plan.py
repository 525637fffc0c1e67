"""`gputrain plan`: will it fit? Bytes per device for each layout, which fit, what auto takes and why.

One training step (its train.grad_accum micro-batches) is measured on fake tensors (shapes only: no
memory, no compute), then composed into each strategy's bytes per device, with and without activation
checkpointing and CPU offload; pp is measured stage by stage, each through its part of the schedule.
Checked against the CPU allocator's peak in real Trainer runs: benchmarks/plan_accuracy.py.
Exit codes: 0 a layout fits; 1 none does (the output says by how much and what would); 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from gputrain.config.docs import RL_SECTION, fields_help_text

if TYPE_CHECKING:
    from gputrain.distributed.parallel_dims import Strategy
    from gputrain.plan.planner import MemoryPlan, PlanTarget

_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGTP]i?B?|B)?\s*", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
DEVICE_MEMORY_MIN = 1 << 20
"""1 MiB: less holds no model's step (the CUDA context alone is hundreds of MiB)."""
DEVICE_MEMORY_MAX = 1 << 50
"""1 PiB: thousands of times any device's memory; beyond, the numbers only overflow."""
GIVEN = "given with --device-memory"


def parse_size(text: str) -> int:
    """'80GiB', '80 GB', '512MiB', '1PiB', '4e9'-free plain bytes → bytes, within DEVICE_MEMORY_MIN
    and DEVICE_MEMORY_MAX; argparse's type for --device-memory."""
    m = _SIZE.fullmatch(text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a memory size; use e.g. 80GiB, 24GB or 512MiB")
    number, unit = float(m.group(1)), (m.group(2) or "").upper()
    scale = 1024 ** ("KMGTP".index(unit[0]) + 1) if "I" in unit else _UNITS[unit[:1]]
    size = number * scale  # a float: a number of 400 digits is inf, not an error
    if not DEVICE_MEMORY_MIN <= size <= DEVICE_MEMORY_MAX:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: a device memory is between 1MiB and 1PiB")
    return int(size)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE.toml", help="TOML config file (overrides still apply on top)")
    parser.add_argument("--nproc-per-node", type=int, default=1, metavar="N", help="ranks per node (one device each)")
    parser.add_argument("--nnodes", type=int, default=1, metavar="N", help="nodes (default 1)")
    parser.add_argument(
        "--device-memory", type=parse_size, metavar="SIZE", help="one device's memory, e.g. 80GiB (default: this one's)"
    )
    parser.add_argument("--find-batch", action="store_true", help="also the largest micro-batch that fits")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    parser.epilog = fields_help_text(omit=(RL_SECTION,))


def build_plan_target(config: Any, world: int = 1) -> tuple[PlanTarget, int, str]:
    """(what a step of this config runs, its micro-batch on each of `world` ranks, the device's name)."""
    import torch

    from gputrain.data import build_data
    from gputrain.data.pixels import as_model_sees_it
    from gputrain.env.device import resolve_device
    from gputrain.models import build_model
    from gputrain.plan.targets import build_target, data_parallel_ranks
    from gputrain.precision import resolve_precision
    from gputrain.train.tasks import loss_of_batch, resolve_task

    device = resolve_device(config.train.device)[0]
    precision = resolve_precision(config.train.precision, device)[0]
    bundle = build_data(config.data, config.train.seed)
    with torch.device("meta"):  # the plan needs shapes only: a model of any size costs nothing
        model = build_model(config.model, bundle.spec)
    x, *rest = bundle.train[0]
    sample = (as_model_sees_it(x), *rest)
    loss_of = loss_of_batch(resolve_task(model, bundle.train, spec=bundle.spec, loss_fn=None, step_fn=None), None)
    target = build_target(config, model, sample, device, precision, loss_of=loss_of)
    train = config.train
    micro = 1
    if isinstance(train.micro_batch_size, int):
        micro = train.micro_batch_size
    elif isinstance(train.batch_size, int):
        micro = max(1, train.batch_size // data_parallel_ranks(config, world) // target.accum)
    return target, micro, f"{device.type} ({precision})"


def would_fit(target: PlanTarget, plan: MemoryPlan) -> list[str]:
    """What would make the job fit when no layout does: more devices, offload, a smaller batch."""
    from gputrain.distributed.auto import format_bytes
    from gputrain.plan.batch import plan_micro_batch
    from gputrain.plan.planner import AC_MODES, layout_row

    ideas: list[str] = []
    for world in (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
        if world <= plan.world:
            continue
        for ac in AC_MODES:
            if layout_row(target, plan.micro_batch, world, "fsdp", ac, False, plan.device_bytes)[0].fits:
                extra = f" parallel.activation_checkpointing={ac}" if ac != "none" else ""
                ideas.append(f"{world} devices: --nproc-per-node {world} parallel.strategy=fsdp{extra}")
                break
        if ideas:
            break
    row = layout_row(target, plan.micro_batch, plan.world, "fsdp", "full", True, plan.device_bytes)[0]
    if row.fits:
        ideas.append(
            f"CPU offload: parallel.strategy=fsdp parallel.cpu_offload=true parallel.activation_checkpointing=full "
            f"({format_bytes(row.layout.total)} per device, {format_bytes(row.layout.host)} in host memory)"
        )
    strategy: Strategy = "none" if plan.world == 1 else "fsdp"
    micro = plan_micro_batch(target, plan.world, plan.device_bytes, strategy, "full", cap=plan.micro_batch - 1)
    if micro:
        ideas.append(f"a smaller batch: train.micro_batch_size={micro} (or less) with activation checkpointing full")
    return ideas or ["nothing on this plan's list: the model's states alone exceed the device even sharded 1024 ways"]


def render(plan: MemoryPlan, device: str, ideas: list[str], found: int | None, binding: str = GIVEN) -> str:
    """The plan as a table; `binding`: what limits a device's memory (the --device-memory given, or the
    limit of this node that binds one rank, config/memory_limit.py)."""
    from gputrain.distributed.auto import format_count

    # GiB, or MiB where the whole table is under 1 GiB
    unit, scale = ("GiB", 2**30) if max(r.layout.total for r in plan.rows) >= 2**30 else ("MiB", 2**20)

    def fmt(n: float) -> str:
        return f"{n / scale:.2f}"

    lines = [
        f"plan: {format_count(plan.num_params)} parameters, micro-batch {plan.micro_batch} per device, "
        f"{plan.world} rank(s) on {device}; device {fmt(plan.device_bytes)} {unit}, usable {fmt(plan.usable)} {unit}"
        f" ({binding})"
        + ("" if plan.measured else "; activations NOT measured (the model does not run on fake tensors)"),
        f"{unit} per device   strategy  checkpoint  offload  weights  grads  optim  activ  buffers  workspace"
        "   total  fits",
    ]
    for row in plan.rows:
        lay = row.layout
        lines.append(
            f"{'':17}{lay.strategy:<10}{lay.activation_checkpointing:<12}{'yes' if lay.cpu_offload else 'no':<9}"
            f"{fmt(lay.weights):>7}{fmt(lay.gradients):>7}{fmt(lay.optimizer):>7}{fmt(lay.activations):>7}"
            f"{fmt(lay.buffers):>9}{fmt(lay.workspace):>11}{fmt(lay.total):>8}  {'yes' if row.fits else 'no'}"
        )
    if plan.world == 1:
        lines.append("(ddp, fsdp, tp, pp and hybrid need 2 or more ranks: --nproc-per-node N)")
    lines += [f"left out: {why}" for why in plan.left_out]
    if plan.auto is not None:
        lay = plan.auto.layout
        lines.append(
            f"auto picks: {lay.strategy}, activation checkpointing {lay.activation_checkpointing}: the first of "
            f"auto's layouts (replicas before shards, no recompute before recompute) that fits "
            f"({fmt(lay.total)} of {fmt(plan.usable)} {unit} usable)"
        )
    else:
        best = min(plan.rows, key=lambda r: r.layout.total)
        lines.append(
            f"DOES NOT FIT on {plan.world} device(s) of {fmt(plan.device_bytes)} {unit}: the smallest layout "
            f"({best.layout.strategy}, checkpointing {best.layout.activation_checkpointing}"
            f"{', offload' if best.layout.cpu_offload else ''}) needs {fmt(best.layout.total)} {unit}, "
            f"{fmt(best.layout.total - plan.usable)} {unit} over the {fmt(plan.usable)} {unit} usable. Would fit:"
        )
        lines += [f"  - {idea}" for idea in ideas]
    if found is not None:
        lines.append(
            f"largest micro-batch that fits (auto's layout, with headroom): {found}"
            if found
            else "largest micro-batch that fits: none (not even 1 sample)"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from gputrain.config import load_config
    from gputrain.plan.feasible import check_degrees, check_model_layout, plan_world

    world = plan_world(args.nproc_per_node, args.nnodes)  # before anything is loaded or measured
    config = load_config(args.config, args.overrides)
    check_degrees(config, world)
    from gputrain.distributed.auto import device_memory
    from gputrain.plan.batch import plan_micro_batch
    from gputrain.plan.planner import auto_candidates, make_plan

    target, micro, device = build_plan_target(config, world)
    check_model_layout(config, target.model, world, target.accum)  # the model on meta: nothing measured yet
    # without --device-memory: what binds one of the job's ranks on this node, its shared limits
    # divided by the --nproc-per-node ranks that will share them
    limit = None if args.device_memory else device_memory(target.device, args.nproc_per_node)
    device_bytes, binding = (args.device_memory, GIVEN) if limit is None else (limit.bytes, limit.what)
    plan = make_plan(target, micro, world, device_bytes)
    ideas = would_fit(target, plan) if plan.auto is None else []
    found = None
    if args.find_batch or config.train.batch_size == "auto":
        strategy, ac = (
            (plan.auto.layout.strategy, plan.auto.layout.activation_checkpointing)
            if plan.auto
            else auto_candidates(plan.world)[-1]
        )
        found = plan_micro_batch(target, plan.world, device_bytes, strategy, ac)
    if args.json:
        out = {
            "micro_batch": plan.micro_batch,
            "world": plan.world,
            "device": device,
            "device_bytes": plan.device_bytes,
            "device_limit": binding,
            "usable_bytes": plan.usable,
            "num_params": plan.num_params,
            "activations_measured": plan.measured,
            "rows": [{**asdict(r.layout), "total": r.layout.total, "fits": r.fits} for r in plan.rows],
            "left_out": list(plan.left_out),
            "auto": None if plan.auto is None else {**asdict(plan.auto.layout), "total": plan.auto.layout.total},
            "would_fit": ideas,
            "largest_micro_batch": found,
        }
        print(json.dumps(out, indent=1))
    else:
        print(render(plan, device, ideas, found, binding))
    return 0 if plan.auto is not None else 1
