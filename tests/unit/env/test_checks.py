"""Each check fed recorded facts: the situations this CPU machine cannot produce for real."""

from __future__ import annotations

import json

import pytest

from gputrain.env.checks import (check_allocator, check_cuda_available, check_cuda_visible_devices, check_cudnn,
                                  check_dist, check_driver, check_driver_cuda_version, check_gpus,
                                  check_nccl, check_shm, check_torch_build, check_torch_installs,
                                  gpu_present, passed, run_checks)
from gputrain.env.render import render_json, render_table
from tests.unit.env.recorded_facts import load_recorded

NO_DRIVER = {"driver.libcuda_path": None, "driver.nvidia_smi_path": None, "driver.proc_driver": False,
             "driver.driver_version": None, "driver.driver_cuda_version": None,
             "driver.nvml_gpu_count": None, "driver.nvml_error": "NVMLError_LibraryNotFound",
             "gpus": [], "cuda_available": False, "device_count": 0, "cudnn_version": None}


def by_name(checks, name):
    [check] = [c for c in checks if c.name == name]
    return check


def test_healthy_h100_passes_every_check(facts):
    checks = run_checks(facts("h100_healthy"))
    assert [c for c in checks if c.status != "ok"] == []
    assert passed(checks)
    gpu = by_name(checks, "gpu 0")
    for words in ("NVIDIA H100 80GB HBM3", "cc 9.0", "bf16 yes", "tf32 yes", "MIG off", "0.5/79.6 GiB"):
        assert words in gpu.detail
    assert "CUDA 12.8" in by_name(checks, "driver vs CUDA runtime").detail
    assert by_name(checks, "nccl").detail == "NCCL 2.27.3"
    assert check_torch_build(facts("h100_healthy")).detail == "CUDA build (CUDA runtime 12.8)"


def test_machine_without_a_gpu_recorded_here_is_healthy_and_trains_on_the_cpu(facts):
    f = facts("cpu_only_no_driver")
    assert not gpu_present(f)
    checks = run_checks(f)
    assert [c for c in checks if c.status != "ok"] == []  # nothing to fix: no CUDA build, no driver asked for
    assert passed(checks)
    build = by_name(checks, "torch build")
    assert build.detail == "torch 2.13.0+cpu: CPU-only build, and this machine has no GPU" and build.fix is None
    verdict = by_name(checks, "cpu training")
    assert verdict.detail.startswith("no GPU on this machine (no NVIDIA GPU on the PCI bus, no NVIDIA driver")
    assert verdict.detail.endswith("gputrain trains on the CPU (2 cores)")
    assert not any(c.name in ("nvidia driver", "gpu training", "CUDA_VISIBLE_DEVICES") for c in checks)
    assert all("CUDA build" not in (c.fix or "") + c.detail and not c.fix for c in checks)
    table = " ".join(render_table(checks).split())
    assert table.endswith("CPU training works; this machine has no GPU (0 fail, 0 warn, 6 ok)")


def test_require_gpu_fails_without_a_gpu_and_passes_with_one(facts):
    checks = run_checks(facts("cpu_only_no_driver"), require_gpu=True)
    verdict = by_name(checks, "gpu training")
    assert verdict.status == "fail" and verdict.detail.startswith("no GPU on this machine")
    assert verdict.fix.startswith("run on a machine with a GPU")
    assert not passed(checks) and [c.name for c in checks if c.status == "fail"] == ["gpu training"]
    assert "GPU training is NOT possible" in render_table(checks)
    assert passed(run_checks(facts("h100_healthy"), require_gpu=True))
    mac = facts("cpu_only_no_driver", mps_available=True, platform="macOS-15.1-arm64-arm-64bit", shm=None)
    assert passed(run_checks(mac, require_gpu=True))


# What tells a machine without a GPU from one whose GPU torch cannot use: each sign alone is enough.
GPU_SIGNS = {"pci bus": {"driver.pci_gpus": 2}, "kernel module": {"driver.proc_driver": True},
             "nvml": {"driver.nvml_gpu_count": 1}, "driver answers": {"driver.driver_version": "570.133.20"}}


@pytest.mark.parametrize("sign", sorted(GPU_SIGNS))
def test_gpu_present_but_torch_cpu_only_gets_the_cuda_build_advice(facts, sign):
    f = facts("cpu_only_no_driver", **GPU_SIGNS[sign])
    assert gpu_present(f)
    checks = run_checks(f)
    build = by_name(checks, "torch build")
    assert build.status == "fail" and "CPU-only build: it cannot use any GPU" in build.detail
    assert build.fix.startswith("install a CUDA build: pip install torch --index-url")
    verdict = by_name(checks, "gpu training")
    assert verdict.status == "fail" and "CPU-only build" in verdict.detail and verdict.fix == build.fix
    assert not passed(checks)
    assert "GPU training is NOT possible" in render_table(checks)


def test_cuda_libraries_without_a_gpu_are_no_gpu(facts):
    # a CUDA container image on a CPU host: libcuda and nvidia-smi are files, not a GPU
    f = facts("cpu_only_no_driver", torch="2.13.0+cu128", torch_build="cuda", torch_cuda="12.8",
              cuda_visible_devices="", **{"driver.libcuda_path": "/usr/local/cuda/compat/libcuda.so.1",
                                          "driver.nvidia_smi_path": "/usr/bin/nvidia-smi"})
    assert not gpu_present(f)
    checks = run_checks(f)
    assert passed(checks) and by_name(checks, "cpu training").status == "ok"
    assert check_cuda_visible_devices(f) is None and check_driver(f) is None


def test_gpu_on_the_bus_without_a_driver_asks_for_the_driver(facts):
    f = facts("cpu_only_no_driver", torch_build="cuda", torch_cuda="12.8", **{"driver.pci_gpus": 1})
    checks = run_checks(f)
    driver = by_name(checks, "nvidia driver")
    assert driver.status == "fail" and "install the NVIDIA driver" in driver.fix
    assert "no NVIDIA driver" in by_name(checks, "gpu training").detail


def test_cpu_only_wheel_on_a_gpu_machine_blames_the_wheel_not_the_driver(facts):
    f = facts("h100_healthy", torch="2.10.0+cpu", torch_build="cpu", torch_cuda=None,
              cuda_available=False, device_count=0, cudnn_version=None, nccl_version=None)
    checks = run_checks(f)
    assert [c.name for c in checks if c.status == "fail"] == ["torch build", "gpu training"]
    # The wheel offered is the newest the driver (CUDA 12.8) can run.
    assert by_name(checks, "gpu training").fix.endswith("--index-url https://download.pytorch.org/whl/cu128")
    assert check_driver(f).status == "ok"
    older = facts("h100_healthy", torch_build="cpu", **{"driver.driver_cuda_version": "12.7"})
    assert check_torch_build(older).fix.endswith("/whl/cu126")
    ancient = facts("h100_healthy", torch_build="cpu", **{"driver.driver_cuda_version": "11.4"})
    assert check_torch_build(ancient).fix.startswith("upgrade the NVIDIA driver (it supports CUDA 11.4")


def test_no_driver(facts):
    f = facts("h100_healthy", **NO_DRIVER)
    result = check_driver(f)
    assert result.status == "fail"
    assert "no NVIDIA driver" in result.detail and "no libcuda" in result.detail
    assert "install the NVIDIA driver" in result.fix
    verdict = check_cuda_available(f)
    assert verdict.status == "fail" and "no NVIDIA driver" in verdict.detail
    assert check_driver_cuda_version(f) is None  # nothing to compare without NVML


def test_driver_too_old_for_the_wheels_cuda_runtime(facts):
    f = facts("h100_healthy", cuda_available=False, device_count=0,
              **{"driver.driver_version": "470.256.02", "driver.driver_cuda_version": "11.4"})
    result = check_driver_cuda_version(f)
    assert result.status == "fail"
    assert "driver too old" in result.detail
    assert "supports CUDA 11.4" in result.detail and "built for CUDA 12.8" in result.detail
    assert "upgrade the NVIDIA driver to one supporting CUDA 12.8" in result.fix
    assert "driver too old" in check_cuda_available(f).detail


def test_older_minor_driver_only_warns(facts):
    f = facts("h100_healthy", **{"driver.driver_cuda_version": "12.4"})
    result = check_driver_cuda_version(f)
    assert result.status == "warn" and "minor-version compatibility" in result.detail


def test_cuda_visible_devices_hiding_every_gpu(facts):
    for hidden in ("", "-1", "-1,0", "8", "8,0"):
        f = facts("h100_healthy", cuda_visible_devices=hidden, cuda_available=False, device_count=0,
                  **{"driver.nvml_gpu_count": 8})
        result = check_cuda_visible_devices(f)
        assert result.status == "fail", hidden
        assert "hides every GPU (8 on the machine)" in result.detail
        assert result.fix.startswith("unset CUDA_VISIBLE_DEVICES")
        assert "CUDA_VISIBLE_DEVICES" in check_cuda_available(f).detail
    assert check_cuda_visible_devices(facts("h100_healthy", cuda_visible_devices="0")).status == "ok"
    assert check_cuda_visible_devices(facts("h100_healthy")) is None
    # A CPU-only wheel on a GPU machine sees no device whatever the variable says: not its fault.
    cpu_wheel = facts("h100_healthy", torch_build="cpu", torch_cuda=None, cuda_available=False,
                      device_count=0, cuda_visible_devices="0")
    assert check_cuda_visible_devices(cpu_wheel).status == "ok"
    assert "CPU-only build" in check_cuda_available(cpu_wheel).detail


def test_two_torch_installs_on_sys_path(facts):
    installs = [{"path": "/root/.local/lib/python3.11/site-packages", "version": "2.4.0"},
                {"path": "/opt/venv/lib/python3.11/site-packages", "version": "2.10.0+cu128"}]
    result = check_torch_installs(facts("h100_healthy", torch_installs=installs))
    assert result.status == "warn"
    assert "2 torch installations" in result.detail and "the first wins" in result.detail
    assert "/root/.local/lib/python3.11/site-packages (2.4.0)" in result.detail
    assert "pip uninstall torch" in result.fix
    assert check_torch_installs(facts("h100_healthy")).status == "ok"


def test_small_dev_shm(facts):
    result = check_shm(facts("h100_healthy", shm={"path": "/dev/shm", "total_bytes": 64 << 20,
                                                  "free_bytes": 64 << 20}))
    assert result.status == "warn"
    assert "/dev/shm is 64 MiB" in result.detail and "too small for data-loader workers" in result.detail
    assert "--shm-size" in result.fix and "data.num_workers=0" in result.fix
    assert check_shm(facts("h100_healthy", shm=None)) is None


def test_gpu_warnings_mig_busy_hot(facts):
    [mig] = check_gpus(facts("h100_healthy", **{"gpus.0.mig_enabled": True}))
    assert mig.status == "warn" and "MIG is on" in mig.detail and "MIG" in mig.fix
    [busy] = check_gpus(facts("h100_healthy", **{"gpus.0.utilization_pct": 97}))
    assert busy.status == "warn" and "busy" in busy.detail
    [full] = check_gpus(facts("h100_healthy", **{"gpus.0.memory_used_bytes": 80 << 30}))
    assert full.status == "warn" and "over half the memory" in full.detail
    [hot] = check_gpus(facts("h100_healthy", **{"gpus.0.temperature_c": 91}))
    assert hot.status == "warn" and "throttle" in hot.detail


def test_pre_ampere_gpu_has_no_bf16_or_tf32(facts):
    data = load_recorded("h100_healthy")["gpus"][0] | {"name": "Tesla V100-SXM2-16GB", "capability": "7.0",
                                                     "bf16": None, "tf32": None}
    [gpu] = check_gpus(facts("h100_healthy", gpus=[data]))
    assert "bf16 no" in gpu.detail and "tf32 no" in gpu.detail


def test_missing_cudnn_and_nccl_warn(facts):
    f = facts("h100_healthy", cudnn_version=None, nccl_version=None)
    assert check_cudnn(f).status == "warn" and "cuDNN is not available" in check_cudnn(f).detail
    assert check_nccl(f).status == "warn" and "falls back to gloo" in check_nccl(f).detail
    assert check_nccl(facts("cpu_only_no_driver")) is None


def test_dist_smoke_result_names_the_failing_rank(facts):
    f = facts("h100_healthy", dist={"backend": "nccl", "world_size": 8, "ok": False, "seconds": 3.0,
                                    "failed_rank": 5, "error": "NCCL error: unhandled system error"})
    result = check_dist(f)
    assert result.status == "fail"
    assert result.detail.startswith("rank 5 of 8 failed: NCCL error")
    assert "NCCL_DEBUG=INFO" in result.fix
    assert not passed(run_checks(f))


def test_run_checks_accepts_the_json_dict_and_rendering_shows_fixes(facts):
    data = load_recorded("cpu_only_no_driver")
    data["driver"]["proc_driver"] = True  # a GPU whose kernel module is loaded, and a CPU-only torch
    checks = run_checks(data)
    assert all(c.status in ("ok", "warn", "fail") for c in checks)
    assert all(c.fix for c in checks if c.status != "ok")
    table = " ".join(render_table(checks).split())
    assert "FAIL torch build" in table and "fix: install a CUDA build" in table
    assert "GPU training is NOT possible" in table
    doc = json.loads(render_json(facts("cpu_only_no_driver"), checks))
    assert set(doc) == {"facts", "checks"}
    assert all(set(c) == {"name", "status", "detail", "fix"} for c in doc["checks"])


def test_macos_build_with_mps_can_train_on_the_apple_gpu(facts):
    f = facts("cpu_only_no_driver", mps_available=True, platform="macOS-15.1-arm64-arm-64bit", shm=None)
    checks = run_checks(f)
    assert "MPS" in check_torch_build(f).detail and check_driver(f) is None
    assert passed(checks)


def test_unknown_keys_from_a_newer_env_json_are_ignored(facts):
    data = load_recorded("h100_healthy") | {"added_in_a_later_version": 1}
    del data["mps_available"]  # and ones an older version did not write get their default
    del data["driver"]["pci_gpus"]
    assert passed(run_checks(data))


GLIBC = {"libc": "glibc 2.35", "setting": "auto", "user_setting": None, "by_launcher": False, "found": None,
         "cuda_alloc_conf": None}


@pytest.mark.parametrize(("allocator", "status", "words"), [
    (GLIBC, "ok", ["ranks of a sharded job: glibc mmap threshold 128 KiB (a job that shards its parameters on the CPU",
                   "DDP and one process: the C library's malloc, untouched by gputrain (no parameter shards",
                   "CUDA caching allocator: expandable_segments:True (gputrain's)"]),
    (GLIBC | {"cuda_alloc_conf": "backend:cudaMallocAsync"}, "ok",
     ["CUDA caching allocator: backend:cudaMallocAsync (yours)"]),
    (GLIBC | {"setting": "off"}, "ok", ["ranks of a sharded job: the C library's malloc, untouched by gputrain "
                                        "(GPUTRAIN_ALLOCATOR=off)"]),
    (GLIBC | {"setting": "glibc"}, "ok",
     ["ranks of a sharded job: glibc mmap threshold 128 KiB (GPUTRAIN_ALLOCATOR=glibc)",
      "DDP and one process: glibc mmap threshold 128 KiB (GPUTRAIN_ALLOCATOR=glibc)"]),
    (GLIBC | {"user_setting": "MALLOC_MMAP_THRESHOLD_=65536"}, "ok",
     ["(your own setting: MALLOC_MMAP_THRESHOLD_=65536)"]),
    (GLIBC | {"libc": None}, "ok",
     ["ranks of a sharded job: the C library's malloc, untouched by gputrain (not glibc"]),
    (GLIBC | {"setting": "jemalloc", "found": "/usr/lib/libjemalloc.so.2"}, "ok",
     ["ranks gputrain starts: jemalloc (GPUTRAIN_ALLOCATOR=jemalloc: preloaded into the ranks (/usr/lib/libjemalloc.so",
      "one process: jemalloc only where started with LD_PRELOAD=/usr/lib/libjemalloc.so.2"]),
    (GLIBC | {"setting": "jemalloc", "user_setting": "LD_PRELOAD=/x/libjemalloc.so"}, "ok",
     ["ranks of a sharded job: jemalloc (LD_PRELOAD=/x/libjemalloc.so); DDP and one process: jemalloc (LD_PRE"]),
    (GLIBC | {"setting": "jemalloc"}, "fail", ["GPUTRAIN_ALLOCATOR=jemalloc: no libjemalloc.so on this machine"]),
    (GLIBC | {"setting": "big"}, "fail", ["GPUTRAIN_ALLOCATOR='big': must be one of auto, off, glibc, jemalloc"]),
])
def test_the_allocator_line_says_what_the_ranks_and_one_process_run_with(facts, allocator, status, words):
    check = check_allocator(facts("h100_healthy", allocator=allocator))
    assert check.status == status and all(w in check.detail for w in words), check.detail
    assert (check.fix is None) == (status == "ok")
    cpu = check_allocator(facts("cpu_only_no_driver", allocator=GLIBC))
    assert "CUDA" not in cpu.detail  # a CPU build has no caching allocator to set
    assert check_allocator(facts("h100_healthy", allocator=None)) is None  # an env.json from before
    newer = run_checks(load_recorded("h100_healthy") | {"allocator": allocator | {"added_later": 1}})
    assert by_name(newer, "allocator") == check  # keys a later version adds are ignored
