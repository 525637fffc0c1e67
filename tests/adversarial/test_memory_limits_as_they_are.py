"""Limits as they are (issue 27): the memory one rank on this node can have (config/memory_limit.py's
rank_memory_limit) is the lowest of this process's own limits (RLIMIT_AS, RLIMIT_DATA: each process
has its own, so never divided; less what the process maps already) and its share of what the ranks
of the node share (the cgroup's limit, v1 or v2, its own cgroup's or an ancestor's; physical memory),
and it names the one that binds. Each case fakes the machine: /proc/self/cgroup's text, the cgroup
files under a temporary CGROUP_ROOT, the rlimits, /proc/self/status and physical memory (this
machine cannot make cgroups; tests/unit/config/test_memory_limit.py reads its real ones and runs
real `prlimit` children). The plan and the `auto:` line say the same limit:
tests/unit/plan/test_plan_limits.py."""

from __future__ import annotations

import os
import re
import resource
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gputrain.config import load_config, memory_limit, sizes
from gputrain.config.memory_limit import ADDRESS_SPACE, DATA_SEGMENT, MemoryLimit, rank_memory_limit
from gputrain.errors import ConfigError

GIB = 2**30
MIB = 2**20


@dataclass(frozen=True)
class Machine:
    physical: int = 64 * GIB
    self_cgroup: str = "0::/job\n"
    files: dict[str, str] = field(default_factory=dict)
    address_space: int | None = None
    data: int | None = None
    vm_size: int = 600 * MIB
    vm_data: int = 200 * MIB
    status: bool = True
    """False: /proc/self/status cannot be read."""
    local_world_size: str | None = None


def _fake(machine: Machine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "cgroup"
    for rel, value in machine.files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(value)
    monkeypatch.setattr(memory_limit, "CGROUP_ROOT", root)
    monkeypatch.setattr(memory_limit, "_self_cgroup", lambda: machine.self_cgroup)
    real_sysconf = os.sysconf
    page = 4096
    monkeypatch.setattr(
        os,
        "sysconf",
        lambda name: {"SC_PAGE_SIZE": page, "SC_PHYS_PAGES": machine.physical // page}.get(name) or real_sysconf(name),
    )
    soft = {resource.RLIMIT_AS: machine.address_space, resource.RLIMIT_DATA: machine.data}
    monkeypatch.setattr(resource, "getrlimit", lambda which: (soft.get(which) or resource.RLIM_INFINITY,) * 2)
    status = tmp_path / "status"
    if machine.status:
        status.write_text(
            f"Name:\tpython\nVmPeak:\t{9 * machine.vm_size // 1024} kB\n"
            f"VmSize:\t{machine.vm_size // 1024} kB\nVmData:\t{machine.vm_data // 1024} kB\n"
        )
    monkeypatch.setattr(memory_limit, "PROC_STATUS", status)
    if machine.local_world_size is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", machine.local_world_size)


def _cg(tmp_path: Path, rel: str) -> str:
    return str(tmp_path / "cgroup" / rel)


# (machine, ranks asked (None: LOCAL_WORLD_SIZE), expected bytes, expected name; {cg:...} is a cgroup file's path)
CASES: dict[str, tuple[Machine, int | None, int, str]] = {
    "physical-alone": (Machine(), None, 64 * GIB, "this machine's memory of 64.00 GiB"),
    "physical-shared-by-local-world-size": (
        Machine(local_world_size="4"),
        None,
        16 * GIB,
        "this machine's memory of 64.00 GiB, shared by 4 ranks",
    ),
    "physical-shared-by-planned-ranks": (
        Machine(local_world_size="4"),
        8,
        8 * GIB,
        "this machine's memory of 64.00 GiB, shared by 8 ranks",
    ),
    "v2-own-cgroup-shared": (
        Machine(files={"job/memory.max": str(8 * GIB)}, local_world_size="2"),
        None,
        4 * GIB,
        "the cgroup's memory limit ({cg:job/memory.max}) of 8.00 GiB, shared by 2 ranks",
    ),
    "v2-ancestor-shared": (
        Machine(self_cgroup="0::/a/b/c\n", files={"a/b/c/memory.max": "max", "a/memory.max": str(12 * GIB)}),
        3,
        4 * GIB,
        "the cgroup's memory limit ({cg:a/memory.max}) of 12.00 GiB, shared by 3 ranks",
    ),
    "v2-root-of-a-container": (
        Machine(self_cgroup="0::/\n", files={"memory.max": str(3 * GIB)}),
        None,
        3 * GIB,
        "the cgroup's memory limit ({cg:memory.max}) of 3.00 GiB",
    ),
    "v1-own-cgroup-shared": (
        Machine(
            self_cgroup="4:memory:/slurm/job7\n3:cpu:/\n",
            files={
                "memory/slurm/job7/memory.limit_in_bytes": str(6 * GIB),
                "memory/memory.limit_in_bytes": "9223372036854771712",
            },
        ),
        3,
        2 * GIB,
        "the cgroup's memory limit ({cg:memory/slurm/job7/memory.limit_in_bytes}) of 6.00 GiB, shared by 3 ranks",
    ),
    "v1-joined-controllers": (
        Machine(self_cgroup="5:cpuacct,memory:/job\n", files={"memory/job/memory.limit_in_bytes": str(GIB)}),
        2,
        GIB // 2,
        "the cgroup's memory limit ({cg:memory/job/memory.limit_in_bytes}) of 1.00 GiB, shared by 2 ranks",
    ),
    "v1-and-v2-the-lower": (
        Machine(
            self_cgroup="4:memory:/j\n0::/j\n",
            files={"memory/j/memory.limit_in_bytes": str(10 * GIB), "j/memory.max": str(5 * GIB)},
        ),
        1,
        5 * GIB,
        "the cgroup's memory limit ({cg:j/memory.max}) of 5.00 GiB",
    ),
    "cgroup-garbage-ignored": (
        Machine(files={"job/memory.max": "lots", "memory.max": "-1"}),
        2,
        32 * GIB,
        "this machine's memory of 64.00 GiB, shared by 2 ranks",
    ),
    "address-space-not-divided": (
        Machine(address_space=4 * GIB, vm_size=GIB, local_world_size="2"),
        None,
        3 * GIB,
        f"{ADDRESS_SPACE} of 4.00 GiB, less the 1.00 GiB this process maps already",
    ),
    "address-space-with-8-ranks": (
        Machine(address_space=4 * GIB, vm_size=512 * MIB),
        8,
        4 * GIB - 512 * MIB,
        f"{ADDRESS_SPACE} of 4.00 GiB, less the 512 MiB this process maps already",
    ),
    "cgroup-share-below-address-space": (
        Machine(address_space=4 * GIB, vm_size=GIB, files={"job/memory.max": str(16 * GIB)}),
        8,
        2 * GIB,
        "the cgroup's memory limit ({cg:job/memory.max}) of 16.00 GiB, shared by 8 ranks",
    ),
    "address-space-below-cgroup-share": (
        Machine(address_space=4 * GIB, vm_size=GIB, files={"job/memory.max": str(16 * GIB)}),
        2,
        3 * GIB,
        f"{ADDRESS_SPACE} of 4.00 GiB, less the 1.00 GiB this process maps already",
    ),
    "data-limit": (
        Machine(data=2 * GIB, vm_data=512 * MIB),
        2,
        2 * GIB - 512 * MIB,
        f"{DATA_SEGMENT} of 2.00 GiB, less the 512 MiB this process maps already",
    ),
    "data-below-address-space": (
        Machine(address_space=8 * GIB, data=2 * GIB),
        1,
        2 * GIB - 200 * MIB,
        f"{DATA_SEGMENT} of 2.00 GiB, less the 200 MiB this process maps already",
    ),
    "address-space-below-data": (
        Machine(address_space=2 * GIB, data=8 * GIB),
        1,
        2 * GIB - 600 * MIB,
        f"{ADDRESS_SPACE} of 2.00 GiB, less the 600 MiB this process maps already",
    ),
    "address-space-all-mapped": (
        Machine(address_space=GIB, vm_size=2 * GIB),
        1,
        0,
        f"{ADDRESS_SPACE} of 1.00 GiB, less the 2.00 GiB this process maps already",
    ),
    "status-unreadable": (
        Machine(address_space=4 * GIB, status=False),
        1,
        4 * GIB,
        f"{ADDRESS_SPACE} of 4.00 GiB, less the 0 MiB this process maps already",
    ),
    "local-world-size-garbage": (Machine(local_world_size="two"), None, 64 * GIB, "this machine's memory of 64.00 GiB"),
    "local-world-size-zero": (Machine(local_world_size="0"), None, 64 * GIB, "this machine's memory of 64.00 GiB"),
    "planned-ranks-zero": (Machine(), 0, 64 * GIB, "this machine's memory of 64.00 GiB"),
}


@pytest.mark.parametrize(("machine", "ranks", "expected", "what"), CASES.values(), ids=CASES.keys())
def test_the_binding_limit_of_one_rank(
    machine: Machine, ranks: int | None, expected: int, what: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake(machine, tmp_path, monkeypatch)
    named = what.replace("{cg:", "\0").split("\0")
    what = named[0] + "".join(_cg(tmp_path, part.split("}", 1)[0]) + part.split("}", 1)[1] for part in named[1:])
    assert rank_memory_limit(ranks=ranks) == MemoryLimit(expected, what)


# ----------------------------------------------------------------------------- the checks that use it
STATE = {  # optim sgd without momentum: weights and gradients, 8 bytes a parameter
    "per-process-limit-two-ranks": (
        Machine(address_space=4 * GIB, vm_size=GIB, local_world_size="2"),
        3 * GIB,
        f"{ADDRESS_SPACE} of 4.00 GiB",
    ),
    "cgroup-two-ranks": (
        Machine(files={"job/memory.max": str(6 * GIB)}, local_world_size="2"),
        3 * GIB,
        "shared by 2 ranks",
    ),
}


@pytest.mark.parametrize(("machine", "room", "named"), STATE.values(), ids=STATE.keys())
def test_the_training_state_check_uses_the_binding_limit(
    machine: Machine, room: int, named: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A per-process limit was divided by LOCAL_WORLD_SIZE: two ranks under `prlimit --as=4GiB` were
    each told they had 2 GiB. A model that fits the rank's room passes; one byte more is refused."""
    import torch
    from torch import nn

    from gputrain.errors import UsageError

    _fake(machine, tmp_path, monkeypatch)
    config = load_config({"optim.name": "sgd", "optim.momentum": 0.0})
    model = nn.Module()
    model.register_parameter("w", nn.Parameter(torch.empty(room // 8, device="meta")))
    memory, where = sizes.state_memory(torch.device("cpu"))
    assert memory is not None and memory[0] == room and named in memory[1] and where == "each rank on the host"
    sizes.check_training_state_fits(config, model, 0, 1, memory, where)
    model.register_parameter("v", nn.Parameter(torch.empty(1, device="meta")))
    with pytest.raises(UsageError, match=rf"but each rank on the host has 3\.0 GiB \(.*{re.escape(named)}"):
        sizes.check_training_state_fits(config, model, 0, 1, memory, where)


def test_the_config_check_names_the_binding_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(Machine(files={"job/memory.max": str(2 * GIB)}, local_world_size="2"), tmp_path, monkeypatch)
    with pytest.raises(ConfigError) as err:  # 2.1 G parameters: 8 GiB of weights at least
        load_config({"model.name": "mlp", "model.hidden_sizes": [32768, 32768, 32768]})
    assert str(err.value).startswith(
        "config error: model.hidden_sizes = [32768, 32768, 32768]: asks for model.name=mlp with at least 2.1B "
        f"parameters: 8.0 GiB or more, but one rank can have 1.0 GiB (the cgroup's memory limit "
        f"({_cg(tmp_path, 'job/memory.max')}) of 2.00 GiB, shared by 2 ranks)"
    )


def test_a_limit_with_nothing_left_refuses_rather_than_skips(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(Machine(address_space=GIB, vm_size=2 * GIB), tmp_path, monkeypatch)
    with pytest.raises(ConfigError, match=r"but one rank can have 0\.0 KiB"):
        load_config({"model.name": "mlp", "model.hidden_sizes": [64, 64]})
