"""The allocator settings a user (or a shell profile) leaves in the environment, mistyped or odd
(issue 27): GPUTRAIN_ALLOCATOR that is no choice, or names a malloc this machine or process lacks,
is one line naming it, exit 2, before any rank starts and with no run directory; GLIBC_TUNABLES,
MALLOC_*_ and LD_PRELOAD of any form are read without failing, a malloc setting of the user's is
never replaced, what the launcher gives the ranks is a well-formed GLIBC_TUNABLES, and of the
resolved layouts only those that gather parameter shards in host memory get the fixed threshold."""

from __future__ import annotations

from pathlib import Path

import pytest

from gputrain.distributed.allocator import (
    LAUNCHER_TUNABLE_ENV,
    AllocatorFacts,
    choose_allocator,
    collect_allocator_facts,
    find_malloc,
    libc_name,
    rank_environment,
    users_setting,
)
from gputrain.errors import UsageError
from tests.conftest import run_cli

TRAIN = [
    "train",
    "data.name=synthetic",
    "data.shape=[4]",
    "data.num_samples=64",
    "model.name=mlp",
    "model.hidden_sizes=[8]",
    "train.max_steps=2",
    "log.progress=none",
    "log.tensorboard=false",
]

# ----------------------------------------------------------------- GPUTRAIN_ALLOCATOR: no choice
NOT_A_CHOICE = ["bogus", "jemalloc2", "1", "on", "true", "glibc:131072", "mmap", "tc malloc", "öff", "\x1b[31mred"]


@pytest.mark.parametrize("value", NOT_A_CHOICE)
@pytest.mark.parametrize("shards", [False, True])
def test_a_setting_that_is_no_choice_is_refused_naming_the_choices(value: str, shards: bool) -> None:
    with pytest.raises(UsageError, match=r"^GPUTRAIN_ALLOCATOR=.*: must be one of auto, off, glibc, jemalloc, tcmal"):
        choose_allocator(collect_allocator_facts({"GPUTRAIN_ALLOCATOR": value}), shards)
    with pytest.raises(UsageError, match=r"^GPUTRAIN_ALLOCATOR="):
        rank_environment({"GPUTRAIN_ALLOCATOR": value}, cuda_build=False)


@pytest.mark.parametrize(
    ("value", "setting"),
    [("", "auto"), ("  ", "auto"), (" OFF ", "off"), ("Glibc", "glibc"), ("AUTO", "auto"), ("\toff\n", "off")],
)
def test_case_and_spaces_around_a_choice_do_not_matter(value: str, setting: str) -> None:
    assert collect_allocator_facts({"GPUTRAIN_ALLOCATOR": value}).setting == setting


# ----------------------------------------------------------------- the user's own settings, any form
ODD_TUNABLES = [
    ("", None),
    (":", None),
    ("=", None),
    ("::::", None),
    ("glibc.malloc.mmap_threshold", None),
    ("=131072", None),
    ("glibc.malloc.tcache_count=0", None),
    ("glibc.malloc.mmap_threshold=", "GLIBC_TUNABLES="),
    ("glibc.malloc.mmap_threshold=abc", "GLIBC_TUNABLES=glibc.malloc.mmap_threshold=abc"),
    ("::glibc.malloc.trim_threshold=1::", "GLIBC_TUNABLES=glibc.malloc.trim_threshold=1"),
    (" glibc.malloc.mmap_threshold = 4096 ", "GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4096"),
    ("x=" + "9" * 5000, None),
    ("glibc.malloc.mmap_threshold=1=2", "GLIBC_TUNABLES=glibc.malloc.mmap_threshold=1=2"),
    ("glibc.malloc.mmap_threshold=1:glibc.malloc.mmap_threshold=2", "GLIBC_TUNABLES=glibc.malloc.mmap_threshold=2"),
    ("glibc.mallocX.mmap_threshold=1", None),
    ("GLIBC.MALLOC.MMAP_THRESHOLD=1", None),  # glibc's names are exact
]


@pytest.mark.parametrize(("tunables", "mine"), ODD_TUNABLES, ids=[repr(t[:40]) for t, _ in ODD_TUNABLES])
def test_any_glibc_tunables_is_read_and_a_malloc_threshold_in_it_is_the_users(tunables: str, mine: str | None) -> None:
    env = {"GLIBC_TUNABLES": tunables}
    found = users_setting(env)
    assert (found is None) == (mine is None) and (mine is None or found.startswith(mine)), found  # type: ignore[union-attr]
    assert "GLIBC_TUNABLES" not in rank_environment(env, cuda_build=False)  # auto: the ranks' own mallopt
    added = rank_environment({**env, "GPUTRAIN_ALLOCATOR": "glibc"}, cuda_build=False)
    if mine is not None or libc_name() is None:
        assert "GLIBC_TUNABLES" not in added  # the user's threshold is never replaced
    else:  # appended after what was there, no empty part in between, marked as gputrain's
        value = added["GLIBC_TUNABLES"]
        assert value.endswith("glibc.malloc.mmap_threshold=131072:glibc.malloc.trim_threshold=131072")
        assert "::" not in value.strip(":") or "::" in tunables.strip(":")
        assert added[LAUNCHER_TUNABLE_ENV] == value


ODD_PRELOADS = [
    ("", None),
    (":", None),
    (" ", None),
    ("libjemalloc.so.2", "libjemalloc.so.2"),
    ("/a b/libtcmalloc_minimal.so.4", "b/libtcmalloc_minimal.so.4"),  # the loader splits at spaces too
    ("/opt/libasan.so:/usr/lib/libjemalloc.so.2", "/usr/lib/libjemalloc.so.2"),
    ("/usr/lib/libmimalloc.so /x/liby.so", "/usr/lib/libmimalloc.so"),
    ("/jemalloc/libfoo.so", None),
    ("libtcmalloc.so.4::", "libtcmalloc.so.4"),
]


@pytest.mark.parametrize(("preload", "mine"), ODD_PRELOADS)
def test_a_malloc_in_ld_preload_is_the_users_and_is_kept(preload: str, mine: str | None) -> None:
    env = {"LD_PRELOAD": preload}
    assert users_setting(env) == (f"LD_PRELOAD={mine}" if mine else None)
    added = rank_environment({**env, "GPUTRAIN_ALLOCATOR": "jemalloc"}, False) if mine else {}
    assert "LD_PRELOAD" not in added and "GLIBC_TUNABLES" not in added


@pytest.mark.parametrize("name", ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"])
@pytest.mark.parametrize("value", ["0", "65536", "junk", " 1 "])
def test_glibcs_malloc_variables_are_the_users(name: str, value: str) -> None:
    facts = collect_allocator_facts({name: value})
    assert facts.user_setting == f"{name}={value.strip()}"
    assert choose_allocator(facts, True).name == "system"
    assert rank_environment({name: value, "GPUTRAIN_ALLOCATOR": "glibc"}, cuda_build=False) == {}
    assert collect_allocator_facts({name: "  "}).user_setting is None  # blank: not a setting


def test_a_preload_this_machine_lacks_or_that_is_not_loaded_is_one_line(tmp_path: Path) -> None:
    assert find_malloc("jemalloc", [tmp_path / "none", tmp_path]) is None
    (tmp_path / "libjemalloc.so.2").mkdir()  # a folder of that name is no library
    (tmp_path / "libjemalloc.so").write_text("")  # not named: find_malloc globs lib<name>.so*
    assert find_malloc("jemalloc", [tmp_path]) == str(tmp_path / "libjemalloc.so")
    for setting in ("jemalloc", "tcmalloc"):
        said = f"^GPUTRAIN_ALLOCATOR={setting}: {setting} is not preloaded in this process"
        with pytest.raises(UsageError, match=said):
            choose_allocator(AllocatorFacts("glibc 2.36", setting), True)


# ----------------------------------------------------------------- through the command line
CLI = [
    (["--nproc-per-node", "2"], {"GPUTRAIN_ALLOCATOR": "bogus"}, "GPUTRAIN_ALLOCATOR='bogus': must be one of"),
    ([], {"GPUTRAIN_ALLOCATOR": "nope"}, "GPUTRAIN_ALLOCATOR='nope': must be one of"),
    ([], {"GPUTRAIN_ALLOCATOR": "tcmalloc", "LD_PRELOAD": ""}, "GPUTRAIN_ALLOCATOR=tcmalloc: tcmalloc is not preload"),
]


@pytest.mark.parametrize(("launch", "env", "said"), CLI)
def test_from_the_command_line_it_is_one_line_exit_2_and_no_run_directory(
    tmp_path: Path, launch: list[str], env: dict[str, str], said: str
) -> None:
    run_dir = tmp_path / "run"
    result = run_cli(*TRAIN, "--run-dir", str(run_dir), *launch, cwd=tmp_path, env=env, timeout=120)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1 and said in lines[0], lines
    assert not run_dir.exists()


@pytest.mark.skipif(find_malloc("jemalloc") is not None, reason="asserts what a machine without jemalloc says")
def test_the_launcher_refuses_a_malloc_this_machine_lacks_before_any_rank_starts(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = run_cli(
        *TRAIN,
        "--run-dir",
        str(run_dir),
        "--nproc-per-node",
        "2",
        cwd=tmp_path,
        env={"GPUTRAIN_ALLOCATOR": "jemalloc"},
        timeout=120,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "GPUTRAIN_ALLOCATOR=jemalloc: no libjemalloc.so on this machine" in result.stderr
    assert "rank" not in result.stderr and not run_dir.exists()


# ----------------------------------------------------------------- which resolved layouts get the threshold
LAYOUTS = [
    # (strategy, ranks, parallel.* given, device, cpu_offload, shards on the CPU side)
    ("none", 1, {}, "cpu", False, False),
    ("fsdp", 1, {}, "cpu", False, False),  # one process: nothing to gather
    ("ddp", 2, {}, "cpu", False, False),
    ("ddp", 64, {}, "cpu", False, False),
    ("ddp", 2, {}, "cuda", True, False),  # offload means nothing without FSDP
    ("fsdp", 2, {}, "cpu", False, True),
    ("fsdp", 2, {}, "cuda", False, False),  # the gathers are the caching allocator's
    ("fsdp", 2, {}, "cuda", True, True),  # host shards, gradients, optimizer step
    ("fsdp", 8, {"dp_replicate": 2}, "cpu", False, True),  # HSDP
    ("hybrid", 4, {"dp_replicate": 2, "dp_shard": 2}, "cpu", False, True),  # HSDP
    ("hybrid", 4, {"dp_shard": 2, "tp": 2}, "cpu", False, True),
    ("hybrid", 4, {"dp_replicate": 2, "dp_shard": 1, "tp": 2}, "cpu", False, True),  # FSDP holds TP's replicas
    ("hybrid", 4, {"dp_shard": 1, "tp": 2, "pp": 2}, "cpu", False, False),
    ("tp", 2, {}, "cpu", False, False),  # split once, never gathered
    ("pp", 2, {}, "cpu", False, False),  # each stage whole
]


@pytest.mark.parametrize(("strategy", "ranks", "given", "device", "offload", "shards"), LAYOUTS)
def test_the_threshold_follows_the_resolved_layout(
    strategy: str, ranks: int, given: dict[str, int], device: str, offload: bool, shards: bool
) -> None:
    from gputrain.config.schema import ParallelConfig
    from gputrain.distributed.allocator import host_shards
    from gputrain.distributed.parallel_dims import dims_for_strategy

    dims = dims_for_strategy(strategy, ParallelConfig(strategy=strategy, **given), ranks)  # type: ignore[arg-type]
    assert host_shards(dims.fsdp_enabled, device, offload) is shards
    facts = AllocatorFacts("glibc 2.36")
    assert choose_allocator(facts, host_shards(dims.fsdp_enabled, device, offload)).name == (
        "glibc-mmap-threshold" if shards else "system"
    )
