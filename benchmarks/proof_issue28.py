"""Parts of gpu_proof.py added for issue 28: the GPT-2 ablation, fp8 at d_model >= 2048,
`gputrain bench-infer` on CUDA, `train.batch_size=auto` against the largest batch that fits, and the
in-memory data paths on CUDA. Each `part_<name>(ctx)` returns a JSON-able dict with a one-line
"summary" and, where the issue sets one, "goals"; any exception is the part's failure.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import gpu_gpt2
import torch
from proof_models import FP8_LOSS_TOLERANCE, _gpt_job, _gputrain_figures, fp8_advice, max_relative_gap
from proof_parts import Context, goal

FP8_LARGE_GAIN = 1.15
"""fp8 over bf16 tokens/s at d_model >= 2048: torchao reports 1.2–1.5x for Llama-class layers on an
H100 once every Linear is converted and the model compiled."""
BATCH_AUTO_SHARE = 0.90
"""batch_size=auto's micro-batch against the largest that fits: within 10%."""


def part_ablate(ctx: Context) -> dict[str, Any]:
    """gpu_gpt2.py --ablate on the gpt2 part's job; its two rows that part measured are reused."""
    job = _gpt_job(ctx)
    job = gpu_gpt2.GptJob(job.device, batch=job.batch, steps=min(job.steps, 60), warmup=job.warmup,
                          seq_len=job.seq_len, model=job.model, compile=job.compile)
    data = gpu_gpt2.bigram_tokens(job, job.batch * 8)
    known = {}
    earlier = ctx.earlier("gpt2")
    if earlier is not None:
        known = {gpu_gpt2.ABLATIONS[0][0]: earlier["hand"]["step_s"], gpu_gpt2.ABLATIONS[2][0]: earlier["gputrain"]["step_s"]}
    rows = gpu_gpt2.ablate(job, data, known)
    by_name = {r["row"]: r for r in rows}
    best = max(rows[2:], key=lambda r: r["hand_over_this"])
    return {"summary": "; ".join(f"{r['row']}: {1000 * r['step_s']:.1f} ms" for r in rows)
                       + f"; best gputrain row {best['row']!r} {best['hand_over_this']:.3f}x",
            "rows": rows, "reused_from_gpt2": sorted(known),
            "per_block_over_whole": by_name[gpu_gpt2.ABLATIONS[0][0]]["step_s"]
            / by_name[gpu_gpt2.ABLATIONS[1][0]]["step_s"]}


def large_gpt_job(dry_run: bool, device: torch.device) -> gpu_gpt2.GptJob:
    """A GPT of d_model 2048 (GPT-3 XL's width, 16 heads of 128): 12 layers, ~0.8B parameters, so both
    runs (bf16 and fp8) with their compiles fit one part; each Linear has the 1.3B model's shape."""
    if dry_run:
        small = {"name": "gpt", "n_layer": 1, "n_head": 2, "d_model": 64, "vocab_size": 256, "dropout": 0.0}
        return gpu_gpt2.GptJob(device, batch=2, steps=10, warmup=2, seq_len=32, model=small, compile=False)
    model = {"name": "gpt", "n_layer": 12, "n_head": 16, "d_model": 2048, "vocab_size": 50304, "dropout": 0.0}
    return gpu_gpt2.GptJob(device, batch=8, steps=60, warmup=20, seq_len=1024, model=model)  # ~0.1 s a step on an H100


def _fp8_candidate(ctx: Context, device: torch.device) -> tuple[str, str | None]:
    """("fp8", None) where fp8 runs; on the dry run's CPU ("fp32", fp8's refusal), which must refuse."""
    from gputrain.errors import ConfigError
    from gputrain.precision import resolve_precision

    try:
        resolve_precision("fp8", device)
    except ConfigError as err:
        if not ctx.dry_run:
            raise
        return "fp32", str(err)
    return "fp8", None


def part_fp8_large(ctx: Context) -> dict[str, Any]:
    job = large_gpt_job(ctx.dry_run, ctx.device)
    candidate, refusal = _fp8_candidate(ctx, job.device)
    data = gpu_gpt2.bigram_tokens(job, job.batch * 8)
    flops = gpu_gpt2.flops_per_step(job)
    base = _gputrain_figures(job, gpu_gpt2.run_gputrain(job, data), flops, "bf16")
    if job.device.type == "cuda":
        torch.cuda.empty_cache()
    torch._dynamo.reset()
    run = gpu_gpt2.run_gputrain(job, data, candidate, {"train.fp8_recipe": "tensorwise"})
    ours = _gputrain_figures(job, run, flops, candidate)
    gap = max_relative_gap(base["losses"], ours["losses"])
    ratio = base["step_s"] / ours["step_s"]
    width = job.model["d_model"]
    advice = fp8_advice(job)
    return {"summary": f"d_model {width}: {candidate}/bf16 tokens/s {ratio:.3f}, loss gap max {100 * gap:.2f}%; "
                       f"{advice['describe']}"
                       + (f"; refused fp8: {refusal}" if refusal else ""),
            "job": {"batch": job.batch, "seq_len": job.seq_len, "steps": job.steps, "model": job.model},
            "candidate": candidate, "refusal": refusal, "bf16": base, candidate: ours, "tokens_per_s_ratio": ratio,
            "max_relative_loss_gap": gap, "loss_tolerance": FP8_LOSS_TOLERANCE,
            "compile": {"bf16": base.get("compile"), candidate: ours.get("compile")}, "advisor": advice,
            "goals": [goal(f"{candidate} / bf16 tokens/s at d_model {width}", ratio, FP8_LARGE_GAIN),
                      goal(f"{candidate} loss within {100 * FP8_LOSS_TOLERANCE:g}% of bf16 at every logged step "
                           f"(d_model {width})", gap, FP8_LOSS_TOLERANCE, higher_is_better=False)]}


def _cli(*args: str) -> tuple[int, str]:
    """A gputrain command run in this (already forked) process: (exit code, its standard output)."""
    from gputrain.cli import main

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(list(args))
    return code, buffer.getvalue()


def bench_infer_jobs(ctx: Context) -> dict[str, dict[str, Any]]:
    """Per model: the `gputrain train` overrides of a short run to serve (uncompiled: only its weights
    matter), and bench-infer's arguments. On the GPU ResNet-50 is timed eager and compiled, GPT-2 eager
    (with generation): each compile costs tens of seconds of the part's cap."""
    device = "cpu" if ctx.dry_run else "cuda"
    common = ["train.max_steps=2", "train.epochs=1", "eval.every_epochs=0", "log.progress=none",
              "log.tensorboard=false", "data.name=synthetic", "train.compile=false", f"train.device={device}"]
    if ctx.dry_run:
        resnet = ["model.name=resnet18", "data.shape=[3,16,16]", "data.num_samples=64", "train.batch_size=8"]
        gpt = ["model.name=gpt", "model.preset=tiny", "data.task=lm", "data.seq_len=32", "data.num_samples=64",
               "train.batch_size=8"]
        timing = ["--repeats", "3", "--threads", "1"]
        batches, modes = {"resnet50": "1,4", "gpt2": "1,4"}, {"resnet50": "eager", "gpt2": "eager"}  # compile: minutes on a CPU
    else:
        resnet = ["model.name=resnet50", "data.shape=[3,224,224]", "data.num_samples=512", "train.batch_size=64",
                  "train.precision=bf16"]
        gpt = ["model.name=gpt", "model.preset=gpt2-124m", "data.task=lm", "data.seq_len=1024",
               "data.vocab_size=50304", "data.num_samples=256", "train.batch_size=8", "train.precision=bf16"]
        timing = ["--repeats", "30"]
        batches, modes = {"resnet50": "1,64", "gpt2": "1,16"}, {"resnet50": "eager,compile", "gpt2": "eager"}
    return {name: {"train": common + extra,
                   "bench": ["--batch", batches[name], *timing, "--modes", modes[name], "--device", device, "--json"]}
            for name, extra in (("resnet50", resnet), ("gpt2", gpt))}


def part_bench_infer(ctx: Context) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(dir=ctx.work) as tmp:
        for name, job in bench_infer_jobs(ctx).items():
            run_dir = Path(tmp) / name
            code, out = _cli("train", "--run-dir", str(run_dir), *job["train"])
            if code != 0:
                raise RuntimeError(f"gputrain train ({name}) exit {code}: {out[-400:]}")
            code, out = _cli("bench-infer", str(run_dir), *job["bench"])
            if code != 0:
                raise RuntimeError(f"gputrain bench-infer ({name}) exit {code}: {out[-400:]}")
            results[name] = json.loads(out)
            print(f"{name}: {json.dumps(results[name]['results'])}", flush=True)  # in the log if the cap cuts the next
    shown, figures = [], {}
    for name, report in results.items():
        rows = [r for r in report["results"] if not r.get("skipped")]
        wrong = sorted({r["device"] for r in rows} - {str(ctx.device.type)})
        if not rows or wrong:
            raise RuntimeError(f"bench-infer ({name}) measured {len(rows)} modes, on {wrong or 'no device'}")
        figures[name] = {r["mode"]: {"p50_ms": r["p50_ms"], "samples_per_s": r["samples_per_s"],
                                     "throughput_batch": r["throughput_batch"], "setup_s": r["setup_s"]} for r in rows}
        generation = {("cached" if g["cache"] else "uncached"): g["tokens_per_s"] for g in report.get("generation", [])}
        if generation:
            figures[name]["generation_tokens_per_s"] = generation
        shown.append(f"{name}: " + ", ".join(f"{r['mode']} {r['p50_ms']:.2f} ms p50, {r['samples_per_s']:,.0f}/s at "
                                             f"{r['throughput_batch']}" for r in rows)
                     + (f", generation {generation.get('cached', 0):,.0f} tokens/s" if generation else ""))
    return {"summary": f"on {ctx.device.type}: " + "; ".join(shown), "figures": figures, "reports": results}


def _largest_that_fits(fits: Any, start: int, ceiling: int) -> tuple[int, int]:
    """(the largest micro-batch in [1, ceiling] at which `fits` passes, trials run), searching up from
    `start` by doubling and then by halving the gap; `fits` is monotone (more samples, more memory)."""
    trials = 0
    lo, hi = 0, ceiling + 1  # lo fits, hi fails (ceiling + 1 stands for "not tried: above the search")
    probe = max(1, min(start, ceiling))
    while True:  # find a bracket
        trials += 1
        if fits(probe):
            lo = probe
            if probe >= ceiling:
                return lo, trials
            probe = min(ceiling, probe * 2)
        else:
            hi = probe
            break
        if probe >= hi:
            break
    while hi - lo > max(1, lo // 50):  # 2% resolution is enough for a 10% goal
        mid = (lo + hi) // 2
        trials += 1
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo, trials


def part_batch_auto(ctx: Context) -> dict[str, Any]:
    """GPT-2 124M (eager, bf16, fused AdamW, T=1024): the micro-batch `train.batch_size=auto` chooses,
    against the largest at which a real training step (forward, backward, optimizer step) fits,
    found by bisection with out-of-memory trials. The search stops at 2x auto's choice."""
    import torch.nn.functional as F

    from gputrain import Trainer
    from gputrain.plan.batch import oom_trial

    base = _gpt_job(ctx)
    job = gpu_gpt2.GptJob(base.device, batch=base.batch, steps=1, warmup=0, seq_len=base.seq_len, model=base.model,
                          compile=False)
    # enough sequences that auto's cap (1/64 of the training split) is above what memory allows:
    # the part measures the memory side of auto
    samples = 64 if ctx.dry_run else 64 * 512
    data = gpu_gpt2.bigram_tokens(job, samples)
    with tempfile.TemporaryDirectory(dir=ctx.work) as run_dir:
        config = {"train.batch_size": "auto", "train.max_steps": 1, "train.epochs": 1, "train.precision":
                  "fp32" if ctx.dry_run else "bf16", "train.compile": False, "train.device": str(job.device),
                  "log.progress": "none", "log.tensorboard": False, "checkpoint.enabled": False,
                  "eval.every_epochs": 0}
        trainer = Trainer(gpu_gpt2.build(job), data, spec=gpu_gpt2.spec_of(job), config=config, run_dir=run_dir)
        trainer.fit()
        auto = int(trainer.config.train.batch_size)
    del trainer
    gc.collect()  # the Trainer's model and optimizer state off the device before the search
    if job.device.type == "cuda":
        torch.cuda.empty_cache()
    model = gpu_gpt2.build(job).to(job.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, fused=job.device.type == "cuda")
    inputs, targets = data.inputs, data.targets
    autocast = torch.bfloat16 if job.device.type == "cuda" else torch.float32

    def step(micro: int) -> None:
        idx = torch.arange(micro) % len(inputs)
        x, y = inputs[idx].to(job.device), targets[idx].to(job.device)
        try:
            with torch.autocast(job.device.type, dtype=autocast, enabled=job.device.type == "cuda"):
                loss = F.cross_entropy(model(x).view(-1, job.vocab), y.view(-1))
            loss.backward()
            optimizer.step()  # the first step allocates AdamW's states: every trial holds them
        finally:
            optimizer.zero_grad(set_to_none=True)
            del x, y
        if job.device.type == "cuda":
            torch.cuda.synchronize(job.device)

    started = time.perf_counter()
    largest, trials = _largest_that_fits(oom_trial(step), auto, 2 * auto)
    share = auto / largest
    return {"summary": f"auto chose {auto}; the largest that fits is {largest}"
                       + (" (the search's ceiling, 2x auto)" if largest >= 2 * auto else "")
                       + f" ({trials} trials, {time.perf_counter() - started:.1f} s): {100 * share:.1f}%",
            "auto": auto, "largest_fit": largest, "search_ceiling": 2 * auto, "trials": trials, "share": share,
            "goals": [goal("batch_size=auto / largest micro-batch that fits (GPT-2 124M, eager)", share,
                           BATCH_AUTO_SHARE)]}


def part_in_memory(ctx: Context) -> dict[str, Any]:
    """Each in-memory kind of benchmarks/in_memory_data.py through Trainer.fit on the proof's device:
    which path the data took (batch indexing in memory, or loader workers), wall time, and the loss."""
    from in_memory_data import KINDS, _case
    from torch import nn

    from gputrain import Trainer

    rows = {}
    for kind in KINDS:
        data, kwargs = _case(kind)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
        config = {"train.device": str(ctx.device), "log.progress": "none", "log.tensorboard": False,
                  "train.epochs": 1 if ctx.dry_run else 2, "checkpoint.enabled": False, "data.num_workers": "auto",
                  "eval.every_epochs": 0}
        with tempfile.TemporaryDirectory(dir=ctx.work) as tmp:
            started = time.perf_counter()
            trainer = Trainer(model, data, config=config, run_dir=Path(tmp) / "run", **kwargs)
            summary = trainer.fit()
            wall = time.perf_counter() - started
        loader = trainer.parts.feed.loader
        rows[kind] = {"path": "in memory" if loader is None else f"{loader.num_workers} workers", "wall_s": wall,
                      "device": summary.get("device"), "samples_per_s": summary["train"].get("samples_per_s")}
    tensor_kinds = [k for k in KINDS if k.startswith(("TensorDataset", "Concat", "Subset"))]
    in_memory = sum(rows[k]["path"] == "in memory" for k in tensor_kinds)
    return {"summary": f"{in_memory} of {len(tensor_kinds)} tensor-backed kinds by batch indexing on "
                       f"{rows[KINDS[0]]['device']}; " + ", ".join(f"{k}: {r['path']} {r['wall_s']:.1f} s"
                                                                  for k, r in rows.items()),
            "rows": rows,
            "goals": [goal("tensor-backed data sets fed by batch indexing (share)", in_memory / len(tensor_kinds), 1.0)]}


def part_anatomy(ctx: Context) -> dict[str, Any]:
    """benchmarks/step_anatomy.py on the GPU (`--device cuda`): per step, the kernel launches and the
    host waits torch's sync debug mode reports, gputrain against the hand loop compiled whole, on the
    2-layer GPT-2-shaped GPT in bf16, eager and compiled. The dry run counts the same code on the
    CPU's tiny GPT, eagerly (no launches there; the syncing ops stand in for host waits)."""
    import step_anatomy

    device = str(ctx.device)
    case = step_anatomy.CASES["gpt-tiny" if ctx.dry_run else "gpt2-2layer"]()
    precision = "fp32" if ctx.dry_run else "bf16"
    rows = []
    for compiled in (False,) if ctx.dry_run else (False, True):
        hand = step_anatomy.measure(case, "hand", compiled, 8, 4, precision=precision, device=device)
        ours = step_anatomy.measure(case, "gputrain", compiled, 8, 4, precision=precision, device=device)
        rows.append(step_anatomy.summary(ours, hand))
        print(step_anatomy.cuda_row(ours, hand), flush=True)  # in the log if the cap cuts the next
    last, handful = rows[-1], step_anatomy.launch_handful(ours.tokens)
    extra = last["launches_per_step"]["gputrain"] - last["launches_per_step"]["hand"]
    waits = max(r["host_waits_per_step"]["gputrain_quiet"] + r["syncing_ops"]["gputrain_quiet"] for r in rows)
    mode = "compiled" if last["compiled"] else "eager"
    return {"summary": f"{case.name} {mode}, {precision}: kernel launches a quiet step hand "
                       f"{last['launches_per_step']['hand']} / gputrain {last['launches_per_step']['gputrain']}; "
                       f"host waits on a quiet step {waits}; compiled regions a step "
                       f"{last['regions_per_step']['hand']} / {last['regions_per_step']['gputrain']}; "
                       f"violations {sum(len(r['violations']) for r in rows)}",
            "rows": rows, "launch_handful": handful,
            "goals": [goal("anatomy: host waits on a quiet step (gputrain)", waits, 0, higher_is_better=False),
                      goal("anatomy: kernel launches a quiet step beyond the hand loop's", extra,
                           handful, higher_is_better=False)]}
