"""train.precision=fp8: float8 training of the large Linear layers through torchao; everything
else (attention, norms, the output head, the small layers) runs in bf16 autocast.

Float8 matmuls need the tensor cores of compute capability 8.9 and newer (Ada: L4, L40S, RTX 4090;
Hopper: H100, H200), so anything else is refused before the run starts, naming what would do. torchao
is an optional dependency (`pip install 'gputrain[fp8]'`): it is imported only when a run converts.

Which layers: float8 pays only where a matmul is large enough that casting and scaling cost less
than the faster matmul gains. The thresholds are torchao's, measured on an H100
(torchao/float8/README.md, "performance"; the same rules as its `_auto_filter_for_recipe`). Both
dimensions must be multiples of 16 (cuBLAS/CUTLASS float8 kernels require it). The output head is
kept in bf16, as torchtitan keeps its `output` layer: its logits feed the loss directly, and a head
tied to the embedding shares its weight.

Compile is required (torchao: float8 training is meant to run under torch.compile; torchtitan's
float8 recipes all run with compile on): the casts and amax reductions around each float8 matmul are
separate kernels in eager mode, and fused into the neighbouring ops only when compiled. Eager fp8
ran at 0.45× bf16's tokens/s on an H200 (benchmarks/RESULTS.md), so fp8 without train.compile is
refused with the config, before the run starts (config/validate.py's check_fp8_compile).

Whether the whole run gains: float8 matmuls run at most twice bf16's rate, so a plan that converts a
share s of the Linear layers' matmul work saves at most s/2 of it, before the casts are paid. Below
FP8_PAYS_SHARE the plan says fp8 is not expected to pay (GPT-2 124M: d_model 768, its 768-wide
projections and the 50k-wide head stay in bf16: 40% converted; a 24-layer GPT of d_model 2048: 92%).
The share is a heuristic from the shapes; the GPU proof measures it (benchmarks/gpu_proof.py).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from gputrain.errors import ConfigError

Recipe = Literal["tensorwise", "rowwise"]
FP8_MIN_CAPABILITY = (8, 9)
FP8_GPUS = "an NVIDIA GPU of compute capability 8.9 or newer (sm_89+: H100/H200, L4, L40S, RTX 4090 class)"
INSTALL_HINT = "pip install 'gputrain[fp8]' (or pip install torchao)"


def check_fp8_supported(device: torch.device) -> None:
    """Raise ConfigError (one line) unless `device` can train in float8 and torchao is importable."""
    if device.type != "cuda":
        raise ConfigError("train.precision", f"fp8 needs {FP8_GPUS}; this run's device is {device.type}{_FALLBACK}")
    capability = torch.cuda.get_device_capability(device)
    if capability < FP8_MIN_CAPABILITY:
        name = f"{torch.cuda.get_device_name(device)} (sm_{capability[0]}{capability[1]})"
        raise ConfigError("train.precision", f"fp8 needs {FP8_GPUS}; this run's GPU is {name}{_FALLBACK}")
    if importlib.util.find_spec("torchao") is None:
        raise ConfigError("train.precision", f"fp8 trains through torchao, which is not installed: {INSTALL_HINT}")


_FALLBACK = "; use train.precision=bf16 here"

FP8_PAYS_SHARE = 0.5
"""Share of the Linear layers' matmul work a plan must put in float8 for the run to be expected to gain
(at most half of it is saved, before the casts: below this the casts eat what is left)."""


def skip_reason(module: nn.Module, recipe: Recipe) -> str | None:
    """Why this layer stays in bf16 under `recipe`, or None when float8 pays for it."""
    if not isinstance(module, nn.Linear):
        return "not a Linear"
    n, k = module.out_features, module.in_features  # the matmul is (tokens × k) @ (k × n)
    if n % 16 or k % 16:
        return "dims not multiples of 16"
    if recipe == "tensorwise":
        return "too small to gain" if k <= 4096 and n <= 1024 else None
    return "too small to gain" if n <= 2048 or k <= 1024 or (n <= 4096 and k <= 2048) else None


def output_heads(model: nn.Module) -> set[str]:
    """Names of the Linear layers that produce the model's output: the last Linear, and any Linear
    whose weight is an embedding's (a tied head)."""
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    embedded = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    heads = {name for name, m in linears if id(m.weight) in embedded}
    if linears:
        heads.add(linears[-1][0])
    return heads


@dataclass(slots=True)
class Fp8Plan:
    """Which Linear layers go to float8, and why each other one stays in bf16."""

    recipe: Recipe
    converted: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    """layer name -> reason"""
    share: float = 0.0
    """Share of the Linear layers' matmul work (weight elements: FLOPs per token) the converted layers do."""

    @property
    def expected_to_pay(self) -> bool:
        return self.share >= FP8_PAYS_SHARE

    def expectation(self) -> str:
        """Whether float8 is expected to make this run faster than bf16, and why."""
        if not self.converted:
            return "no layer is large enough for float8 to pay: this run is bf16"
        pct = f"{self.share:.0%} of the Linear matmul work"
        if self.expected_to_pay:
            return f"float8 covers {pct}: expected to pay (compiled)"
        return (
            f"not expected to pay: float8 covers only {pct} (at most half of it saved, before the casts), "
            "the rest is small or the output head; a GPT of d_model 2048 puts 92% of it in float8"
        )

    def to_dict(self) -> dict[str, Any]:
        """What env.json's "run" block and the advisor record of the plan."""
        by_reason: dict[str, list[str]] = {}
        for name, reason in self.skipped.items():
            by_reason.setdefault(reason, []).append(name)
        return {
            "recipe": self.recipe,
            "converted": len(self.converted),
            "linear_layers": len(self.converted) + len(self.skipped),
            "skipped": by_reason,
            "share": round(self.share, 4),
            "expected_to_pay": self.expected_to_pay,
            "expectation": self.expectation(),
        }

    def describe(self) -> str:
        total = len(self.converted) + len(self.skipped)
        reasons: dict[str, int] = {}
        for reason in self.skipped.values():
            reasons[reason] = reasons.get(reason, 0) + 1
        kept = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
        line = f"fp8 ({self.recipe}): {len(self.converted)} of {total} Linear layers in float8"
        line += f"; bf16: {kept}" if kept else ""
        return f"{line} — {self.expectation()}"


def plan_fp8(model: nn.Module, recipe: Recipe) -> Fp8Plan:
    """Decide, layer by layer, without changing the model (testable without torchao)."""
    plan = Fp8Plan(recipe)
    heads = output_heads(model)
    work = converted = 0
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        size = module.in_features * module.out_features
        work += size
        reason = "output head" if name in heads else skip_reason(module, recipe)
        if reason is None:
            plan.converted.append(name)
            converted += size
        else:
            plan.skipped[name] = reason
    plan.share = converted / work if work else 0.0
    return plan


def module_filter(plan: Fp8Plan) -> Callable[[nn.Module, str], bool]:
    """torchao's `module_filter_fn`: True for the layers the plan converts."""
    chosen = set(plan.converted)
    return lambda module, fqn: fqn in chosen


def apply_fp8(model: nn.Module, plan: Fp8Plan) -> Fp8Plan:
    """Swap the planned Linear layers for torchao's Float8Linear, in place; before compile and
    data parallelism (torchtitan's order for model converters). Returns the plan applied."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    if plan.converted:
        config = Float8LinearConfig.from_recipe_name(plan.recipe)
        convert_to_float8_training(model, config=config, module_filter_fn=module_filter(plan))
    return plan
