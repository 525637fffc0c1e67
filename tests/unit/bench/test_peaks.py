"""The datasheet table: GPU names as torch reports them → dense peak FLOP/s and the source."""

from __future__ import annotations

import pytest

from gputrain.env.peaks import PEAKS, datasheet_peak_flops, match_gpu_model

T = 1e12


@pytest.mark.parametrize(("name", "model", "bf16_tflops"), [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.5),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756.5),
    ("NVIDIA H100 NVL", "H100 NVL", 835.5),
    ("NVIDIA H200", "H200 SXM", 989.5),
    ("NVIDIA A100-SXM4-80GB", "A100", 312),
    ("NVIDIA A100-PCIE-40GB", "A100", 312),
    ("NVIDIA A10", "A10", 125),
    ("NVIDIA L4", "L4", 121),
    ("NVIDIA L40S", "L40S", 362.05),
    ("NVIDIA GeForce RTX 3090", "RTX 3090", 71),
    ("NVIDIA GeForce RTX 4090", "RTX 4090", 165.2),
    ("NVIDIA B200", "B200", 2250),
    ("NVIDIA GH200 480GB", "GH200", 989.5),
    ("NVIDIA GH200 144G HBM3e", "GH200", 989.5),
])
def test_known_gpus(name, model, bf16_tflops):
    assert match_gpu_model(name).model == model
    flops, source = datasheet_peak_flops(name, "bf16")
    assert flops == pytest.approx(bf16_tflops * T)
    assert "NVIDIA" in source and model in source


def test_dense_not_sparse():
    # The H100 SXM datasheet's 1979 TFLOPS bf16 is with 2:4 sparsity; MFU needs the dense half.
    assert datasheet_peak_flops("NVIDIA H100 80GB HBM3", "bf16")[0] == pytest.approx(1979 / 2 * T, rel=1e-3)
    assert datasheet_peak_flops("NVIDIA H100 80GB HBM3", "fp32")[0] == pytest.approx(67 * T)
    assert datasheet_peak_flops("NVIDIA A100-SXM4-80GB", "tf32")[0] == pytest.approx(156 * T)


def test_pre_ampere_has_fp16_and_fp32_only():
    assert datasheet_peak_flops("Tesla V100-SXM2-16GB", "fp16")[0] == pytest.approx(125 * T)
    assert datasheet_peak_flops("Tesla V100-PCIE-32GB", "fp32")[0] == pytest.approx(14 * T)
    assert datasheet_peak_flops("Tesla T4", "fp16")[0] == pytest.approx(65 * T)
    assert datasheet_peak_flops("Tesla T4", "bf16") is None
    assert datasheet_peak_flops("Tesla V100-SXM2-16GB", "tf32") is None


def test_lookalikes_and_cpus_are_not_matched():
    for name in ("NVIDIA A10G", "NVIDIA L40", "NVIDIA GeForce RTX 3090 Ti", "cpu: AMD EPYC x2", "AMD Instinct MI300X"):
        assert datasheet_peak_flops(name, "bf16") is None, name


def test_every_row_is_complete_and_bad_dtypes_are_refused():
    for row in PEAKS:
        assert row.source.startswith("NVIDIA")
        assert {"fp32", "fp16"} <= set(row.flops)
        assert all(v > 0 for v in row.flops.values())
    with pytest.raises(ValueError):
        datasheet_peak_flops("NVIDIA H100 PCIe", "fp4")


def test_fp8_peaks_only_where_the_gpu_has_float8_tensor_cores():
    assert datasheet_peak_flops("NVIDIA H100 80GB HBM3", "fp8")[0] == pytest.approx(1979 * T)
    assert datasheet_peak_flops("NVIDIA L4", "fp8")[0] == pytest.approx(242.5 * T)
    assert datasheet_peak_flops("NVIDIA A100-SXM4-80GB", "fp8") is None  # sm_80: no float8


def test_mig_slices_are_scaled_by_their_sms_and_never_given_the_whole_gpu():
    full = datasheet_peak_flops("NVIDIA A100-SXM4-40GB", "bf16")[0]
    seven, source = datasheet_peak_flops("NVIDIA A100-SXM4-40GB MIG 7g.40gb", "bf16", sm_count=98)
    assert seven == pytest.approx(full * 98 / 108) and "MIG slice 7g.40gb" in source
    one = datasheet_peak_flops("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "bf16", sm_count=16)[0]
    assert one == pytest.approx(989.5 * T * 16 / 132)
    assert datasheet_peak_flops("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "bf16") is None  # size unknown: no guess
    assert datasheet_peak_flops("NVIDIA H100 80GB HBM3", "bf16", sm_count=132)[0] == pytest.approx(989.5 * T)
