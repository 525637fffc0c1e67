"""A GPT-2-style decoder: pre-norm blocks, learned positions, tied input/output embeddings.

Attention goes through `F.scaled_dot_product_attention(is_causal=True)`, so CUDA picks the flash
or memory-efficient kernels. With biases, vocab 50257, context 1024, d_model 768, 12 layers and
12 heads this is GPT-2 124M: 124,439,808 parameters (the output layer shares the token embedding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gputrain.config.presets import check_gpt_context, gpt_size
from gputrain.config.schema import ModelConfig
from gputrain.data.spec import DataSpec
from gputrain.errors import ConfigError
from gputrain.models.layers import make_activation
from gputrain.models.registry import register_model


@dataclass(frozen=True, slots=True)
class GPTShape:
    n_layer: int
    n_head: int
    d_model: int
    seq_len: int
    vocab_size: int
    bias: bool = True
    dropout: float = 0.0
    activation: str = "gelu"


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with one fused q/k/v projection.

    The projection's outputs are laid out head by head, [head, (q, k, v), head_dim], so splitting
    them column-wise over tensor-parallel ranks gives each rank whole heads with their q, k and v;
    the forward reads the number of heads from the width it receives, so it runs unchanged on a shard.
    """

    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        self.n_head = shape.n_head
        self.head_dim = shape.d_model // shape.n_head
        self.dropout = shape.dropout
        self.c_attn = nn.Linear(shape.d_model, 3 * shape.d_model, bias=shape.bias)
        self.c_proj = nn.Linear(shape.d_model, shape.d_model, bias=shape.bias)
        self.resid_dropout = nn.Dropout(shape.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        qkv = self.c_attn(x).view(B, T, -1, 3, self.head_dim)  # -1: the heads this rank holds
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(dim=3))  # [B, heads, T, head_dim]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, -1)))


class MLP(nn.Module):
    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        self.c_fc = nn.Linear(shape.d_model, 4 * shape.d_model, bias=shape.bias)
        # GPT-2's gelu is the tanh approximation
        self.act = nn.GELU(approximate="tanh") if shape.activation == "gelu" else make_activation(shape.activation)
        self.c_proj = nn.Linear(4 * shape.d_model, shape.d_model, bias=shape.bias)
        self.dropout = nn.Dropout(shape.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class Block(nn.Module):
    """Pre-norm: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(shape.d_model, bias=shape.bias)
        self.attn = CausalSelfAttention(shape)
        self.ln_2 = nn.LayerNorm(shape.d_model, bias=shape.bias)
        self.mlp = MLP(shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token ids [B, T] -> next-token logits [B, T, vocab_size]."""

    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        self.shape = shape
        self.wte = nn.Embedding(shape.vocab_size, shape.d_model)
        self.wpe = nn.Embedding(shape.seq_len, shape.d_model)
        self.drop = nn.Dropout(shape.dropout)
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.n_layer))
        self.ln_f = nn.LayerNorm(shape.d_model, bias=shape.bias)
        self.lm_head = nn.Linear(shape.d_model, shape.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one matrix embeds and un-embeds
        self._init_gpt2()

    @torch.no_grad()
    def _init_gpt2(self) -> None:
        """GPT-2's init: N(0, 0.02) weights, zero biases, residual projections scaled by 1/sqrt(2·n_layer)
        so the residual stream's variance does not grow with depth."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
        residual_std = 0.02 / math.sqrt(2 * self.shape.n_layer)
        for block in self.blocks:
            assert isinstance(block, Block)
            nn.init.normal_(block.attn.c_proj.weight, mean=0.0, std=residual_std)
            nn.init.normal_(block.mlp.c_proj.weight, mean=0.0, std=residual_std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        if self.shape.seq_len < T:  # shapes only: no host-device sync
            raise ValueError(f"sequence of {T} tokens is longer than the model's context ({self.shape.seq_len})")
        positions = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(positions))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def resolve_gpt_shape(config: ModelConfig, spec: DataSpec) -> GPTShape:
    """The model's sizes: explicit fields over the preset's over the defaults; context and vocab from the data
    where the config leaves them unset.

    Raises:
        ConfigError: the data is not token sequences, its windows exceed the context, or its vocabulary
            exceeds model.vocab_size.
    """
    if spec.task != "lm" or spec.vocab_size is None:
        raise ConfigError(
            "model.name",
            f"gpt models token sequences (data.task=lm); this data is {spec.task} "
            f"with samples of shape {list(spec.input_shape)}",
            config.name,
            hint="use data.name=text, tokens or synthetic with data.task=lm",
        )
    data_seq_len = spec.input_shape[0]
    check_gpt_context(config, data_seq_len)
    vocab_size = config.vocab_size or spec.vocab_size
    if vocab_size < spec.vocab_size:
        raise ConfigError(
            "model.vocab_size",
            f"is smaller than the data's vocabulary ({spec.vocab_size} ids)",
            config.vocab_size,
            hint=f"use model.vocab_size >= {spec.vocab_size} or leave it unset",
        )
    n_layer, n_head, d_model = (gpt_size(config, name) for name in ("n_layer", "n_head", "d_model"))
    assert n_layer is not None and n_head is not None and d_model is not None  # a preset or its default gives each
    return GPTShape(
        n_layer=n_layer,
        n_head=n_head,
        d_model=d_model,
        seq_len=gpt_size(config, "seq_len") or data_seq_len,
        vocab_size=vocab_size,
        bias=config.bias,
        dropout=config.dropout or 0.0,
        activation="gelu" if config.activation == "auto" else config.activation,
    )


@register_model("gpt")
def build_gpt(config: ModelConfig, spec: DataSpec) -> GPT:
    # model.init=default is GPT-2's init; another scheme is applied on top by build_model to the linear
    # layers (the tied output layer included), while the position embedding keeps GPT-2's N(0, 0.02)
    return GPT(resolve_gpt_shape(config, spec))
