"""Rules about sharded parameters, checked against what torch actually does on 2 real gloo ranks:
which fused optimizer kernels run on FSDP2-sharded (DTensor) parameters, and why a conv net's
weights stay NCHW under FSDP."""

from __future__ import annotations

from typing import Any

import torch

from gputrain.data.augment import apply_channels_last
from tests.dist.harness import run_ranks


def _sharded_job(rank: int) -> tuple[dict[str, tuple[bool, bool, bool]], str]:
    return _fused_on_sharded(), _channels_last_under_fsdp()


def _channels_last_under_fsdp() -> str:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten())
    model.to(memory_format=torch.channels_last)  # what apply_channels_last would do on CUDA
    try:
        fully_shard(model, mesh=init_device_mesh("cpu", (2,)))
    except NotImplementedError as err:
        return str(err)
    return ""


def _fused_on_sharded() -> dict[str, tuple[bool, bool, bool]]:
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


def test_fused_kernels_and_channels_last_only_where_sharded_parameters_allow_them() -> None:
    for results, fsdp_refusal in run_ranks(_sharded_job):
        assert "non-contiguous" in fsdp_refusal  # why channels_last is skipped for sharded conv nets
        for name, (predicted, ran, plain) in results.items():
            assert predicted == ran, f"{name}: rule says fused={predicted}, torch {'ran' if ran else 'failed'}"
        assert results["adamw"][0] and not results["sgd"][0]  # the case that crashed FSDP2 runs on CUDA
        assert results["sgd"][2] and not results["rmsprop"][2]  # plain tensors: wherever a fused kernel exists
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten())
    cuda = torch.device("cuda", 0)
    assert not apply_channels_last(conv, cuda, sharded=True) and conv[0].weight.is_contiguous()
    assert not apply_channels_last(conv, cuda, pipelined=True) and conv[0].weight.is_contiguous()
    assert apply_channels_last(conv, cuda) and conv[0].weight.is_contiguous(memory_format=torch.channels_last)
