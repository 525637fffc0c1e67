"""The fact collectors, run for real on this machine (and on files made in tmp_path)."""

from __future__ import annotations

import json
import time

import torch

from gputrain.env import collect_env, explain_cuda_unavailable, write_env_json
from gputrain.env.driver import GpuFacts, find_libcuda
from gputrain.env.facts import EnvReport, collect_shm, collect_torch_installs


def test_collect_env_is_serialisable_and_round_trips():
    report = collect_env()
    data = json.loads(json.dumps(report.to_dict()))
    assert EnvReport.from_dict(data) == report
    assert data["torch"] == torch.__version__
    expected_build = "rocm" if torch.version.hip else "cuda" if torch.version.cuda else "cpu"
    assert data["torch_build"] == expected_build
    assert data["cuda_available"] == torch.cuda.is_available()


def test_collect_env_is_cheap_enough_for_every_run():
    collect_env()  # the first call imports nvidia-ml-py
    start = time.perf_counter()
    collect_env()
    assert time.perf_counter() - start < 0.5


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
    if torch.version.cuda is None and not torch.version.hip:
        assert "CPU-only build" in explain_cuda_unavailable()
        assert "install a CUDA build" in explain_cuda_unavailable()
