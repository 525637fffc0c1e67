"""The intra-op thread choice (env/threads.py): recorded facts for the judgement, fake cgroup files
for the quota, and the same path for real on this machine (its affinity, cgroup and /proc/stat)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from gputrain.config import load_config
from gputrain.distributed.launch import LAUNCHER_SHARE_ENV
from gputrain.errors import ConfigError
from gputrain.env import threads
from gputrain.env.threads import CpuShare, apply_threads, auto_threads, busy_cores, cgroup_quota, explicit_threads


@pytest.fixture
def torch_threads() -> Iterator[None]:
    before, saved = torch.get_num_threads(), threads._set_by_gputrain
    threads._set_by_gputrain = None
    yield
    torch.set_num_threads(before)
    threads._set_by_gputrain = saved


# ----------------------------------------------------------------- the judgement, on recorded facts
@pytest.mark.parametrize(
    ("share", "device", "expected"),
    [
        (CpuShare(2, None, 0.0), "cpu", 2),  # idle 2-core machine: torch's own default
        (CpuShare(2, None, 2.0), "cpu", 1),  # a two-thread busy loop beside it
        (CpuShare(2, None, 0.2), "cpu", 2),  # background noise leaves both cores free
        (CpuShare(2, None, 0.5), "cpu", 1),  # half a core taken: not free enough to share
        (CpuShare(2, None, 7.5), "cpu", 1),  # load far above the cores: never fewer than 1
        (CpuShare(2, None, None), "cpu", 2),  # load not read (deterministic)
        (CpuShare(64, 1.5, 0.0), "cpu", 1),  # a container limited to 1.5 CPUs on a 64-core host
        (CpuShare(64, 8.0, 0.0), "cpu", 8),
        (CpuShare(16, None, 0.0, local_ranks=4), "cpu", 4),  # 4 ranks on the node share the cores
        (CpuShare(16, None, 3.0, local_ranks=4), "cpu", 4),  # the other 3 ranks' work is not a load
        (CpuShare(16, None, 14.0, local_ranks=4), "cpu", 3),  # 2 cores more than they explain
        (CpuShare(64, None, 0.0), "cuda", threads.HOST_THREADS),  # a GPU run: a few for the host
        (CpuShare(2, None, 0.0), "cuda", 2),
    ],
)
def test_auto_takes_the_free_cores(share: CpuShare, device: str, expected: int) -> None:
    choice = auto_threads(share, device)
    assert choice.threads == expected
    assert choice.reason.startswith(f"auto: {share.cores} core")


def test_the_reason_names_what_limited_it() -> None:
    assert auto_threads(CpuShare(2, None, 1.96), "cpu").describe() == (
        "1 CPU thread (auto: 2 cores, 2.0 busy with other processes)"
    )
    assert "cgroup quota 1.5" in auto_threads(CpuShare(8, 1.5, None), "cpu").reason
    assert "÷ 4 local ranks" in auto_threads(CpuShare(16, None, 0.0, local_ranks=4), "cpu").reason
    assert "GPU run" in auto_threads(CpuShare(64, None, None), "cuda").reason
    capped = auto_threads(CpuShare(8, None, 0.0), "cpu", ceiling=1)  # the program set 1 before the run
    assert capped.threads == 1 and "torch had 1" in capped.reason


def test_the_config_and_the_environment_win() -> None:
    assert explicit_threads(3, {"OMP_NUM_THREADS": "1"}) == threads.ThreadChoice(3, "train.num_threads")
    assert explicit_threads("auto", {"OMP_NUM_THREADS": "1"}) == threads.ThreadChoice(1, "OMP_NUM_THREADS=1")
    assert explicit_threads("auto", {"MKL_NUM_THREADS": "2"}) == threads.ThreadChoice(2, "MKL_NUM_THREADS=2")
    assert explicit_threads("auto", {}) is None
    assert explicit_threads("auto", {"OMP_NUM_THREADS": ""}) is None
    # the share gputrain's launcher set for its ranks is a default: each rank still chooses
    assert explicit_threads("auto", {"OMP_NUM_THREADS": "4", LAUNCHER_SHARE_ENV: "4"}) is None
    assert explicit_threads("auto", {"OMP_NUM_THREADS": "2", LAUNCHER_SHARE_ENV: "4"}) is not None


@pytest.mark.parametrize("value", [0, -1, 5000, 1.5, "many"])
def test_bad_num_threads_names_the_field(value: object) -> None:
    with pytest.raises(ConfigError, match=r"train\.num_threads"):
        load_config(None, [f"train.num_threads={value}"])


# ----------------------------------------------------------------- the quota, from fake cgroup files
def _cgroup(tmp_path: Path, lines: str, files: dict[str, str]) -> float | None:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(lines)
    return cgroup_quota(tmp_path / "sys", proc)


def test_cgroup_v2_quota(tmp_path: Path) -> None:
    assert _cgroup(tmp_path, "0::/\n", {"sys/cpu.max": "150000 100000\n"}) == 1.5
    assert _cgroup(tmp_path / "b", "0::/\n", {"sys/cpu.max": "max 100000\n"}) is None
    # the tightest of the process's own cgroup and its ancestors'
    nested = {"sys/kubepods/pod1/cpu.max": "400000 100000\n", "sys/kubepods/cpu.max": "200000 100000\n"}
    assert _cgroup(tmp_path / "c", "0::/kubepods/pod1\n", nested) == 2.0


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    lines = "4:memory:/\n2:cpu,cpuacct:/docker/abc\n0::/\n"
    files = {
        "sys/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "50000\n",
        "sys/cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
    }
    assert _cgroup(tmp_path, lines, files) == 0.5
    unlimited = {"sys/cpu/cpu.cfs_quota_us": "-1\n", "sys/cpu/cpu.cfs_period_us": "100000\n"}
    assert _cgroup(tmp_path / "b", "1:cpu:/\n", unlimited) is None


def test_no_or_garbled_cgroup_files_mean_no_quota(tmp_path: Path) -> None:
    assert cgroup_quota(tmp_path / "none", tmp_path / "none" / "cgroup") is None
    assert _cgroup(tmp_path, "0::/\n", {"sys/cpu.max": "lots\n"}) is None
    assert _cgroup(tmp_path / "b", "0::/\n", {"sys/cpu.max": "100000 0\n"}) is None


# ----------------------------------------------------------------- the same path, for real
def test_this_machine_facts_are_read() -> None:
    share = threads.collect_cpu_share()
    assert share.cores == len(os.sched_getaffinity(0))
    assert share.quota is None or share.quota > 0
    assert share.busy is not None and 0.0 <= share.busy <= share.cores + 1e-9  # Linux has /proc/stat
    assert threads.collect_cpu_share(sample_load=False).busy is None


def test_a_busy_loop_shows_as_busy() -> None:
    """Real load: a thread spinning in C (sleeping would not count) shows on /proc/stat."""
    import threading

    stop, spinning = threading.Event(), threading.Event()

    def spin() -> None:
        x = torch.ones(256, 256)
        while not stop.is_set():
            x @ x
            spinning.set()

    worker = threading.Thread(target=spin, daemon=True)
    with torch_one_thread():
        worker.start()
        try:
            assert spinning.wait(timeout=120)
            busy = busy_cores(cpus=set(os.sched_getaffinity(0)), window_s=0.2)
        finally:
            stop.set()
            worker.join()
    assert busy is not None and busy >= 0.5  # at least most of the spinning core


class torch_one_thread:
    def __enter__(self) -> None:
        self.before = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc: object) -> None:
        torch.set_num_threads(self.before)


def test_apply_sets_torch_and_a_later_run_may_raise_it_again(torch_threads: None, monkeypatch) -> None:
    for name in (*threads.THREAD_ENV, LAUNCHER_SHARE_ENV):
        monkeypatch.delenv(name, raising=False)
    before = torch.get_num_threads()
    choice = apply_threads(1, torch.device("cpu"), deterministic=False, local_ranks=1)
    assert choice.threads == 1 and torch.get_num_threads() == 1
    # the next run's ceiling is what torch had before gputrain set 1, not gputrain's own 1
    again = apply_threads("auto", torch.device("cpu"), deterministic=True, local_ranks=1)
    assert again.threads == min(before, len(os.sched_getaffinity(0))) == torch.get_num_threads()
    # a count the program set itself is a ceiling
    torch.set_num_threads(1)
    assert apply_threads("auto", torch.device("cpu"), deterministic=True, local_ranks=1).threads == 1


def test_the_device_line_says_what_was_chosen(torch_threads: None, tmp_path: Path, monkeypatch) -> None:
    """The real path through the Python API (the CLI builds the same Trainer): this machine's
    affinity, cgroup and load, the choice set in torch and said in the device line."""
    from torch import nn
    from torch.utils.data import TensorDataset

    from gputrain import Trainer

    for name in (*threads.THREAD_ENV, LAUNCHER_SHARE_ENV):
        monkeypatch.delenv(name, raising=False)
    data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    quiet = {
        "train.device": "cpu",
        "log.progress": "none",
        "log.tensorboard": False,
        "checkpoint.enabled": False,
        "train.batch_size": 16,
    }
    trainer = Trainer(nn.Linear(4, 2), data, config=quiet, run_dir=tmp_path)
    device_line = trainer.parts.place.lines[0]
    chosen = torch.get_num_threads()
    cores = len(os.sched_getaffinity(0))
    assert 1 <= chosen <= cores
    # an earlier test in the same process may have lowered torch's count: auto then stays under it
    expected = rf"; {chosen} CPU threads? \(auto: {cores} cores?, \d+\.\d busy with other processes(, torch had \d+)?\)$"
    assert re.search(expected, device_line), device_line

    explicit = Trainer(nn.Linear(4, 2), data, config={**quiet, "train.num_threads": 1}, run_dir=tmp_path / "b")
    assert explicit.parts.place.lines[0].endswith("; 1 CPU thread (train.num_threads)") and torch.get_num_threads() == 1
