"""The fact collectors, run for real on this machine (and on files made in tmp_path)."""

from __future__ import annotations

import json

import pytest
import torch

from gputrain.env import collect_env, explain_cuda_unavailable, gpu_present, resolve_device, write_env_json
from gputrain.env.driver import GpuFacts, count_pci_gpus, find_libcuda
from gputrain.errors import ConfigError
from gputrain.env.facts import EnvReport, collect_shm, collect_torch_installs


def test_collect_env_is_serialisable_and_round_trips():
    report = collect_env()
    data = json.loads(json.dumps(report.to_dict()))
    assert EnvReport.from_dict(data) == report
    assert data["torch"] == torch.__version__
    expected_build = "rocm" if torch.version.hip else "cuda" if torch.version.cuda else "cpu"
    assert data["torch_build"] == expected_build
    assert data["cuda_available"] == torch.cuda.is_available()


def test_collect_env_is_cheap_enough_for_every_run(monkeypatch):
    """What makes it cheap (its time is a figure of the machine's load, not a test): once the process
    has paid its one-time costs (importing nvidia-ml-py, Python's platform module asking `uname -p`),
    no process is started, where there is no nvidia-smi to fall back on."""
    import shutil
    import subprocess

    collect_env()

    def no_process(*args, **kwargs):
        raise AssertionError(f"collect_env started a process: {args}")

    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    monkeypatch.setattr(subprocess, "Popen", no_process)
    monkeypatch.setattr(subprocess, "run", no_process)
    assert collect_env().torch == torch.__version__


def test_torch_installs_found_on_given_paths(tmp_path):
    for name, version in (("a", "2.4.0"), ("b", "2.10.0+cu128")):
        pkg = tmp_path / name / "torch"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (tmp_path / name / f"torch-{version}.dist-info").mkdir()
    (tmp_path / "c").mkdir()  # no torch here
    paths = [str(tmp_path / "a"), str(tmp_path / "c"), str(tmp_path / "b"), str(tmp_path / "a")]
    found = collect_torch_installs(paths)
    assert [(i.path, i.version) for i in found] == [(str(tmp_path / "a"), "2.4.0"),
                                                   (str(tmp_path / "b"), "2.10.0+cu128")]


def test_shm_and_libcuda_collectors(tmp_path):
    assert collect_shm(str(tmp_path / "missing")) is None
    shm = collect_shm(str(tmp_path))
    assert shm is not None and shm.total_bytes > 0 and 0 <= shm.free_bytes <= shm.total_bytes
    assert find_libcuda([str(tmp_path)]) in (None, find_libcuda())  # nothing planted yet
    (tmp_path / "libcuda.so.1").write_text("")
    assert find_libcuda([str(tmp_path)]) == str(tmp_path / "libcuda.so.1")


def test_bf16_and_tf32_follow_compute_capability():
    gpu = dict(index=0, name="x", memory_total_bytes=1, memory_used_bytes=0, utilization_pct=0,
               temperature_c=30, mig_enabled=False)
    assert GpuFacts(capability="7.5", **gpu).bf16 is False
    assert GpuFacts(capability="8.0", **gpu).tf32 is True
    assert GpuFacts(capability="10.0", **gpu).bf16 is True


def test_write_env_json(tmp_path):
    path = write_env_json(tmp_path / "run")
    assert json.loads(path.read_text())["torch"] == torch.__version__


def test_explain_cuda_unavailable_on_this_machine():
    if not gpu_present(collect_env()):  # this CPU machine: no advice, the CPU is the right device
        assert explain_cuda_unavailable().startswith("no GPU on this machine (no NVIDIA GPU")
        assert "install" not in explain_cuda_unavailable()
        assert resolve_device("auto")[1] == "auto: no GPU on this machine; training on the CPU"
    elif not torch.cuda.is_available():
        assert "; " in explain_cuda_unavailable()  # a GPU torch cannot use: the cause and the fix


def test_resolve_device_on_a_gpu_torch_cannot_use_gives_the_fix(monkeypatch, facts):
    # a machine we don't have: an H100 under a CPU-only torch (recorded facts, edited)
    unusable = facts("h100_healthy", torch="2.13.0+cpu", torch_build="cpu", torch_cuda=None,
                     cuda_available=False, device_count=0, cudnn_version=None, nccl_version=None)
    monkeypatch.setattr("gputrain.env.facts.collect_env", lambda: unusable)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    device, why = resolve_device("auto")
    assert device.type == "cpu"
    assert why.startswith("auto: this machine has a GPU but torch cannot use it — torch 2.13.0+cpu is a CPU-only")
    assert why.endswith("install a CUDA build: pip install torch --index-url https://download.pytorch.org/whl/cu128")
    with pytest.raises(ConfigError) as info:
        resolve_device("cuda")
    assert "CPU-only build" in str(info.value) and "install a CUDA build" in str(info.value)
    no_gpu = facts("cpu_only_no_driver")
    monkeypatch.setattr("gputrain.env.facts.collect_env", lambda: no_gpu)
    assert resolve_device("auto")[1] == "auto: no GPU on this machine; training on the CPU"
    with pytest.raises(ConfigError) as info:
        resolve_device("cuda")
    assert str(info.value).endswith("CUDA is not available: no GPU on this machine (no NVIDIA GPU on the PCI bus, "
                                    "no NVIDIA driver, no Apple MPS)\n  use train.device=auto or cpu")


def test_pci_gpus_counts_nvidia_display_controllers_only(tmp_path):
    devices = {"0000:00:00.0": ("0x8086", "0x060000"),   # host bridge
               "0000:01:00.0": ("0x10de", "0x030200"),   # an H100 (3D controller)
               "0000:02:00.0": ("0x10de", "0x030000"),   # a GeForce (VGA)
               "0000:02:00.1": ("0x10de", "0x040300"),   # its audio function
               "0000:03:00.0": ("0x10de", "0x068000"),   # an NVSwitch (bridge)
               "0000:04:00.0": ("0x1002", "0x030000")}   # an AMD GPU
    for name, (vendor, cls) in devices.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "vendor").write_text(vendor + "\n")
        (tmp_path / name / "class").write_text(cls + "\n")
    (tmp_path / "0000:05:00.0").mkdir()  # unreadable entries are skipped
    assert count_pci_gpus(str(tmp_path)) == 2
    assert count_pci_gpus(str(tmp_path / "missing")) is None
    assert count_pci_gpus() == collect_env().driver.pci_gpus
