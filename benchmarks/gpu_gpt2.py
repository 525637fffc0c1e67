"""GPT-2 124M on one GPU: gputrain against a hand-written loop, same kernels and settings.

bf16 autocast, T=1024, torch.compile, fused AdamW, random tokens (vocab padded to 50304), the
same batch order. Reports tokens/s, MFU by torchtitan's formula (6N + 12·L·H·Q·T per token)
against the datasheet (or `gputrain bench`) bf16 peak, peak memory, and the ratios. The hand loop
compiles the whole model, as nanoGPT does; gputrain compiles block by block (so FSDP's hooks stay
outside the graphs): the ratio includes that choice.
Goal: >= 45% MFU on one H100/H200.

    python benchmarks/gpu_gpt2.py [--batch 16] [--steps 60]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import gputrain_step_times, header, median, require_cuda, require_registered, time_windows

import torch
import torch.nn.functional as F


def build(spec, seed: int):  # type: ignore[no-untyped-def]
    from gputrain.config.schema import ModelConfig
    from gputrain.models import build_model

    torch.manual_seed(seed)
    return build_model(ModelConfig(name="gpt", preset="gpt2-124m", vocab_size=50304, dropout=0.0), spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16, help="sequences per step (micro-batch = batch)")
    parser.add_argument("--steps", type=int, default=60, help="steps per run, the first 20 are warm-up")
    args = parser.parse_args()
    device = require_cuda("gpu_gpt2")
    require_registered(model="gpt")
    from gputrain import Trainer
    from gputrain.data.spec import DataSpec
    from gputrain.data.tensors import TensorData
    from gputrain.observe.flops import gpt_dims, gpt_flops_per_token
    from gputrain.observe.peak import resolve_peak
    from gputrain.train.batches import BatchPlan

    T, V = 1024, 50304
    spec = DataSpec(task="lm", input_shape=(T,), vocab_size=V)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, V, (args.batch * 8, T + 1), generator=generator)
    data = TensorData(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())

    # hand-written loop
    model = build(spec, 0).to(device)
    step_model = torch.compile(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, fused=True)
    plan = BatchPlan(num_samples=len(data), global_batch=args.batch, grad_accum=1, seed=0)
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
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = step_model(inputs[idx])
            loss = F.cross_entropy(logits.view(-1, V), targets[idx].view(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    torch.cuda.reset_peak_memory_stats()
    hand = median(time_windows(hand_step, warmup=20, windows=4, per_window=max(1, (args.steps - 20) // 4)))
    hand_mem = torch.cuda.max_memory_allocated()
    dims = gpt_dims(model, T)
    del model, step_model, optimizer
    torch.cuda.empty_cache()

    # gputrain
    torch.cuda.reset_peak_memory_stats()
    with tempfile.TemporaryDirectory() as run_dir:
        config = {"train.batch_size": args.batch, "train.max_steps": args.steps, "train.epochs": 10**6,
                  "train.precision": "bf16", "train.compile": True, "optim.lr": 6e-4, "log.every_steps": 5,
                  "log.progress": "none", "log.tensorboard": False, "checkpoint.enabled": False,
                  "eval.every_epochs": 0}
        summary = Trainer(build(spec, 0), data, spec=spec, config=config, run_dir=run_dir).fit()
        ours = median(gputrain_step_times(Path(run_dir), skip_rows=4))
    ours_mem = torch.cuda.max_memory_allocated()

    assert dims is not None
    per_step = gpt_flops_per_token(dims.n_params, dims.n_layer, dims.n_head, dims.head_dim, T) * args.batch * T
    peak, source = resolve_peak(device, "bf16")
    print(header(device))
    print(f"GPT-2 124M, bf16, T={T}, batch {args.batch}, compile, fused AdamW; peak {peak} ({source})")
    for name, seconds, mem in (("hand loop", hand, hand_mem), ("gputrain", ours, ours_mem)):
        mfu = per_step / seconds / peak if peak else float("nan")
        print(f"{name:10s} step {1000 * seconds:7.2f} ms  {args.batch * T / seconds:10,.0f} tokens/s  "
              f"MFU {100 * mfu:5.1f}%  peak memory {mem / 2**30:.2f} GiB")
    print(f"gputrain / hand: step time {ours / hand:.3f}, throughput {hand / ours:.3f}, memory {ours_mem / hand_mem:.3f}")
    print(f"gputrain's own report: mfu {summary['train']['mfu']}, mfu_formula {summary['train']['mfu_formula']}, "
          f"flops_per_step {summary['train']['flops_per_step']:.4g} (counted) vs {per_step:.4g} (formula)")


if __name__ == "__main__":
    main()
