"""FLOPs of a training step, counted for any `nn.Module` — no formula from the user.

The count comes from torch's `FlopCounterMode` wrapped around the first real optimizer step (all
its micro-batches, forward and backward). It counts the matmul-like ops torch knows (mm, bmm,
addmm, convolutions, attention); element-wise ops and the optimizer are not counted, which is the
usual convention for MFU. A model whose ops torch cannot count just gets a lower figure.

Two of torch's counts are replaced. Convolution backward: torch counts the weight gradient of a
grouped convolution as if it were dense, `groups` times too many (64× for a 64-channel depthwise
convolution, which made MobileNets' MFU read 7 to 12 times too high); here each gradient costs what
the forward does. CPU attention: torch's counter leaves its flash kernels out; they are counted
like the GPU ones.

For GPT-like models the analytic count of torchtitan (6·N + 12·L·H·Q·T per token) is given
beside it. A model is GPT-like when it (or its `config`, `cfg` or `shape` attribute) states its
layers, heads and width under one of the common names (`_DIM_NAMES`: gputrain's and nanoGPT's
`n_layer`/`n_head`/`d_model`, Hugging Face GPT-2's `n_embd`/`n_positions`, LLaMA-style
`num_hidden_layers`/`num_attention_heads`/`hidden_size`/`max_position_embeddings`).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

log = logging.getLogger("gputrain")


def _convolution_backward_flops(
    grad_out: Any,
    x: Any,
    weight: Any,
    bias: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: bool,
    output_padding: Any,
    groups: int,
    output_mask: list[bool],
    *args: Any,
    out_shape: Any = None,
    **kwargs: Any,
) -> int:
    """Each gradient of a convolution costs exactly its forward: every multiply-add of the forward,
    x[i]·w[j] into out[k], has one twin in the input gradient (grad_out[k]·w[j] into grad_x[i]) and
    one in the weight gradient (x[i]·grad_out[k] into grad_w[j]), whatever the groups, stride,
    padding or dilation. torch's own formula rebuilds the weight gradient as a dense convolution
    over the batch and so multiplies it by `groups`."""
    from torch.utils import flop_counter

    forward = flop_counter.conv_flop_count(list(x), list(weight), list(grad_out), transposed=bool(transposed))
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def _corrected_flops() -> dict[Any, Any]:
    """The counts that replace or add to torch's table (see the module docstring)."""
    return {torch.ops.aten.convolution_backward: _convolution_backward_flops, **_cpu_attention_flops()}


def _cpu_attention_flops() -> dict[Any, Any]:
    """Counts for the CPU flash-attention kernels, which torch's counter leaves out (its GPU
    attention kernels are counted); same formulas as torch uses for those."""
    from torch.utils import flop_counter

    aten = torch.ops.aten
    mapping: dict[Any, Any] = {}
    forward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    backward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if forward is not None:

        def forward_flops(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
            return flop_counter.sdpa_flop_count(query, key, value)

        mapping[forward] = forward_flops
    if backward is not None:

        def backward_flops(
            grad_out: Any, query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any
        ) -> int:
            return flop_counter.sdpa_backward_flop_count(grad_out, query, key, value)

        mapping[backward] = backward_flops
    return mapping


class StepFlopCounter:
    """Counts the FLOPs of the code run inside `counting()`; `total` stays None if counting failed."""

    def __init__(self) -> None:
        self.total: int | None = None

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        # eager while counting: dynamo marks a compiled forward that it is first asked to run under a
        # dispatch mode (the counter is one) to run eagerly for good, so train.compile and
        # train.cuda_graphs would never compile; the next step compiles. The count is the same.
        with torch.compiler.set_stance("force_eager"), self._counting():
            yield

    @contextlib.contextmanager
    def _counting(self) -> Iterator[None]:
        try:
            from torch.utils.flop_counter import FlopCounterMode

            mode = FlopCounterMode(display=False, custom_mapping=_corrected_flops())
            with warnings.catch_warnings():
                # the counter's global module hooks make torch.compile warn once; harmless here
                warnings.simplefilter("ignore")
                mode.__enter__()
        except Exception as exc:  # noqa: BLE001 - FLOPs are a report, never a reason to stop training
            log.warning("FLOPs not counted (%s: %s); MFU stays empty", type(exc).__name__, exc)
            yield
            return
        failed = False
        try:
            yield
        except BaseException:
            failed = True
            raise
        finally:
            try:
                mode.__exit__(None, None, None)
                if not failed:
                    self.total = int(mode.get_total_flops())
            except Exception as exc:  # noqa: BLE001
                log.warning("FLOPs not counted (%s: %s); MFU stays empty", type(exc).__name__, exc)


def gpt_flops_per_token(n_params: int, n_layer: int, n_head: int, head_dim: int, seq_len: int) -> int:
    """Training FLOPs per token of a decoder-only transformer, torchtitan's convention.

    6·N for the forward and backward matmuls of N (non-embedding) parameters, plus 12·L·H·Q·T for
    attention scores and their weighted sum over a context of T tokens (forward 4·L·H·Q·T, backward
    twice that; causal masking is not discounted, as in torchtitan and the PaLM paper).
    """
    return 6 * n_params + 12 * n_layer * n_head * head_dim * seq_len


@dataclass(frozen=True, slots=True)
class GptDims:
    n_params: int
    """Parameters excluding embedding tables (an embedding tied to the output layer counts)."""
    n_layer: int
    n_head: int
    head_dim: int
    seq_len: int


# The names under which common configs state each size: gputrain's GPT and nanoGPT (`block_size`),
# Hugging Face GPT-2 (`n_embd`, `n_positions`) and LLaMA-style configs (`hidden_size`, ...). A
# transformers model keeps them on `model.config`; HF configs also answer to the other family's
# names through their attribute_map, so the first name that gives an integer wins.
_DIM_NAMES: dict[str, tuple[str, ...]] = {
    "n_layer": ("n_layer", "num_hidden_layers"),
    "n_head": ("n_head", "num_attention_heads"),
    "d_model": ("d_model", "n_embd", "hidden_size"),
    "head_dim": ("head_dim",),
    "seq_len": ("seq_len", "n_positions", "max_position_embeddings", "block_size"),
}


def _attr(model: nn.Module, dim: str) -> int | None:
    """The size `dim` stated by the model or its `config` / `cfg` / `shape`, under any of its names."""
    holders = (model, *(getattr(model, holder, None) for holder in ("config", "cfg", "shape")))
    for holder in holders:
        for name in _DIM_NAMES[dim]:
            value = getattr(holder, name, None) if holder is not None else None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def gpt_dims(model: nn.Module, seq_len: int | None = None) -> GptDims | None:
    """The sizes the GPT formula needs, or None for a model that is not GPT-like.

    Args:
        model: the unwrapped model; its layers, heads, width and context are read from it or from
            its `config` / `cfg` / `shape` attribute, under any name in `_DIM_NAMES`.
        seq_len: tokens per training sample, when the data says so (else the model's context).
    """
    n_layer, n_head, d_model = _attr(model, "n_layer"), _attr(model, "n_head"), _attr(model, "d_model")
    seq_len = seq_len or _attr(model, "seq_len")
    if not (n_layer and n_head and d_model and seq_len):
        return None
    linear_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    # Embedding lookups cost no FLOPs; a table tied to the output projection does (it is a matmul).
    embedding = sum(
        p.numel()
        for m in model.modules()
        if isinstance(m, nn.Embedding)
        for p in m.parameters()
        if id(p) not in linear_weights
    )
    n_params = sum(p.numel() for p in model.parameters()) - embedding
    # LLaMA-style configs may state a head width other than d_model / n_head
    head_dim = _attr(model, "head_dim") or d_model // n_head
    return GptDims(n_params=n_params, n_layer=n_layer, n_head=n_head, head_dim=head_dim, seq_len=seq_len)
