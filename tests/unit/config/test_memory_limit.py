"""The memory one rank can have (config/memory_limit.py), read for real: a process's own limits
(RLIMIT_AS, RLIMIT_DATA, set by `prlimit` on a child) are its own, whatever the ranks on the node;
a cgroup's limit and physical memory are shared by them. The cgroup files this machine has are read
through the same path as the faked ones of tests/adversarial/test_memory_limits_as_they_are.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gputrain.config import memory_limit
from gputrain.config.memory_limit import ADDRESS_SPACE, DATA_SEGMENT, MemoryLimit, rank_memory_limit
from gputrain.config.sizes import state_memory

ROOT = Path(__file__).resolve().parents[3]
GIB = 2**30
_CHILD = r"""
import json, re, torch
from gputrain.config.memory_limit import rank_memory_limit
from gputrain.config.sizes import state_memory
limit = rank_memory_limit()
(state_bytes, state_what), where = state_memory(torch.device("cpu"))
print("RESULT " + json.dumps({"bytes": limit.bytes, "what": limit.what, "state": [state_bytes, state_what, where]}))
"""


def _child(option: str, ranks: int) -> dict[str, object]:
    """rank_memory_limit and state_memory in a child that imported torch, under `prlimit <option>`,
    as one of `ranks` ranks of this node."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LOCAL_WORLD_SIZE": str(ranks), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        ["prlimit", option, sys.executable, "-c", _CHILD],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-2000:]
    return json.loads(lines[0].removeprefix("RESULT "))


@pytest.mark.parametrize(("option", "what"), [("--as", ADDRESS_SPACE), ("--data", DATA_SEGMENT)])
@pytest.mark.parametrize("ranks", [1, 2])
def test_a_processs_own_limit_is_not_divided_by_the_ranks(option: str, what: str, ranks: int) -> None:
    limit = 3 * GIB
    got = _child(f"{option}={limit}", ranks)
    used = re.fullmatch(
        rf"{re.escape(what)} of 3\.00 GiB, less the (\d+) MiB this process maps already", str(got["what"])
    )
    assert used, got
    # less what the process maps already (torch imported: hundreds of MiB of address space), not ÷ ranks
    assert abs(int(got["bytes"]) - (limit - int(used[1]) * 2**20)) <= 2**20
    assert int(got["bytes"]) > limit * 0.6 and "shared" not in str(got["what"])
    assert got["state"][:2] == [got["bytes"], got["what"]]
    assert got["state"][2] == ("the host" if ranks == 1 else "each rank on the host")


def test_an_idle_ranks_address_space_is_what_it_maps() -> None:
    """The figure subtracted is this process's VmSize, read where the check runs."""
    found = re.search(r"VmSize:\s+(\d+) kB", Path("/proc/self/status").read_text())
    assert found is not None
    vm_size = int(found[1]) * 1024
    assert abs(memory_limit._mapped("VmSize") - vm_size) < 64 * 2**20  # the same process, a moment later
    assert memory_limit._mapped("VmSize") > 200 * 2**20  # torch is imported here: a rank maps that much idle


def test_this_machines_own_cgroup_files_are_read() -> None:
    """The real path: /proc/self/cgroup names the files; each readable limit there, and physical
    memory, is a candidate, divided by the ranks; the lowest binds."""
    text = Path("/proc/self/cgroup").read_text()
    assert memory_limit._self_cgroup() == text
    files = memory_limit._cgroup_paths(text)
    for line in text.splitlines():  # this process's own cgroup of each memory hierarchy is among them
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            assert memory_limit.CGROUP_ROOT / "memory" / path.lstrip("/") / "memory.limit_in_bytes" in files
    limits = [int(f.read_text()) for f in files if f.is_file() and f.read_text().strip().isdigit()]
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    import resource

    if any(resource.getrlimit(r)[0] != resource.RLIM_INFINITY for r in (resource.RLIMIT_AS, resource.RLIMIT_DATA)):
        pytest.skip("this test process has a limit of its own")
    for ranks in (1, 3):
        got = rank_memory_limit(ranks=ranks)
        assert got is not None and got.bytes == min([physical, *limits]) // ranks
        assert got.what.endswith(f", shared by {ranks} ranks") == (ranks > 1)


def test_local_world_size_is_the_ranks_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory_limit, "_host_limits", lambda ranks: [MemoryLimit(12 * GIB // ranks, str(ranks))])
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert rank_memory_limit() == MemoryLimit(3 * GIB, "4")
    assert rank_memory_limit(ranks=2) == MemoryLimit(6 * GIB, "2")  # a plan's --nproc-per-node wins
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert rank_memory_limit() == MemoryLimit(12 * GIB, "1")


def test_a_gpu_rank_has_its_gpus_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """One rank per GPU: its memory is not divided, and host limits do not bound it."""
    props = type("Props", (), {"total_memory": 80 * GIB})()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    monkeypatch.setattr(memory_limit, "_host_limits", lambda ranks: [MemoryLimit(GIB, "a host limit")])
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    cuda = torch.device("cuda", 3)
    assert rank_memory_limit(cuda) == MemoryLimit(80 * GIB, "cuda:3's memory")
    assert state_memory(cuda) == ((80 * GIB, "cuda:3's memory"), "cuda:3")
    # parallel.cpu_offload: the state lives in host memory
    assert state_memory(cuda, offload=True) == ((GIB, "a host limit"), "each rank on the host")
