"""Tensor parallelism with DTensor plans: each Linear's weight is split over the tp ranks.

Plans are found by structure, not declared by the model:

* a stack of Linear layers (the mlp, any nn.Sequential): Linears alternate column-wise (output
  features split, no communication) and row-wise (input features split, one all-reduce), so
  each pair costs one all-reduce; an odd last Linear is column-wise with its output gathered.
* a GPT-style transformer (`blocks` of `ln_1`, `attn` (`c_attn`/`qkv` fused, `c_proj`/`proj`),
  `ln_2`, `mlp` (`c_fc`/`fc`, `c_proj`/`proj`), plus `wte`/`tok_emb`, `wpe`/`pos_emb`, `ln_f`,
  `lm_head`/`head` tied to the token embedding) — written against that expected structure:
  attention and the MLP are each column- then row-wise: the fused q/k/v projection is laid out
  head by head ([head, (q, k, v), head_dim], see models/gpt.py), so a column split hands each
  rank whole heads, and attention runs on them without communication until the output
  projection. Sequence parallelism: between blocks the residual stream is split along the sequence, so the
  LayerNorms run on 1/tp of the tokens; the embeddings produce sequence shards directly and the
  head gathers them. The tied embedding/head weight is sharded the same way on both (by vocab
  rows) and re-tied after sharding.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from gputrain.distributed.blocks import find_block_stack
from gputrain.errors import ConfigError


def _first(module: nn.Module, names: tuple[str, ...]) -> str | None:
    return next((n for n in names if isinstance(getattr(module, n, None), nn.Module)), None)


def linear_stack_plan(model: nn.Module) -> dict[str, object]:
    """Alternating column/row-wise plan for the Linear layers of a stack, in order."""
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    plan: dict[str, object] = {}
    for i, name in enumerate(linears):
        if i % 2 == 0:
            last = i == len(linears) - 1
            plan[name] = ColwiseParallel(output_layouts=Replicate()) if last else ColwiseParallel()
        else:
            plan[name] = RowwiseParallel()
    return plan


def gpt_plan(model: nn.Module) -> dict[str, object] | None:
    """The plan for a GPT-style model, or None if the model does not have that structure."""
    stack = find_block_stack(model)
    tok, pos = _first(model, ("wte", "tok_emb")), _first(model, ("wpe", "pos_emb"))
    head, norm = _first(model, ("lm_head", "head")), _first(model, ("ln_f",))
    if stack is None or None in (tok, pos, head, norm):
        return None
    plan: dict[str, object] = {
        # token ids are replicated; the embedding output comes out split along the sequence
        tok: RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        # positions [T, C] split along T, to add to the [B, T/tp, C] token shard
        pos: RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0)),
        norm: SequenceParallel(),
        head: ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
    stack_name, blocks = stack
    for i, block in enumerate(blocks):
        attn, mlp = getattr(block, "attn", None), getattr(block, "mlp", None)
        fc, fc_out = (_first(mlp, ("c_fc", "fc")), _first(mlp, ("c_proj", "proj"))) if mlp is not None else (None, None)
        qkv, attn_out = ((_first(attn, ("c_attn", "qkv")), _first(attn, ("c_proj", "proj"))) if attn is not None
                         else (None, None))
        if None in (qkv, attn_out, fc, fc_out) or not all(hasattr(block, n) for n in ("ln_1", "ln_2")):
            return None
        p = f"{stack_name}.{i}"
        plan.update({
            f"{p}.ln_1": SequenceParallel(),
            # gather the sequence shards, then split by heads: each rank attends with its own heads
            f"{p}.attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            f"{p}.attn.{qkv}": ColwiseParallel(),
            f"{p}.attn.{attn_out}": RowwiseParallel(output_layouts=Shard(1)),
            f"{p}.ln_2": SequenceParallel(),
            f"{p}.mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            f"{p}.mlp.{fc}": ColwiseParallel(),
            f"{p}.mlp.{fc_out}": RowwiseParallel(output_layouts=Shard(1)),
        })
    return plan


def _tied_parameters(model: nn.Module) -> list[tuple[str, str]]:
    """(owner, alias) qualified parameter names that share one Parameter (e.g. embedding and head)."""
    first: dict[int, str] = {}
    ties = []
    for module_name, module in model.named_modules(remove_duplicate=False):
        for pname, param in module.named_parameters(recurse=False, remove_duplicate=False):
            full = f"{module_name}.{pname}" if module_name else pname
            if id(param) in first and first[id(param)] != full:
                ties.append((first[id(param)], full))
            first.setdefault(id(param), full)
    return ties


def apply_tp(model: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """Shard the model's Linear (and, for GPT, embedding) weights over the 1-D tp mesh, in place.

    Raises:
        ConfigError: the model has no structure this module knows how to split.
    """
    plan = gpt_plan(model)
    heads = {m.n_head for m in model.modules() if isinstance(getattr(m, "n_head", None), int) and hasattr(m, "head_dim")}
    if plan is not None and any(h % mesh.size() for h in heads):
        raise ConfigError("parallel.tp", f"must divide the number of attention heads ({min(heads)}): each rank takes "
                          "whole heads", mesh.size())
    if plan is None:
        if not isinstance(model, nn.Sequential):
            raise ConfigError("parallel.tp", f"tensor parallelism knows plans for the mlp (an nn.Sequential of "
                              f"Linear layers) and GPT-style models, not {type(model).__name__}", mesh.size(),
                              hint="use parallel.strategy=fsdp or ddp for this model")
        plan = linear_stack_plan(model)
    ties = _tied_parameters(model)
    parallelize_module(model, mesh, plan)  # type: ignore[arg-type]
    for owner, alias in ties:  # sharding replaced each module's Parameter: point the alias at the owner again
        module_name, _, pname = alias.rpartition(".")
        setattr(model.get_submodule(module_name), pname, model.get_parameter(owner))
    return model
