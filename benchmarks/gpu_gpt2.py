"""GPT-2 124M on one GPU: gputrain against a hand-written loop, same kernels and settings.

bf16 autocast, T=1024, torch.compile, fused AdamW, the same batch order. The tokens follow a
random sparse bigram chain (1024 token ids in use, 4 successors each: the loss falls from ln 50304
towards ln 4), so the loss curve says something. Reports tokens/s, MFU by torchtitan's formula
(6N + 12·L·H·Q·T per token) against the datasheet (or `gputrain bench`) bf16 peak, peak memory,
and the ratios. Both compile the whole model, as nanoGPT does (gputrain compiles block by block only
where FSDP, TP, activation checkpointing or a pipeline sit between the blocks; `--ablate` has both
loops per block too).
Goal: >= 45% MFU on one H100/H200. gpu_proof.py calls these functions (also for fp8 against bf16).

    python benchmarks/gpu_gpt2.py [--batch 16] [--steps 60] [--ablate]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any

from _common import gputrain_step_times, header, median, peak_memory, require_cuda, require_registered, time_windows

import torch
import torch.nn.functional as F

GPT2_124M = {"name": "gpt", "preset": "gpt2-124m", "vocab_size": 50304, "dropout": 0.0}


@dataclasses.dataclass(frozen=True)
class GptJob:
    """One measured configuration (gpu_proof.py --dry-run shrinks every size)."""

    device: torch.device
    batch: int = 16
    steps: int = 60
    warmup: int = 20
    seq_len: int = 1024
    model: dict = dataclasses.field(default_factory=lambda: dict(GPT2_124M))
    compile: bool = True

    @property
    def vocab(self) -> int:
        return int(self.model["vocab_size"])


def bigram_tokens(job: GptJob, num_sequences: int, seed: int = 0):  # type: ignore[no-untyped-def]
    """Sequences of a random sparse bigram chain over (at most) 1024 token ids, as TensorData."""
    from gputrain.data.tensors import TensorData

    g = torch.Generator().manual_seed(seed)
    used = torch.randperm(job.vocab, generator=g)[: min(1024, job.vocab)]
    successors = torch.randint(0, len(used), (len(used), 4), generator=g)
    state = torch.randint(0, len(used), (num_sequences,), generator=g)
    columns = [state]
    for _ in range(job.seq_len):
        state = successors[state, torch.randint(0, 4, (num_sequences,), generator=g)]
        columns.append(state)
    tokens = used[torch.stack(columns, dim=1)]
    return TensorData(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())


def spec_of(job: GptJob):  # type: ignore[no-untyped-def]
    from gputrain.data.spec import DataSpec

    return DataSpec(task="lm", input_shape=(job.seq_len,), vocab_size=job.vocab)


def build(job: GptJob, seed: int = 0):  # type: ignore[no-untyped-def]
    from gputrain.config.schema import ModelConfig
    from gputrain.models import build_model

    torch.manual_seed(seed)
    return build_model(ModelConfig(**job.model), spec_of(job))


def flops_per_step(job: GptJob) -> float:
    from gputrain.observe.flops import gpt_dims, gpt_flops_per_token

    with torch.device("meta"):  # shapes only: a d_model-2048 model on the host would take seconds to initialise
        model = build(job)
    dims = gpt_dims(model, job.seq_len)
    assert dims is not None
    per_token = gpt_flops_per_token(dims.n_params, dims.n_layer, dims.n_head, dims.head_dim, job.seq_len)
    return float(per_token * job.batch * job.seq_len)


def run_hand_loop(job: GptJob, data: Any, per_block: bool = False) -> dict[str, Any]:
    """nanoGPT's loop on gputrain's batch order: {"step_s", "peak_memory_bytes"}. `per_block`: compile
    each block as gputrain does, instead of the whole model."""
    from gputrain.distributed.compiling import compile_in_place
    from gputrain.data.batches import BatchPlan

    device, vocab = job.device, job.vocab
    model = build(job).to(device)
    step_model = model
    if job.compile and per_block:
        compile_in_place(model, scope="blocks")
    elif job.compile:
        step_model = torch.compile(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, fused=device.type == "cuda")
    plan = BatchPlan(num_samples=len(data), global_batch=job.batch, grad_accum=1, seed=0)
    inputs, targets = data.inputs.to(device), data.targets.to(device)
    order = iter(())

    def next_indices() -> torch.Tensor:
        nonlocal order
        for (idx,) in order:
            return idx
        order = iter(plan.micro_batches(0, device=device))  # the order crosses once per epoch, as in gputrain
        return next(order)[0]

    def hand_step() -> None:
        idx = next_indices()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = step_model(inputs[idx])
            loss = F.cross_entropy(logits.view(-1, vocab), targets[idx].view(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    peak_memory(reset=True)
    per_window = max(1, (job.steps - job.warmup) // 4)
    seconds = median(time_windows(hand_step, warmup=job.warmup, windows=4, per_window=per_window))
    return {"step_s": seconds, "peak_memory_bytes": peak_memory()}


def run_gputrain(job: GptJob, data: Any, precision: str = "bf16", extra: dict | None = None) -> dict[str, Any]:
    """The same job through the Trainer: {"step_s", "peak_memory_bytes", "summary", "losses"}."""
    from unittest import mock

    from gputrain import Trainer
    from gputrain.distributed import parallelize

    extra = dict(extra or {})
    scope = extra.pop(COMPILE_SCOPE, None)
    chosen = mock.patch.object(parallelize, "compile_scope", lambda dims, choice: scope) if scope else None
    peak_memory(reset=True)
    with tempfile.TemporaryDirectory() as run_dir, chosen or contextlib.nullcontext():
        config = {"train.batch_size": job.batch, "train.max_steps": job.steps, "train.epochs": 10**6,
                  "train.precision": precision, "train.compile": job.compile, "train.device": str(job.device),
                  "optim.lr": 6e-4, "log.every_steps": 5, "log.progress": "none", "log.tensorboard": False,
                  "checkpoint.enabled": False, "eval.every_epochs": 0, **(extra or {})}
        summary = Trainer(build(job), data, spec=spec_of(job), config=config, run_dir=run_dir).fit()
        every = int(config["log.every_steps"])
        skip = min(job.warmup // every, max(0, job.steps // every - 1))  # compile and warm-up windows
        seconds = median(gputrain_step_times(Path(run_dir), skip_rows=skip))
        rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    losses = [(r["step"], r["loss"]) for r in rows if "split" not in r and r.get("loss") is not None]
    return {"step_s": seconds, "peak_memory_bytes": peak_memory(), "summary": summary, "losses": losses}


def speed(job: GptJob, step_s: float, flops: float, precision: str = "bf16") -> dict[str, Any]:
    """tokens/s and MFU (None where no peak is known: a CPU without a bench cache)."""
    from gputrain.observe.peak import resolve_peak

    peak, source = resolve_peak(job.device, precision)
    return {"tokens_per_s": job.batch * job.seq_len / step_s, "mfu": flops / step_s / peak if peak else None,
            "peak_flops": peak, "peak_source": source}


COMPILE_SCOPE = "compile_scope"
"""An ablation's own key, not a config key: the scope distributed/parallelize.py picks, replaced."""

ABLATIONS: list[tuple[str, dict[str, Any] | None]] = [
    ("hand loop, whole-model compile", None),
    ("hand loop, per-block compile", {"per_block": True}),
    ("gputrain, defaults", {}),
    ("gputrain, non-finite guard off", {"train.on_nonfinite": "off"}),
    ("gputrain, logging every 20 steps", {"log.every_steps": 20}),
    ("gputrain, per-block compile", {COMPILE_SCOPE: "blocks"}),
]
"""Where gputrain's step time goes against the hand loop's: each of its defaults off in turn, and both
loops compiled block by block (gputrain's scope under FSDP, TP, activation checkpointing and pipelines,
and its only one before issue 28; its default is now the whole model, as the hand loop's). Each row
~30 s on an H100/H200 (compile included)."""


def ablate(job: GptJob, data: Any, known: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """One line per ABLATIONS row: step ms, tokens/s, and the ratio to the first (whole-model hand loop).
    `known`: step seconds of rows already measured (gpu_proof.py's gpt2 part ran the first and third
    with the same job), which are reported, not rerun. Returns the rows."""
    first: float | None = None
    rows = []
    for name, extra in ABLATIONS:
        compiled = None
        if known and name in known:
            step_s = known[name]
        else:
            if job.device.type == "cuda":
                torch.cuda.empty_cache()
            torch._dynamo.reset()  # each row compiles afresh, as a new process would
            if name.startswith("hand"):
                run = run_hand_loop(job, data, per_block=bool(extra))
            else:
                run = run_gputrain(job, data, extra=extra)
                compiled = run["summary"]["train"].get("compile")
            step_s = run["step_s"]
        first = first or step_s
        rows.append({"row": name, "step_s": step_s, "tokens_per_s": job.batch * job.seq_len / step_s,
                     "hand_over_this": first / step_s, "compile": compiled, "measured": not (known and name in known)})
        shown = f"  train.compile: {compiled}" if compiled is not None else ""
        print(f"{name:42s} step {1000 * step_s:7.2f} ms  {job.batch * job.seq_len / step_s:10,.0f} "
              f"tokens/s  hand/this {first / step_s:.3f}{shown}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16, help="sequences per step (micro-batch = batch)")
    parser.add_argument("--steps", type=int, default=60, help="steps per run, the first 20 are warm-up")
    parser.add_argument("--ablate", action="store_true", help="each of gputrain's defaults off in turn (ABLATIONS)")
    args = parser.parse_args()
    job = GptJob(require_cuda("gpu_gpt2"), batch=args.batch, steps=args.steps)
    require_registered(model="gpt")
    data = bigram_tokens(job, job.batch * 8)
    if args.ablate:
        print(header(job.device))
        ablate(job, data)
        return
    hand = run_hand_loop(job, data)
    torch.cuda.empty_cache()
    ours = run_gputrain(job, data)
    flops = flops_per_step(job)
    print(header(job.device))
    print(f"GPT-2 124M, bf16, T={job.seq_len}, batch {job.batch}, compile, fused AdamW; "
          f"peak {speed(job, 1.0, flops)['peak_flops']} ({speed(job, 1.0, flops)['peak_source']})")
    for name, run in (("hand loop", hand), ("gputrain", ours)):
        fig = speed(job, run["step_s"], flops)
        mfu = 100 * fig["mfu"] if fig["mfu"] is not None else float("nan")
        print(f"{name:10s} step {1000 * run['step_s']:7.2f} ms  {fig['tokens_per_s']:10,.0f} tokens/s  "
              f"MFU {mfu:5.1f}%  peak memory {run['peak_memory_bytes'] / 2**30:.2f} GiB")
    print(f"gputrain / hand: step time {ours['step_s'] / hand['step_s']:.3f}, throughput "
          f"{hand['step_s'] / ours['step_s']:.3f}, memory {ours['peak_memory_bytes'] / hand['peak_memory_bytes']:.3f}")
    train = ours["summary"]["train"]
    print(f"gputrain's own report: mfu {train['mfu']}, mfu_formula {train.get('mfu_formula')}, "
          f"flops_per_step {train['flops_per_step']:.4g} (counted) vs {flops:.4g} (formula)")
    print(f"gputrain's train.compile: {train.get('compile')}")  # "off: ..." would explain a slow run


if __name__ == "__main__":
    main()
