"""The C allocator of the ranks (distributed/allocator.py): the choice on recorded facts, what the
launcher gives the ranks, and for real, in fresh processes on this machine's glibc: with the setting
a process that churns 8 MiB blocks among small ones (FSDP's unshard/reshard) gives its memory back,
and without it (GPUTRAIN_ALLOCATOR=off) it keeps hundreds of MiB."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gputrain.distributed import allocator
from gputrain.distributed.allocator import (
    CUDA_ALLOC_ENV,
    LAUNCHER_TUNABLE_ENV,
    MMAP_THRESHOLD,
    AllocatorFacts,
    choose_allocator,
    find_malloc,
    host_shards,
    launched_rank_choice,
    rank_environment,
    set_cuda_alloc_conf,
    users_setting,
)
from gputrain.errors import UsageError
from tests.unit.distributed.malloc_probe import has_mallinfo2

ROOT = Path(__file__).resolve().parents[3]
GLIBC = "glibc 2.36"
needs_glibc = pytest.mark.skipif(allocator.libc_name() is None or not has_mallinfo2(), reason="glibc >= 2.33 only")

# ----------------------------------------------------------------- the judgement, on recorded facts
FIXED = "glibc-mmap-threshold"


@pytest.mark.parametrize(
    ("facts", "shards", "name", "said"),
    [
        (AllocatorFacts(GLIBC), True, FIXED, "shards its parameters on the CPU side"),  # FSDP/HSDP ranks
        (AllocatorFacts(GLIBC), False, "system", "no parameter shards gathered"),  # DDP and one process: left as is
        (AllocatorFacts(GLIBC, "glibc"), False, FIXED, "GPUTRAIN_ALLOCATOR=glibc"),  # asked for: every process
        (AllocatorFacts(GLIBC, "off"), True, "system", "GPUTRAIN_ALLOCATOR=off"),  # the switch
        (AllocatorFacts(GLIBC, "glibc", "GLIBC_TUNABLES=glibc.malloc.mmap_threshold=65536"), True, "system", "your"),
        (AllocatorFacts(GLIBC, "auto", "MALLOC_MMAP_THRESHOLD_=1"), True, "system", "MALLOC_MMAP_THRESHOLD_=1"),
        (AllocatorFacts(GLIBC, "auto", "LD_PRELOAD=/x/libjemalloc.so.2"), True, "jemalloc", "LD_PRELOAD"),
        (AllocatorFacts(GLIBC, "jemalloc", "LD_PRELOAD=libtcmalloc.so.4"), False, "tcmalloc", "LD_PRELOAD"),
        (AllocatorFacts(None), True, "system", "not glibc"),  # musl, macOS: quietly nothing
        (AllocatorFacts(None, "glibc"), True, "system", "not glibc"),
        # the launcher's tunables (GPUTRAIN_ALLOCATOR=glibc) are in force from the start, whatever the job
        (AllocatorFacts(GLIBC, "glibc", by_launcher=True), False, FIXED, "launcher's GLIBC_TUNABLES"),
        (AllocatorFacts(GLIBC, by_launcher=True), False, FIXED, "launcher's GLIBC_TUNABLES"),
    ],
)
def test_the_choice_on_recorded_facts(facts: AllocatorFacts, shards: bool, name: str, said: str) -> None:
    choice = choose_allocator(facts, shards)
    assert (choice.name, said in choice.describe()) == (name, True), choice.describe()
    assert (choice.mmap_threshold == MMAP_THRESHOLD) == (name == FIXED)


@pytest.mark.parametrize("setting", ["bogus", "jemalloc", "tcmalloc"])
def test_a_setting_that_cannot_be_honoured_in_this_process_is_one_line(setting: str) -> None:
    with pytest.raises(UsageError, match=rf"GPUTRAIN_ALLOCATOR={setting!r}|GPUTRAIN_ALLOCATOR={setting}: "):
        choose_allocator(AllocatorFacts(GLIBC, setting), True)


@pytest.mark.parametrize(
    ("env", "mine"),
    [
        ({}, None),
        ({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2"}, None),  # another tunable is not a malloc setting
        ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}, "GLIBC_TUNABLES=glibc.malloc.trim_threshold=0"),
        ({"GLIBC_TUNABLES": "a=1:glibc.malloc.mmap_threshold=4096"}, "GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4096"),
        ({"GLIBC_TUNABLES": "x", LAUNCHER_TUNABLE_ENV: "x"}, None),  # gputrain's launcher's, not the user's
        ({"MALLOC_TRIM_THRESHOLD_": " 0 "}, "MALLOC_TRIM_THRESHOLD_=0"),
        ({"LD_PRELOAD": "/opt/libfoo.so /usr/lib/libmimalloc.so"}, "LD_PRELOAD=/usr/lib/libmimalloc.so"),
        ({"LD_PRELOAD": "/opt/libfoo.so"}, None),
    ],
)
def test_the_users_own_setting_is_found(env: dict[str, str], mine: str | None) -> None:
    assert users_setting(env) == mine


@pytest.mark.parametrize(
    ("fsdp", "device", "offload", "shards"),
    [
        (True, "cpu", False, True),  # FSDP/HSDP on CPU ranks: every step gathers and frees blocks in host memory
        (True, "cuda", True, True),  # CPU offload: host shards, gradients and the optimizer's step
        (True, "cuda", False, False),  # FSDP on GPUs: the gathers are the caching allocator's
        (False, "cpu", False, False),  # DDP, TP, PP, one process: nothing gathered per step
        (False, "cpu", True, False),
    ],
)
def test_which_layouts_shard_on_the_cpu_side(fsdp: bool, device: str, offload: bool, shards: bool) -> None:
    assert host_shards(fsdp, device, offload) is shards


# ----------------------------------------------------------------- what the launcher gives the ranks
@needs_glibc
def test_the_launcher_gives_the_thresholds_only_where_glibc_is_asked_for_and_marks_them_as_its_own() -> None:
    # under auto it cannot know the strategy each rank resolves: the ranks' own mallopt covers it
    assert "GLIBC_TUNABLES" not in rank_environment({"GLIBC_TUNABLES": "glibc.cpu.x=1"}, cuda_build=False)
    assert rank_environment({"GPUTRAIN_ALLOCATOR": "auto"}, cuda_build=False) == {}
    asked = {"GLIBC_TUNABLES": "glibc.cpu.x=1", "GPUTRAIN_ALLOCATOR": "glibc"}
    added = rank_environment(asked, cuda_build=False)
    assert added["GLIBC_TUNABLES"] == (
        f"glibc.cpu.x=1:glibc.malloc.mmap_threshold={MMAP_THRESHOLD}:glibc.malloc.trim_threshold=131072"
    )
    assert added[LAUNCHER_TUNABLE_ENV] == added["GLIBC_TUNABLES"]
    # a rank reads them as gputrain's, so it still reports (and applies) gputrain's setting
    rank = allocator.collect_allocator_facts({**asked, **added})
    assert rank.user_setting is None and rank.by_launcher
    # a launcher started inside such a rank adds nothing twice
    assert "GLIBC_TUNABLES" not in rank_environment({**asked, **added}, cuda_build=False)


@pytest.mark.parametrize(
    "env",
    [
        {"GPUTRAIN_ALLOCATOR": "off"},
        {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=1048576"},
        {"MALLOC_MMAP_THRESHOLD_": "65536"},
    ],
)
def test_the_launcher_leaves_the_users_choice(env: dict[str, str]) -> None:
    added = rank_environment({"GPUTRAIN_ALLOCATOR": "glibc", **env}, cuda_build=False)
    assert "GLIBC_TUNABLES" not in added and "LD_PRELOAD" not in added


def test_the_launcher_gives_no_tunables_where_the_c_library_is_not_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "libc_name", lambda: None)  # musl, macOS: no mmap threshold to fix
    assert rank_environment({"GPUTRAIN_ALLOCATOR": "glibc"}, cuda_build=False) == {}


def test_the_launcher_sets_cuda_only_where_unset() -> None:
    assert rank_environment({}, cuda_build=True) == {CUDA_ALLOC_ENV: "expandable_segments:True"}
    assert CUDA_ALLOC_ENV not in rank_environment({CUDA_ALLOC_ENV: "backend:native"}, cuda_build=True)


def test_a_malloc_this_machine_lacks_stops_the_launch_before_any_rank_starts(tmp_path: Path) -> None:
    facts = AllocatorFacts(GLIBC, "jemalloc", found=None)
    with pytest.raises(UsageError, match=r"GPUTRAIN_ALLOCATOR=jemalloc: no libjemalloc.so .*apt install libjemalloc2"):
        launched_rank_choice(facts, True)
    with pytest.raises(UsageError, match="GPUTRAIN_ALLOCATOR='nope'"):
        rank_environment({"GPUTRAIN_ALLOCATOR": "NOPE"}, cuda_build=False)


def test_a_malloc_that_is_installed_is_preloaded(tmp_path: Path) -> None:
    (tmp_path / "libtcmalloc.so.4").write_bytes(b"")
    assert find_malloc("tcmalloc", [tmp_path / "missing", tmp_path]) == str(tmp_path / "libtcmalloc.so.4")
    facts = AllocatorFacts(GLIBC, "tcmalloc", found=str(tmp_path / "libtcmalloc.so.4"))
    assert launched_rank_choice(facts, False).describe().startswith("tcmalloc (GPUTRAIN_ALLOCATOR=tcmalloc: preloaded")


def test_cuda_alloc_conf_is_set_only_on_a_cuda_build_and_never_over_the_users() -> None:
    import torch

    env: dict[str, str] = {}
    assert set_cuda_alloc_conf(env) == bool(torch.version.cuda and not torch.cuda.is_initialized())
    assert set_cuda_alloc_conf({CUDA_ALLOC_ENV: "mine"}) is False


# ----------------------------------------------------------------- for real, in fresh processes
CHURN = """
import ctypes, json, torch
from gputrain.distributed.allocator import apply_allocator
from tests.unit.distributed.malloc_probe import free_a_block, mmapped
def rss_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) >> 10 for line in f if line.startswith("VmRSS:"))
choice = apply_allocator(shards=True)  # as a rank of an FSDP job on the CPU does once its layout is known
start = rss_mib()
small, big = [], []
for i in range(240):  # FSDP's pattern: blocks gathered and freed, small tensors kept between them
    big.append(torch.ones(2 << 20))  # 8 MiB
    small.append(torch.ones(1000))
    if len(big) == 64:
        del big[:32]
big.clear()
end = rss_mib()
free_a_block(30 << 20)  # glibc's dynamic threshold would rise to 30 MiB here
print(json.dumps({"choice": choice.name, "start": start, "end": end, "24m": mmapped(24 << 20)}))
"""


def _churn(env: dict[str, str]) -> dict[str, int | str | bool]:
    clean = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "LD_PRELOAD")}
    run = subprocess.run(
        [sys.executable, "-c", CHURN],
        env={**clean, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(run.stdout.splitlines()[-1])  # type: ignore[no-any-return]  # the script's one line


@needs_glibc
def test_a_rank_gives_freed_blocks_back_and_the_switch_turns_it_off() -> None:
    on = _churn({})
    off = _churn({"GPUTRAIN_ALLOCATOR": "off"})
    assert on["choice"] == FIXED and off["choice"] == "system"
    kept_on, kept_off = int(on["end"]) - int(on["start"]), int(off["end"]) - int(off["start"])
    assert kept_on < 40, f"with the setting, the process kept {kept_on} MiB after freeing its blocks"
    assert kept_off >= 300, f"without it glibc keeps the freed blocks in its heap; kept only {kept_off} MiB"
    # the threshold stayed where it was set; without the setting a free raised it above 24 MiB
    assert (on["24m"], off["24m"]) == (True, False)


@needs_glibc
def test_the_users_own_setting_wins() -> None:
    # the user's threshold (32 MiB, above the probe's 24 MiB block) stays in force: not gputrain's 128 KiB
    mine = _churn({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=33554432"})
    assert (mine["choice"], mine["24m"]) == ("system", False)
    also = _churn({"MALLOC_MMAP_THRESHOLD_": "33554432"})
    assert (also["choice"], also["24m"]) == ("system", False)


@pytest.mark.skipif(find_malloc("jemalloc") is None, reason="needs libjemalloc installed")
def test_a_preloaded_jemalloc_is_what_the_process_runs_with() -> None:
    code = (
        "from gputrain.distributed.allocator import apply_allocator; "
        "maps = open('/proc/self/maps').read(); "
        "print(apply_allocator(shards=True).name, 'libjemalloc' in maps)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPUTRAIN_ALLOCATOR": "jemalloc"}
    env["LD_PRELOAD"] = rank_environment(env, cuda_build=False)["LD_PRELOAD"]
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert run.stdout.split() == ["jemalloc", "True"], run.stderr
