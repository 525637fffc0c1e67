"""The C allocator of a training rank: freed large blocks go back to the operating system, so a
rank's resident memory follows its live bytes (issue 27).

Under FSDP on the CPU each block's unshard/reshard allocates and frees tensors of 4-16 MiB, step
after step. glibc serves such sizes with mmap at first, but its threshold rises to the size of the
first large block freed (up to 32 MiB), and from then on they come from the main heap, where a
freed chunk below a live one is never returned: a GPT-2 350M rank held 1.2-1.8 GiB in ~1,400 free
chunks, its resident size 1.11-1.17x that of one process training the whole model while its live
bytes were 0.59x. A fixed threshold (128 KiB, glibc's own starting value; setting it turns the rise
off) and a fixed trim threshold keep those blocks in mmap, returned at each free: the ranks peaked
at 1,657 MiB and trained within 2.75 GiB, where one process cannot. (The measurements on a small
GPT, and what the threshold costs: docs/distributed.md, "Memory"; benchmarks/rank_allocator.py.)

What the ranks get, in order:
    GPUTRAIN_ALLOCATOR=off              nothing: the C library as it is
    the user's own malloc setting       GLIBC_TUNABLES' glibc.malloc.mmap_threshold/trim_threshold,
                                        MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_, or a malloc in
                                        LD_PRELOAD: left as it is
    GPUTRAIN_ALLOCATOR=jemalloc|tcmalloc  that library, preloaded into the ranks the launcher starts
    auto (the default)                  glibc: the fixed threshold in each rank of a job that shards
                                        its parameters on the CPU side (`host_shards`: FSDP or HSDP
                                        on CPU ranks, or with parallel.cpu_offload), by mallopt once
                                        the rank has resolved its strategy, before the model is
                                        materialised and anything is gathered; DDP, TP, PP, FSDP
                                        on GPUs and one process are left as they are (an mmap per
                                        large tensor costs page faults: 17-34% more CPU time
                                        measured, which only the churn of gathered shards repays);
                                        not glibc (musl, macOS): nothing
    GPUTRAIN_ALLOCATOR=glibc            the fixed threshold in every process: mallopt as it starts,
                                        and GLIBC_TUNABLES for the ranks the launcher starts (from
                                        their first allocation)

On CUDA the caching allocator is told `expandable_segments:True` (PYTORCH_CUDA_ALLOC_CONF, where
the user set none) before CUDA starts: segments grow in place instead of leaving blocks of other
sizes stranded, what torchtitan sets for its runs. It needs no process group to pay, so one process
gets it too.

Facts (`collect_allocator_facts`) and the judgement (`choose_allocator`) are apart, so the choice is
tested with recorded facts; `apply_allocator` does both in a rank, `rank_environment` in the launcher.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gputrain.errors import UsageError

ALLOCATOR_ENV = "GPUTRAIN_ALLOCATOR"
CHOICES = ("auto", "off", "glibc", "jemalloc", "tcmalloc")
Setting = Literal["auto", "off", "glibc", "jemalloc", "tcmalloc"]

MMAP_THRESHOLD = 128 << 10
"""Blocks from this size on are mmapped and returned at free: glibc's starting threshold, fixed."""
TRIM_THRESHOLD = 128 << 10
"""Free memory at the top of the heap above this is returned: glibc's default, which the dynamic
rise (to twice the mmap threshold) may have lifted before the rank set its own."""
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (malloc.h)

LAUNCHER_TUNABLE_ENV = "GPUTRAIN_LAUNCHER_GLIBC_TUNABLES"
"""Set by the launcher to the GLIBC_TUNABLES it gave the ranks: gputrain's default, not the user's
own setting, so the rank still reports (and applies) it as gputrain's."""
_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold")
_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
_PRELOADS = {"jemalloc": "jemalloc", "tcmalloc": "tcmalloc", "mimalloc": "mimalloc"}
_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")
CUDA_ALLOC_ENV = "PYTORCH_CUDA_ALLOC_CONF"
CUDA_ALLOC_SETTING = "expandable_segments:True"


@dataclass(frozen=True, slots=True)
class AllocatorFacts:
    """What decides a process's C allocator."""

    libc: str | None
    """"glibc 2.36"; None for another C library (musl, macOS's) or where it cannot be told."""
    setting: str = "auto"
    """GPUTRAIN_ALLOCATOR as given, lowercased ("auto" where unset): `choose_allocator` checks it."""
    user_setting: str | None = None
    """The user's own malloc setting ("GLIBC_TUNABLES=glibc.malloc.mmap_threshold=65536",
    "LD_PRELOAD=libjemalloc.so.2"), which wins; None where there is none."""
    by_launcher: bool = False
    """The fixed threshold is in GLIBC_TUNABLES from gputrain's launcher (GPUTRAIN_ALLOCATOR=glibc): in
    force from the process's start, whatever the job."""
    found: str | None = None
    """Where GPUTRAIN_ALLOCATOR names jemalloc or tcmalloc: the library the launcher would preload
    (None: not on this machine)."""
    cuda_alloc_conf: str | None = None
    """PYTORCH_CUDA_ALLOC_CONF as the user set it (None: gputrain sets expandable segments on CUDA)."""


@dataclass(frozen=True, slots=True)
class AllocatorChoice:
    """The setting a process runs with, for doctor, the device line and env.json."""

    name: Literal["glibc-mmap-threshold", "jemalloc", "tcmalloc", "system"]
    """"system": the C library as it is."""
    reason: str
    mmap_threshold: int | None = None
    """Bytes, where gputrain fixes glibc's threshold."""

    def describe(self) -> str:
        """`glibc mmap threshold 128 KiB (a job that shards its parameters on the CPU side: ...)`."""
        what = {
            "glibc-mmap-threshold": f"glibc mmap threshold {(self.mmap_threshold or 0) >> 10} KiB",
            "jemalloc": "jemalloc",
            "tcmalloc": "tcmalloc",
            "system": "the C library's malloc, untouched by gputrain",
        }[self.name]
        return f"{what} ({self.reason})"

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "mmap_threshold": self.mmap_threshold, "reason": self.reason}


def _raw_setting(env: Mapping[str, str]) -> str:
    return env.get(ALLOCATOR_ENV, "").strip().lower() or "auto"


def check_setting(value: str) -> Setting:
    """A GPUTRAIN_ALLOCATOR value (lowercased) as a Setting.

    Raises:
        UsageError: a value that is not one of CHOICES, naming them.
    """
    if value not in CHOICES:
        raise UsageError(
            f"{ALLOCATOR_ENV}={value!r}: must be one of {', '.join(CHOICES)} "
            "(auto: a fixed glibc mmap threshold for the ranks of a job that shards its parameters "
            "on the CPU side; off: the C library as it is)"
        )
    return value  # type: ignore[return-value]  # one of CHOICES, checked above


def libc_name() -> str | None:
    """ "glibc 2.36", or None where the C library is not glibc (musl, macOS) or cannot be told."""
    try:
        found = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):  # no such name outside glibc
        return None
    return found if found and found.startswith("glibc") else None


def _tunables(value: str) -> dict[str, str]:
    """GLIBC_TUNABLES "name=value:name=value" as a dict (malformed parts are skipped, as glibc does)."""
    pairs = (part.split("=", 1) for part in value.split(":") if "=" in part)
    return {name.strip(): val.strip() for name, val in pairs}


def users_setting(env: Mapping[str, str]) -> str | None:
    """The user's own malloc setting in `env`, or None: a threshold in GLIBC_TUNABLES (other than the
    one gputrain's launcher put there) or in glibc's MALLOC_*_ variables, or a malloc preloaded."""
    tunables = env.get("GLIBC_TUNABLES", "")
    if tunables and tunables != env.get(LAUNCHER_TUNABLE_ENV):
        mine = _tunables(tunables)
        named = [f"{name}={mine[name]}" for name in _TUNABLES if name in mine]
        if named:
            return "GLIBC_TUNABLES=" + ":".join(named)
    for name in _MALLOC_ENV:
        if env.get(name, "").strip():
            return f"{name}={env[name].strip()}"
    preloaded = preloaded_malloc(env)
    return f"LD_PRELOAD={preloaded}" if preloaded else None


def preloaded_malloc(env: Mapping[str, str]) -> str | None:
    """The entry of LD_PRELOAD that is a malloc (jemalloc, tcmalloc, mimalloc), or None."""
    for entry in env.get("LD_PRELOAD", "").replace(" ", ":").split(":"):
        if any(key in Path(entry).name for key in _PRELOADS):
            return entry
    return None


def collect_allocator_facts(env: Mapping[str, str] | None = None) -> AllocatorFacts:
    """The facts `choose_allocator` reads, from `env` (default: this process's) and this machine."""
    env = os.environ if env is None else env
    setting = _raw_setting(env)
    found = find_malloc(setting) if setting in ("jemalloc", "tcmalloc") else None
    return AllocatorFacts(libc_name(), setting, users_setting(env), _by_launcher(env), found, env.get(CUDA_ALLOC_ENV))


def _by_launcher(env: Mapping[str, str]) -> bool:
    tunables = env.get("GLIBC_TUNABLES", "")
    return bool(tunables) and tunables == env.get(LAUNCHER_TUNABLE_ENV)


def host_shards(fsdp: bool, device_type: str, cpu_offload: bool) -> bool:
    """Whether a rank's resolved layout gathers and frees parameter blocks in host memory every step,
    the churn the fixed threshold repays (`fsdp`: FSDP's unshard/reshard runs, ParallelDims.fsdp_enabled:
    fsdp, HSDP, and the replicas of TP or PP, which FSDP holds).

    On CPU ranks the gathers are host memory. On GPUs they are the caching allocator's, except with
    parallel.cpu_offload: the shards, their gradients and the optimizer's step (its shard-size
    temporaries) live in host memory. DDP replicates once and frees nothing per step; TP splits its
    parameters once and never gathers them (its collectives are activation-size); PP keeps each
    stage whole: none of them churns the heap with blocks, so none pays for an mmap per tensor.
    """
    return fsdp and (device_type == "cpu" or cpu_offload)


SHARDED = "a job that shards its parameters on the CPU side: freed shards go back to the OS"


def choose_allocator(facts: AllocatorFacts, shards: bool) -> AllocatorChoice:
    """The setting a process runs with (the order in the module docstring); `shards`: its job gathers
    parameter shards in host memory (`host_shards`; False before the layout is known).

    Raises:
        UsageError: GPUTRAIN_ALLOCATOR is not a choice, or names a malloc not preloaded here.
    """
    setting = check_setting(facts.setting)
    if setting == "off":
        return AllocatorChoice("system", f"{ALLOCATOR_ENV}=off")
    if facts.user_setting is not None:
        preloaded = next((name for name in ("jemalloc", "tcmalloc") if name in facts.user_setting), None)
        if preloaded is not None:
            return AllocatorChoice(preloaded, facts.user_setting)  # type: ignore[arg-type]  # a Literal name
        return AllocatorChoice("system", f"your own setting: {facts.user_setting}")
    if setting in ("jemalloc", "tcmalloc"):
        # reached only where it is not preloaded (a preload is the user's setting above)
        raise UsageError(
            f"{ALLOCATOR_ENV}={setting}: {setting} is not preloaded in this process; "
            f"`gputrain train --nproc-per-node N` preloads it into the ranks it starts, or start the "
            f"process with LD_PRELOAD=<path of lib{setting}.so>"
        )
    if facts.libc is None:
        return AllocatorChoice("system", "not glibc: its malloc has no mmap threshold to fix")
    since = "; from the process's start (the launcher's GLIBC_TUNABLES)" if facts.by_launcher else ""
    if setting == "glibc" or facts.by_launcher:  # the launcher's tunables are in force whatever the job
        return AllocatorChoice("glibc-mmap-threshold", f"{ALLOCATOR_ENV}=glibc{since}", MMAP_THRESHOLD)
    if shards:
        return AllocatorChoice("glibc-mmap-threshold", SHARDED, MMAP_THRESHOLD)
    return AllocatorChoice(
        "system",
        f"no parameter shards gathered on the CPU side (DDP, TP, PP, FSDP on GPUs, one process); "
        f"{ALLOCATOR_ENV}=glibc fixes the threshold here too",
    )


def set_mmap_threshold(threshold: int) -> bool:
    """Fix glibc's mmap threshold (which turns its dynamic rise off) and its trim threshold, in this
    process; False where mallopt is missing or refused."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, threshold)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


_applied: AllocatorChoice | None = None
"""What `apply_allocator` chose in this process, for env.json."""


def apply_allocator(shards: bool = False) -> AllocatorChoice:
    """Choose this process's allocator setting and put it in force: the glibc thresholds through
    mallopt (freed blocks go back from then on), and on a CUDA build expandable segments where CUDA
    has not started. Called as a process joins its job (`shards` False: what needs no layout, off,
    glibc, the user's, CUDA's), and again by a training rank once its strategy is resolved, before
    the model is materialised (`shards`: `host_shards` of that layout). The later call wins.

    Raises:
        UsageError: GPUTRAIN_ALLOCATOR is not a choice, or names a malloc this process lacks.
    """
    global _applied
    choice = choose_allocator(collect_allocator_facts(), shards)
    if choice.name == "glibc-mmap-threshold" and not set_mmap_threshold(choice.mmap_threshold or MMAP_THRESHOLD):
        choice = AllocatorChoice("system", "glibc refused mallopt")
    set_cuda_alloc_conf(os.environ)
    _applied = choice
    return choice


def applied_allocator() -> AllocatorChoice | None:
    """The choice `apply_allocator` put in force in this process; None before (or never)."""
    return _applied


def set_cuda_alloc_conf(env: dict[str, str] | os._Environ[str]) -> bool:
    """PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True where the user set none, on a CUDA build
    whose CUDA has not started in this process (it reads the variable once, at its start)."""
    torch = sys.modules.get("torch")
    if CUDA_ALLOC_ENV in env or torch is None or not getattr(torch.version, "cuda", None):
        return False
    if getattr(torch.version, "hip", None) or torch.cuda.is_initialized():
        return False
    env[CUDA_ALLOC_ENV] = CUDA_ALLOC_SETTING
    return True


def find_malloc(name: str, dirs: list[Path] | None = None) -> str | None:
    """The path (or loader name) of lib<name>.so on this machine: `ctypes.util.find_library`'s, else
    the first lib<name>.so* in `dirs` (the usual library folders); None where there is none."""
    if dirs is None:
        found = ctypes.util.find_library(name)
        if found:
            return found
        dirs = [Path(p) for p in _LIB_DIRS]
    for folder in dirs:
        for candidate in sorted(folder.glob(f"lib{name}.so*")) if folder.is_dir() else []:
            if candidate.is_file():  # a folder of that name is no library
                return str(candidate)
    return None


def preload_path(facts: AllocatorFacts) -> str:
    """The library GPUTRAIN_ALLOCATOR (jemalloc or tcmalloc) names, for LD_PRELOAD.

    Raises:
        UsageError: this machine has none, naming the package to install.
    """
    if facts.found is None:
        package = "libjemalloc2" if facts.setting == "jemalloc" else "libtcmalloc-minimal4"
        raise UsageError(
            f"{ALLOCATOR_ENV}={facts.setting}: no lib{facts.setting}.so on this machine (install it, "
            f"e.g. apt install {package}), or unset {ALLOCATOR_ENV}"
        )
    return facts.found


def check_launch_setting(env: Mapping[str, str]) -> None:
    """GPUTRAIN_ALLOCATOR can be honoured in the ranks a launcher starts: a choice, and a malloc
    this machine has where it names one (checked with the launch options, before any rank starts).

    Raises:
        UsageError: naming GPUTRAIN_ALLOCATOR and what would be right.
    """
    facts = collect_allocator_facts(env)
    if check_setting(facts.setting) in ("jemalloc", "tcmalloc") and facts.user_setting is None:
        preload_path(facts)


def launched_rank_choice(facts: AllocatorFacts, shards: bool) -> AllocatorChoice:
    """What a rank that `gputrain train --nproc-per-node` starts runs with, seen from the launcher
    (it preloads the malloc GPUTRAIN_ALLOCATOR names): for doctor.

    Raises:
        UsageError: as `choose_allocator`, and a malloc this machine lacks.
    """
    setting = check_setting(facts.setting)
    if setting in ("jemalloc", "tcmalloc") and facts.user_setting is None:
        return AllocatorChoice(setting, f"{ALLOCATOR_ENV}={setting}: preloaded into the ranks ({preload_path(facts)})")
    return choose_allocator(facts, shards)


def rank_environment(env: Mapping[str, str], cuda_build: bool) -> dict[str, str]:
    """What the launcher adds to the environment of the ranks it starts: the glibc thresholds in
    GLIBC_TUNABLES where GPUTRAIN_ALLOCATOR=glibc asks for them in every process (in force from the
    rank's first allocation), or the malloc GPUTRAIN_ALLOCATOR names in LD_PRELOAD;
    PYTORCH_CUDA_ALLOC_CONF on a CUDA build. Nothing the user set is replaced. Under auto it adds no
    threshold: the launcher cannot know the strategy each rank resolves (parallel.strategy=auto), and
    the rank's own mallopt, once it has, comes before the first gather.

    Raises:
        UsageError: GPUTRAIN_ALLOCATOR is not a choice, or names a malloc this machine lacks.
    """
    added: dict[str, str] = {}
    facts = collect_allocator_facts(env)
    setting = check_setting(facts.setting)
    if cuda_build and CUDA_ALLOC_ENV not in env:
        added[CUDA_ALLOC_ENV] = CUDA_ALLOC_SETTING
    if setting == "off" or facts.user_setting is not None or facts.by_launcher:
        return added  # left as it is, or set already (a launcher started from a rank)
    if setting in ("jemalloc", "tcmalloc"):
        added["LD_PRELOAD"] = ":".join(filter(None, [preload_path(facts), env.get("LD_PRELOAD", "")]))
        return added
    if setting != "glibc" or facts.libc is None:  # auto: each rank's mallopt, once its layout is known
        return added
    mine = f"{_TUNABLES[0]}={MMAP_THRESHOLD}:{_TUNABLES[1]}={TRIM_THRESHOLD}"
    tunables = ":".join(filter(None, [env.get("GLIBC_TUNABLES", "").strip(":"), mine]))
    added["GLIBC_TUNABLES"] = added[LAUNCHER_TUNABLE_ENV] = tunables
    return added
