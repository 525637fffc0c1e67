"""The rule that picks fused optimizer kernels agrees with what torch can actually run on
FSDP2-sharded (DTensor) parameters, optimizer by optimizer, on 2 real gloo ranks."""

from __future__ import annotations

from typing import Any

from tests.dist.harness import run_ranks


def _fused_on_sharded(rank: int) -> dict[str, tuple[bool, bool, bool]]:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from gputrain.optim.optimizers import _CLASSES, fused_kernel_fits

    mesh = init_device_mesh("cpu", (2,))
    results: dict[str, tuple[bool, bool, bool]] = {}
    for name, cls in _CLASSES.items():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        plain = [p.detach().clone().requires_grad_() for p in model.parameters()]
        fully_shard(model, mesh=mesh)
        sharded = list(model.parameters())
        ran: Any
        try:  # torch's CPU fused kernels go through the same DTensor dispatch as the CUDA ones
            optimizer = cls(sharded, lr=0.01, fused=True)  # type: ignore[call-arg]
            model(torch.randn(4, 8)).square().sum().backward()
            optimizer.step()
            ran = True
        except (NotImplementedError, TypeError, RuntimeError):
            ran = False
        results[name] = (fused_kernel_fits(cls, sharded), ran, fused_kernel_fits(cls, plain))
    return results


def test_fused_kernels_are_chosen_only_where_sharded_parameters_can_run_them() -> None:
    for results in run_ranks(_fused_on_sharded):
        for name, (predicted, ran, plain) in results.items():
            assert predicted == ran, f"{name}: rule says fused={predicted}, torch {'ran' if ran else 'failed'}"
        assert results["adamw"][0] and not results["sgd"][0]  # the case that crashed FSDP2 runs on CUDA
        assert results["sgd"][2] and not results["rmsprop"][2]  # plain tensors: wherever a fused kernel exists
