"""Each advisor rule on facts crafted to have (and not have) its bottleneck."""

from __future__ import annotations

import dataclasses

import pytest

from gputrain.observe.advisor import Finding, RunFacts, advise


def healthy_gpu(**changes) -> RunFacts:  # type: ignore[no-untyped-def]
    facts = RunFacts(device_type="cuda", precision="bf16", batch_size=256, step_time_s=0.05, data_fraction=0.02,
                     num_workers=4, pin_memory=True, cpu_count=16, kernels_per_step=300, short_kernels_per_step=40,
                     compiled=True, tensor_cores=True, fp32_matmul_share=None, syncs_per_step=0.0,
                     device_utilisation=0.93, conv_net=True, channels_last=True)
    return dataclasses.replace(facts, **changes)


def only(findings: list[Finding]) -> Finding:
    assert len(findings) == 1, findings
    return findings[0]


def test_healthy_runs_have_no_finding() -> None:
    assert advise(healthy_gpu()) == []
    assert advise(RunFacts(device_type="cpu", precision="fp32", batch_size=64, step_time_s=0.01,
                           data_fraction=0.01, syncs_per_step=3.0)) == []  # .item() on CPU syncs nothing


def test_data_bound_names_workers_and_pinning() -> None:
    found = only(advise(healthy_gpu(data_fraction=0.38, num_workers=2, pin_memory=False, device_utilisation=0.55)))
    assert str(found) == ("data-bound: the device waits for data 38% of each step → "
                          "data.num_workers=4 (2 now), pinned memory")


def test_data_bound_in_memory_data_has_no_worker_advice() -> None:
    found = only(advise(healthy_gpu(data_fraction=0.5, loader_workers_apply=False)))
    assert "num_workers" not in found.change


def test_launch_bound() -> None:
    found = only(advise(healthy_gpu(compiled=False, kernels_per_step=2300, short_kernels_per_step=1900)))
    assert str(found) == "launch-bound: 1,900 kernels of < 10 µs per step → train.compile=true or a larger batch"
    compiled = only(advise(healthy_gpu(short_kernels_per_step=1900)))
    assert compiled.change.startswith("train.cuda_graphs=true")


def test_fp32_matmuls_on_tensor_cores() -> None:
    found = only(advise(healthy_gpu(precision="fp32", fp32_matmul_share=0.7)))
    assert found.bottleneck == "fp32 matmuls on a GPU with tensor cores"
    assert found.change.startswith("train.precision=bf16")
    assert advise(healthy_gpu(precision="fp32", fp32_matmul_share=0.7, tensor_cores=False)) == []


def test_host_sync_every_step() -> None:
    found = only(advise(healthy_gpu(syncs_per_step=1.0)))
    assert found.bottleneck == "host sync every step" and ".item()" in found.change


def test_gputrains_own_sync_every_step_is_flagged_as_ours() -> None:
    found = only(advise(healthy_gpu(own_syncs_per_step=1.2)))
    assert found.bottleneck == "gputrain syncs every step" and "fused" in found.change
    assert advise(healthy_gpu(own_syncs_per_step=0.3)) == []  # logging steps' reads only


def test_low_utilisation_suggests_bigger_batch() -> None:
    found = only(advise(healthy_gpu(device_utilisation=0.23)))
    assert str(found).startswith("batch too small to fill the GPU: utilisation 23% → train.batch_size=512")


def test_conv_net_not_channels_last() -> None:
    assert only(advise(healthy_gpu(channels_last=False))).bottleneck == "conv net not in channels_last"
    assert advise(healthy_gpu(channels_last=False, conv_net=False)) == []


@pytest.mark.parametrize("data_fraction", [0.14, None])
def test_below_threshold_is_quiet(data_fraction: float | None) -> None:
    assert advise(healthy_gpu(data_fraction=data_fraction)) == []


def test_comm_bound_suggests_more_samples_per_exchange() -> None:
    found = only(advise(healthy_gpu(comm_fraction=0.37, strategy="ddp", grad_accum=1, device_utilisation=0.45)))
    assert str(found) == ("communication-bound: the step waits for gradient communication 37% of its time → "
                          "train.grad_accum=2 (1 now) or a larger train.batch_size")
    fsdp = only(advise(healthy_gpu(comm_fraction=0.3, strategy="fsdp", grad_accum=2)))
    assert fsdp.change.startswith("train.grad_accum=4 (2 now)") and "parallel.strategy=ddp" in fsdp.change
    assert advise(healthy_gpu(comm_fraction=0.19, strategy="ddp")) == []


def _fp8_plan(preset: dict[str, object], recipe: str = "tensorwise") -> dict[str, object]:
    import torch

    from gputrain.config.schema import ModelConfig
    from gputrain.data.spec import DataSpec
    from gputrain.fp8 import plan_fp8
    from gputrain.models import build_model

    spec = DataSpec(task="lm", input_shape=(1024,), vocab_size=50304)
    with torch.device("meta"):
        model = build_model(ModelConfig(name="gpt", vocab_size=50304, dropout=0.0, **preset), spec)  # type: ignore[arg-type]
    return plan_fp8(model, recipe).to_dict()  # type: ignore[arg-type]


def test_fp8_at_gpt2_124m_is_said_not_to_pay() -> None:
    found = only(advise(healthy_gpu(precision="fp8", conv_net=False, fp8=_fp8_plan({"preset": "gpt2-124m"}))))
    assert found.bottleneck == "fp8 not expected to pay"
    assert "24 of 49 Linear layers in float8 (tensorwise; bf16: 1 output head, 24 too small to gain)" in found.evidence
    assert "d_model 2048" in found.evidence and found.change.startswith("train.precision=bf16")


def test_fp8_at_d_model_2048_is_quiet() -> None:
    plan = _fp8_plan({"n_layer": 24, "n_head": 16, "d_model": 2048})  # the 1.3B GPT: 92% in float8
    assert advise(healthy_gpu(precision="fp8", conv_net=False, fp8=plan)) == []
    assert advise(healthy_gpu(precision="bf16", conv_net=False, fp8=None)) == []
