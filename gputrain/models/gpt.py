"""A GPT-2-style decoder: pre-norm blocks, learned positions, tied input/output embeddings.

Attention goes through `F.scaled_dot_product_attention(is_causal=True)`, so CUDA picks the flash
or memory-efficient kernels.

Data that packs several documents in a sequence, each ending with a known id (the spec's
`document_end`: data.name=instructions), is read document by document: a block-diagonal causal
mask from per-token document ids (SDPA's `attn_mask`, so the memory-efficient kernel rather than
flash on CUDA) and positions that restart at each document, so every document's logits are those
it would have alone. Token-id classification data (data.name=text_classes) gets a classification
head in place of the language-model head's use: the final hidden state of each sequence's last
token that is not padding (the spec's `pad_id`; a causal model's last token has read the whole
text) through a linear layer to the classes. With biases, vocab 50257, context 1024, d_model 768, 12 layers and
12 heads this is GPT-2 124M: 124,439,808 parameters (the output layer shares the token embedding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from gputrain.config.presets import check_gpt_context, gpt_size
from gputrain.config.schema import ModelConfig
from gputrain.data.spec import DataSpec
from gputrain.errors import ConfigError
from gputrain.models.layers import make_activation
from gputrain.models.meta import InitStep, run_init_steps
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
    document_end: int | None = None
    """Sequences pack documents each ending with this id: attention and positions stay within each."""
    num_classes: int | None = None
    """A classifier of token sequences: logits [B, num_classes] at the last token that is not `pad_id`."""
    pad_id: int | None = None


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

    def _heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v of `x` [B, T, C], each [B, heads, T, head_dim]."""
        B, T, _ = x.shape
        qkv = self.c_attn(x).view(B, T, -1, 3, self.head_dim)  # -1: the heads this rank holds
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(dim=3))
        return q, k, v

    def _merge(self, y: torch.Tensor) -> torch.Tensor:
        """[B, heads, T, head_dim] back to [B, T, C], projected."""
        B, _, T, _ = y.shape
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, -1)))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """`mask` (bool [B, 1, T, T], True where attention may go) replaces the causal mask."""
        q, k, v = self._heads(x)
        dropout = self.dropout if self.training else 0.0
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
        return self._merge(y)

    def forward_cached(self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int) -> torch.Tensor:
        """Attention of the new tokens `x` [B, T, C], at positions start..start+T-1, over themselves
        and the `start` tokens whose keys and values `keys`/`values` [B, heads, max_len, head_dim]
        already hold; this layer's keys and values of the new tokens are written into them."""
        q, k, v = self._heads(x)
        T, end = q.shape[2], start + q.shape[2]
        keys[:, :, start:end] = k
        values[:, :, start:end] = v
        k, v = keys[:, :, :end].to(q.dtype), values[:, :, :end].to(q.dtype)
        if start == 0:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif T == 1:  # the newest token sees every earlier one: no mask
            y = F.scaled_dot_product_attention(q, k, v)
        else:  # new token i (position start+i) sees positions 0..start+i
            mask = torch.ones(T, end, dtype=torch.bool, device=x.device).tril(diagonal=start)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self._merge(y)


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

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        # the mask only where there is one: tensor parallelism prepares the attention's inputs one by one
        x = x + (self.attn(self.ln_1(x)) if mask is None else self.attn(self.ln_1(x), mask))
        return x + self.mlp(self.ln_2(x))

    def forward_cached(self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int) -> torch.Tensor:
        x = x + self.attn.forward_cached(self.ln_1(x), keys, values, start)
        return x + self.mlp(self.ln_2(x))


def _normal_weight(module: nn.Module, std: float) -> None:
    assert isinstance(module, (nn.Linear, nn.Embedding))  # init_steps lists only these
    nn.init.normal_(module.weight, mean=0.0, std=std)


def _gpt2_init(module: nn.Module) -> None:
    _normal_weight(module, 0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


class GPT(nn.Module):
    """Token ids [B, T] -> next-token logits [B, T, vocab_size]."""

    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        self.shape = shape
        # typed as modules: a pipeline stage's copy holds nn.Identity where another rank has the layer
        self.wte: nn.Module = nn.Embedding(shape.vocab_size, shape.d_model)
        self.wpe: nn.Module = nn.Embedding(shape.seq_len, shape.d_model)
        self.drop = nn.Dropout(shape.dropout)
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.n_layer))
        self.ln_f: nn.Module = nn.LayerNorm(shape.d_model, bias=shape.bias)
        self.lm_head: nn.Module = nn.Linear(shape.d_model, shape.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one matrix embeds and un-embeds
        # a classifier's head; the tied lm_head holds no parameter of its own, so none goes unused
        self.cls_head = nn.Linear(shape.d_model, shape.num_classes) if shape.num_classes is not None else None
        run_init_steps(self, self.init_steps())

    def init_steps(self) -> list[InitStep]:
        """GPT-2's init as init steps (models/meta.py replays them on a model built on meta): N(0, 0.02)
        weights, zero biases, then the residual projections again at std 0.02/sqrt(2·n_layer) so the
        residual stream's variance does not grow with depth."""
        steps: list[InitStep] = [
            (name, _gpt2_init) for name, module in self.named_modules() if isinstance(module, (nn.Linear, nn.Embedding))
        ]
        residual = partial(_normal_weight, std=0.02 / math.sqrt(2 * self.shape.n_layer))
        for i in range(len(self.blocks)):
            steps += [(f"blocks.{i}.attn.c_proj", residual), (f"blocks.{i}.mlp.c_proj", residual)]
        return steps

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        if self.shape.seq_len < T:  # shapes only: no host-device sync
            raise ValueError(f"sequence of {T} tokens is longer than the model's context ({self.shape.seq_len})")
        mask = None
        if self.shape.document_end is None:
            positions = torch.arange(T, device=idx.device)
        else:
            positions, mask = document_positions_and_mask(idx, self.shape.document_end)
        x = self.drop(self.wte(idx) + self.wpe(positions))
        for block in self.blocks:
            x = block(x) if mask is None else block(x, mask)
        x = self.ln_f(x)
        if self.cls_head is not None:
            last = last_real_token(idx, self.shape.pad_id)  # gathered: torch.export keeps the batch dynamic
            return self.cls_head(x.gather(1, last.view(-1, 1, 1).expand(-1, 1, x.shape[-1])).squeeze(1))
        return self.lm_head(x)

    def forward_cached(self, idx: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits [B, T, vocab_size] of the new tokens `idx` [B, T], which follow the `cache.length`
        tokens the cache holds; their keys and values are added to it. The same logits as `forward`
        on the whole sequence gives at these positions, without recomputing the earlier tokens.

        Raises:
            ValueError: the sequence would outgrow the model's context or the cache.
        """
        start, T = cache.length, idx.shape[1]
        if start + T > min(self.shape.seq_len, cache.max_len):
            raise ValueError(
                f"{start} cached + {T} new tokens exceed the context ({self.shape.seq_len}) "
                f"or the cache ({cache.max_len})"
            )
        positions = torch.arange(start, start + T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(positions))
        for layer, block in enumerate(self.blocks):
            assert isinstance(block, Block)
            x = block.forward_cached(x, cache.keys[layer], cache.values[layer], start)
        cache.length = start + T
        return self.lm_head(self.ln_f(x))


def document_positions_and_mask(idx: torch.Tensor, document_end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For token ids [B, T] that pack documents each ending with `document_end`: each token's position
    within its document [B, T], and the attention mask [B, 1, T, T] (True: token i may attend to j)
    that lets a token see the tokens of its own document up to itself. On the device, no sync."""
    T = idx.shape[1]
    ends = (idx == document_end).long()
    doc = ends.cumsum(dim=1) - ends  # a document's end token is its own, the next token starts another
    causal = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()
    mask = (doc[:, :, None] == doc[:, None, :]) & causal
    # a token's position: the tokens of its document it sees, less itself (no slicing of T: torch.export
    # keeps the sequence length dynamic down to 1)
    return mask.sum(dim=-1) - 1, mask[:, None]


def last_real_token(idx: torch.Tensor, pad_id: int | None) -> torch.Tensor:
    """Index [B] of each sequence's last token that is not `pad_id` (the last token without one; 0 for
    a sequence of padding only), the rule of transformers' decoder sequence classifiers."""
    T = idx.shape[1]
    if pad_id is None:
        return torch.full_like(idx[:, 0], T - 1)
    arange = torch.arange(T, device=idx.device)
    return (arange * (idx != pad_id)).argmax(dim=1)


class KVCache:
    """Every layer's attention keys and values of the tokens a GPT has read, so that generating a
    token costs one token's forward pass instead of the whole sequence's.

    Allocated once for `max_len` positions ([n_layer, B, n_head, max_len, head_dim] each) and filled
    in place: no tensor grows or is reallocated while generating. Learned positions tie each cached
    key to its position, so a sequence that outgrows the context cannot slide over the cache: the
    caller starts again from an empty one (`reset`) with the window it keeps.
    """

    def __init__(self, model: GPT, batch: int, max_len: int | None = None, dtype: torch.dtype | None = None) -> None:
        shape = model.shape
        self.max_len = min(max_len or shape.seq_len, shape.seq_len)
        weight = model.get_parameter("wte.weight")
        size = (shape.n_layer, batch, shape.n_head, self.max_len, shape.d_model // shape.n_head)
        self.keys = torch.zeros(size, dtype=dtype or weight.dtype, device=weight.device)
        self.values = torch.zeros_like(self.keys)
        self.length = 0
        """Positions filled so far."""

    def reset(self) -> None:
        self.length = 0  # the stale entries are overwritten before they are read again


def resolve_gpt_shape(config: ModelConfig, spec: DataSpec) -> GPTShape:
    """The model's sizes: explicit fields over the preset's over the defaults; context and vocab from the data
    where the config leaves them unset.

    Raises:
        ConfigError: the data is not token sequences, its windows exceed the context, or its vocabulary
            exceeds model.vocab_size.
    """
    if spec.task == "regression" or spec.vocab_size is None:
        raise ConfigError(
            "model.name",
            f"gpt models token sequences (data.task=lm, or classification of token ids); this data is {spec.task} "
            f"with samples of shape {list(spec.input_shape)}",
            config.name,
            hint="use data.name=text, tokens, instructions or synthetic with data.task=lm, or text_classes",
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
        document_end=spec.document_end,
        num_classes=spec.num_classes if spec.task == "classification" else None,
        pad_id=spec.pad_id,
    )


@register_model("gpt")
def build_gpt(config: ModelConfig, spec: DataSpec) -> GPT:
    # model.init=default is GPT-2's init; another scheme is applied on top by build_model to the linear
    # layers (the tied output layer included), while the position embedding keeps GPT-2's N(0, 0.02)
    return GPT(resolve_gpt_shape(config, spec))
