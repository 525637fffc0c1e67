"""Work run inside the spawned ranks of test_meta_init.py (importable by the spawn start method)."""

from __future__ import annotations

from typing import Any

GPT = {"model.name": "gpt", "model.n_layer": 4, "model.n_head": 4, "model.d_model": 32, "model.seq_len": 16,
       "data.seq_len": 16}


def meta_init_check(rank: int) -> dict[str, dict[str, Any]]:
    """The tiny GPT built on meta, split (TP) or sharded (FSDP, and with activation checkpointing)
    there, then materialised: per layout, whether the gathered weights equal an eager build's, the
    parameter elements this rank holds against the whole model's, and the peak of live tensor bytes
    while materialising against the whole model's bytes."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from benchmarks.meta_memory import live_tensor_bytes
    from gputrain.config import load_config
    from gputrain.data.spec import DataSpec
    from gputrain.distributed.ac import apply_ac
    from gputrain.distributed.fsdp import apply_fsdp
    from gputrain.distributed.tp import apply_tp
    from gputrain.models import build_model
    from gputrain.models.gpt_parallel import gpt_tp_plan
    from gputrain.models.meta import prepare_meta_init

    dist.init_process_group("gloo")
    config = load_config(None, GPT)
    spec = DataSpec(task="lm", input_shape=(16,), vocab_size=64)
    torch.manual_seed(0)
    eager = build_model(config.model, spec)
    reference = {k: v.clone() for k, v in eager.state_dict().items()}
    whole_numel = sum(p.numel() for p in eager.parameters())
    whole_bytes = sum(p.numel() * p.element_size() for p in eager.parameters())
    del eager
    results = {}
    for layout in ("fsdp", "fsdp_ac", "tp"):
        torch.manual_seed(0)
        model = build_model(config.model, spec, on_meta=True)
        meta_init = prepare_meta_init(model)
        targets = dict(model.named_modules())
        mesh = init_device_mesh("cpu", (2,))
        if layout == "tp":
            apply_tp(model, mesh, gpt_tp_plan(model, 2))  # type: ignore[arg-type]
        else:
            if layout == "fsdp_ac":
                model = apply_ac(model, "full")
            apply_fsdp(model, mesh)
        with live_tensor_bytes() as tracker:
            meta_init.materialize([model], targets, torch.device("cpu"))
        state = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in model.state_dict().items()}
        local = {id(p): (p.to_local() if isinstance(p, DTensor) else p).numel() for p in model.parameters()}
        results[layout] = {
            "equal": sorted(state) == sorted(reference) and all(torch.equal(state[k], reference[k]) for k in reference),
            "local_numel": sum(local.values()),
            "whole_numel": whole_numel,
            "peak_bytes": tracker.peak,
            "whole_bytes": whole_bytes,
            "tied": model.get_parameter("lm_head.weight") is model.get_parameter("wte.weight"),
        }
    return results
