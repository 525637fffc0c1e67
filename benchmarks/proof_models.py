"""Parts of gpu_proof.py that train real models: GPT-2 124M (gputrain against a hand loop), GPT-2 in
fp8 against bf16, ResNet-50 (hand loop, synthetic data, JPEG files). They call the functions of
gpu_gpt2.py and gpu_resnet50.py, so the proof and those benchmarks measure the same thing.
"""

from __future__ import annotations

from typing import Any

import gpu_gpt2
import gpu_resnet50
import torch
from proof_parts import Context, goal

FP8_LOSS_TOLERANCE = 0.03
"""fp8's logged loss may differ from bf16's by at most 3% (relative) at every logged step. torchao
reports float8 loss curves within about 1% of bf16 over long runs; both runs here start from the
same weights and see the same batches, so only the arithmetic differs."""


def _gpt_job(ctx: Context) -> gpu_gpt2.GptJob:
    if ctx.dry_run:
        tiny = {"name": "gpt", "preset": "tiny", "vocab_size": 256, "seq_len": 32, "dropout": 0.0}
        return gpu_gpt2.GptJob(ctx.device, batch=4, steps=10, warmup=2, seq_len=32, model=tiny, compile=False)
    return gpu_gpt2.GptJob(ctx.device, batch=16, steps=60, warmup=20)


def _gputrain_figures(job: gpu_gpt2.GptJob, run: dict[str, Any], flops: float, precision: str) -> dict[str, Any]:
    train = run["summary"]["train"]
    return {"step_s": run["step_s"], **gpu_gpt2.speed(job, run["step_s"], flops, precision),
            "peak_memory_bytes": run["peak_memory_bytes"], "reported_mfu": train["mfu"],
            "reported_mfu_peak_source": train.get("mfu_peak_source"), "losses": run["losses"],
            "compile": train.get("compile")}  # "off: ..." would explain a slow run


def part_gpt2(ctx: Context) -> dict[str, Any]:
    job = _gpt_job(ctx)
    data = gpu_gpt2.bigram_tokens(job, job.batch * 8)
    flops = gpu_gpt2.flops_per_step(job)
    hand = gpu_gpt2.run_hand_loop(job, data)
    hand_fig = {**hand, **gpu_gpt2.speed(job, hand["step_s"], flops)}
    if job.device.type == "cuda":
        torch.cuda.empty_cache()
    ours = _gputrain_figures(job, gpu_gpt2.run_gputrain(job, data), flops, "bf16")
    ratio = hand["step_s"] / ours["step_s"]
    mfu = ours["mfu"]
    shown = f"MFU {100 * mfu:.1f}%" if mfu is not None else "MFU n/a (no peak on CPU)"
    return {"summary": f"gputrain {ours['tokens_per_s']:,.0f} tokens/s, {shown}, {ratio:.3f}x the hand loop",
            "job": {"batch": job.batch, "seq_len": job.seq_len, "steps": job.steps, "compile": job.compile,
                    "model": job.model}, "flops_per_step": flops, "hand": hand_fig, "gputrain": ours,
            "throughput_ratio": ratio,
            "goals": [goal("GPT-2 124M MFU (bf16 datasheet peak)", mfu, 0.40),
                      goal("GPT-2 124M gputrain / hand loop tokens/s", ratio, 1.0)]}


def max_relative_gap(base: list, other: list) -> float:
    """The largest |other − base| / |base| over the steps both logged."""
    theirs = dict(other)
    gaps = [abs(theirs[s] - b) / abs(b) for s, b in base if s in theirs and b]
    if not gaps:
        raise RuntimeError("the two runs logged no common step")
    return max(gaps)


def fp8_advice(job: gpu_gpt2.GptJob, recipe: str = "tensorwise") -> dict[str, Any]:
    """gputrain's fp8 plan for the job's model (which Linear layers float8 pays for, and why the others
    stay in bf16), made on the meta device: no memory, no GPU, no torchao."""
    from gputrain.fp8 import plan_fp8

    with torch.device("meta"):
        model = gpu_gpt2.build(job)
    plan = plan_fp8(model, recipe)  # type: ignore[arg-type]
    return {"describe": plan.describe(), "converted": len(plan.converted), "skipped": dict(plan.skipped)}


def part_fp8(ctx: Context) -> dict[str, Any]:
    from gputrain.errors import ConfigError
    from gputrain.precision import resolve_precision

    job = _gpt_job(ctx)
    candidate, refusal = "fp8", None
    try:
        resolve_precision("fp8", job.device)
    except ConfigError as err:
        if not ctx.dry_run:
            raise
        # the CPU rehearsal checks the refusal, then runs the comparison with fp32 standing in
        candidate, refusal = "fp32", str(err)
    data = gpu_gpt2.bigram_tokens(job, job.batch * 8)
    flops = gpu_gpt2.flops_per_step(job)
    earlier = ctx.earlier("gpt2")
    if earlier is not None and earlier["job"]["steps"] == job.steps:
        base = earlier["gputrain"]  # the same run: same job, data, seed
    else:
        base = _gputrain_figures(job, gpu_gpt2.run_gputrain(job, data), flops, "bf16")
    run = gpu_gpt2.run_gputrain(job, data, candidate, {"train.fp8_recipe": "tensorwise"})
    ours = _gputrain_figures(job, run, flops, candidate)
    gap = max_relative_gap(base["losses"], ours["losses"])
    ratio = base["step_s"] / ours["step_s"]
    learned = ours["losses"][-1][1] < 0.8 * ours["losses"][0][1]
    advice = fp8_advice(job)
    faster = goal(f"{candidate} / bf16 tokens/s (or every layer refused by the advisor)", ratio, 1.0)
    faster["met"] = faster["met"] or advice["converted"] == 0
    return {"summary": f"{candidate}/bf16 tokens/s {ratio:.3f}, loss gap max {100 * gap:.2f}% "
                       f"(tolerance {100 * FP8_LOSS_TOLERANCE:g}%); {advice['describe']}"
                       + (f"; refused fp8: {refusal}" if refusal else ""),
            "candidate": candidate, "recipe": "tensorwise", "refusal": refusal, "bf16": base, candidate: ours,
            "tokens_per_s_ratio": ratio, "max_relative_loss_gap": gap, "loss_tolerance": FP8_LOSS_TOLERANCE,
            "candidate_learned": learned, "advisor": advice,
            "goals": [goal(f"{candidate} loss within {100 * FP8_LOSS_TOLERANCE:g}% of bf16 at every logged step",
                           gap, FP8_LOSS_TOLERANCE, higher_is_better=False), faster]}


def _resnet_job(ctx: Context) -> gpu_resnet50.ResnetJob:
    if ctx.dry_run:
        return gpu_resnet50.ResnetJob(ctx.device, batch=4, steps=5, warmup=1, images=24, image_size=16,
                                      model="resnet18")
    return gpu_resnet50.ResnetJob(ctx.device, batch=256, steps=40, images=1280)  # 5 batches of files, 8 epochs


def part_resnet50(ctx: Context) -> dict[str, Any]:
    job = _resnet_job(ctx)
    synthetic = gpu_resnet50.synthetic_data(job)
    hand = gpu_resnet50.run_hand_loop(job, synthetic)
    if job.device.type == "cuda":
        torch.cuda.empty_cache()
    spec = gpu_resnet50.spec_of(job)
    runs = {"hand": hand, "synthetic": gpu_resnet50.run_gputrain(job, gpu_resnet50.build(job, spec), synthetic, spec),
            "disk": gpu_resnet50.run_from_disk(job)}
    figures = {k: {"step_s": r["step_s"], "images_per_s": job.batch / r["step_s"],
                   "peak_memory_bytes": r["peak_memory_bytes"]} for k, r in runs.items()}
    vs_hand = runs["hand"]["step_s"] / runs["synthetic"]["step_s"]
    disk_share = runs["synthetic"]["step_s"] / runs["disk"]["step_s"]
    return {"summary": f"{figures['synthetic']['images_per_s']:,.0f} images/s synthetic ({vs_hand:.3f}x hand), "
                       f"{figures['disk']['images_per_s']:,.0f} from JPEG files ({100 * disk_share:.1f}% of synthetic)",
            "job": {"model": job.model, "batch": job.batch, "steps": job.steps, "images": job.images,
                    "image_size": job.image_size}, **figures, "gputrain_vs_hand": vs_hand,
            "disk_vs_synthetic": disk_share,
            "goals": [goal("ResNet-50 from disk / synthetic images/s", disk_share, 0.95),
                      goal("ResNet-50 gputrain / hand loop images/s", vs_hand, 1.0)]}
