"""The planner's error on CPU: planned peak bytes (one step on fake tensors) against the measured peak
of live tensor bytes in a real step (the same dispatch-mode tracker over real tensors: every storage
from its creation until it is freed), for the mlp, cnn, resnet18 and gpt presets at two micro-batches.

    python benchmarks/plan_accuracy.py            # prints the table (markdown)
"""

from __future__ import annotations

import time

import torch

from gputrain.cli.plan import build_plan_target
from gputrain.config import load_config
from gputrain.models import build_model
from gputrain.plan.layouts import layout_bytes
from gputrain.plan.measure import measure_real, repeat_sample

CASES = {
    "mlp": ["model.name=mlp"],
    "cnn": ["model.name=cnn"],
    "resnet18": ["model.name=resnet18", "data.name=synthetic", "data.shape=[3,32,32]"],
    "gpt (tiny)": ["model.name=gpt", "model.preset=tiny", "data.name=synthetic", "data.task=lm"],
    "gpt (gpt2-124m, seq 128)": [
        "model.name=gpt", "model.preset=gpt2-124m", "data.name=synthetic", "data.task=lm",
        "data.seq_len=128", "data.vocab_size=50257", "data.num_samples=64",
    ],
}
BATCHES = {"mlp": (64, 512), "cnn": (32, 128), "resnet18": (8, 32)}


def main() -> None:
    torch.manual_seed(0)
    print("| model | micro-batch | strategy | planned MiB | measured MiB | error % |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, overrides in CASES.items():
        for micro in BATCHES.get(name.split()[0], (2, 8)):
            config = load_config(None, [*overrides, f"train.batch_size={micro}", "train.device=cpu"])
            target, _, _ = build_plan_target(config)
            planned_step = target.step(micro)
            assert planned_step is not None
            planned = layout_bytes(planned_step, target.shape(), "none", 1).total
            model = build_model(config.model, _spec(config))  # real weights this time
            batch = repeat_sample(target.sample, micro)
            start = time.perf_counter()
            measured = measure_real(model, batch, target.loss_of, target.make_optimizer, micro_batch=micro).peak
            err = 100 * (planned - measured) / measured
            print(
                f"| {name} | {micro} | none | {planned / 2**20:.1f} | {measured / 2**20:.1f} | {err:+.1f} |"
                f"  <!-- real step {time.perf_counter() - start:.1f} s -->",
                flush=True,
            )


def _spec(config: object) -> object:
    from gputrain.data import build_data

    return build_data(config.data, config.train.seed).spec  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
