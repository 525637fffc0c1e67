"""What `gputrain tune` tries: every layout the memory plan says fits, crossed with the knobs that
change speed and not the optimisation.

The global batch is the config's: micro-batch × grad_accum × data-parallel ranks = train.batch_size,
so every candidate trains the same steps; grad_accum makes up what the micro-batch leaves. Per rank
count (1..--nproc-per-node; one process: strategy none, more: ddp and fsdp, the layouts that keep
every rank data-parallel) the candidates cross:

- the micro-batch: the largest `micro_batches` powers of two dividing the rank's share (and the
  share itself), tried smallest first, so a layout that fails at b is not tried at 2b (scheduler.py);
- activation checkpointing: the lightest mode the plan says fits at that micro-batch (recompute only
  costs time where memory is not short, as DeepSpeed's autotuner prunes by its memory estimate);
- threads per rank on a CPU (ranks × threads ≤ the cores this process may use): all the cores
  shared out, and half of that;
- torch.compile on and off; CUDA graphs where the layout allows them (CUDA, none or ddp);
- data.num_workers for data read through a loader (none for in-memory tensors): 0 and a few.

A combination the plan says does not fit, or a rank count the batch does not divide over, is a
`Pruned` row with why. No torch here: the plan's answers come in as a function (`Space.fits`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

AUTO = "auto"
"""The candidate that is the config as given with parallel.strategy=auto: the baseline."""
AC_ORDER = ("none", "selective", "full")
MICRO_BATCHES = 3
"""Micro-batch sizes tried per layout (DeepSpeed's autotuner tries 3 by default too)."""
LOADER_WORKERS_MAX = 4


@dataclass(frozen=True, slots=True)
class Candidate:
    """One layout and its knobs; `strategy` AUTO: the config's own settings, auto's layout."""

    ranks: int
    strategy: str
    micro_batch: int | None = None
    grad_accum: int | None = None
    activation_checkpointing: str = "none"
    threads: int | None = None
    """CPU intra-op threads per rank; None: the config's (auto)."""
    compile: bool = False
    cuda_graphs: bool = False
    num_workers: int | None = None
    """data.num_workers; None: the config's (data not read through a loader)."""

    def overrides(self) -> list[str]:
        """The config overrides that set this layout (`gputrain train` takes them as given)."""
        if self.strategy == AUTO:
            return ["parallel.strategy=auto"]
        out = [
            f"parallel.strategy={self.strategy}",
            f"parallel.activation_checkpointing={self.activation_checkpointing}",
            f"train.micro_batch_size={self.micro_batch}",
            "train.grad_accum=auto",  # the batch ÷ (micro-batch × data-parallel ranks), as each rank counts them
            f"train.compile={str(self.compile).lower()}",
            f"train.cuda_graphs={str(self.cuda_graphs).lower()}",
        ]
        if self.threads is not None:
            out.append(f"train.num_threads={self.threads}")
        if self.num_workers is not None:
            out.append(f"data.num_workers={self.num_workers}")
        return out

    def label(self) -> str:
        """One short line: 'ddp ×2 1t mb16×2 ac=none compile'."""
        if self.strategy == AUTO:
            return f"auto ×{self.ranks} (the config as given)"
        parts = [f"{self.strategy} ×{self.ranks}"]
        if self.threads is not None:
            parts.append(f"{self.threads}t")
        parts.append(f"mb{self.micro_batch}×{self.grad_accum}")
        if self.activation_checkpointing != "none":
            parts.append(f"ac={self.activation_checkpointing}")
        if self.num_workers is not None:
            parts.append(f"w{self.num_workers}")
        if self.compile:
            parts.append("compile")
        if self.cuda_graphs:
            parts.append("graphs")
        return " ".join(parts)

    def family(self) -> tuple[Any, ...]:
        """All but the micro-batch (and the accumulation that follows it, and the checkpointing that
        the micro-batch decides): a layout that fails at b fails at 2b."""
        return (self.ranks, self.strategy, self.threads, self.compile, self.cuda_graphs, self.num_workers)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Pruned:
    candidate: Candidate
    reason: str


Fits = Callable[[int, str, str, int, int], "str | None"]
"""(ranks, strategy, activation checkpointing, micro-batch, grad_accum) → None where the plan says it
fits, else why not, in a few words."""


@dataclass(slots=True)
class Space:
    batch_size: int
    max_ranks: int
    cores: int
    device_type: str
    fits: Fits
    loader_fed: bool = False
    micro_batches: int = MICRO_BATCHES
    compile: tuple[bool, ...] = (False, True)
    left_out: Callable[[int, str], str | None] = field(default=lambda ranks, strategy: None)
    """Why the model cannot take `strategy` on `ranks` (plan/feasible.py's row_problem); None: it can."""
    auto_threads: Callable[[int], int | None] = field(default=lambda ranks: None)
    """The threads `train.num_threads=auto` gives each of `ranks` ranks now (env/threads.py: the free
    cores): tried too, and first, as on a busy machine it is what runs fastest."""


def strategies_for(ranks: int) -> tuple[str, ...]:
    return ("none",) if ranks == 1 else ("ddp", "fsdp")


def micro_batches(share: int, count: int) -> list[int]:
    """The largest `count` of the powers of two dividing `share` and `share` itself, ascending."""
    sizes = {share}
    b = 1
    while b < share:
        if share % b == 0:
            sizes.add(b)
        b *= 2
    return sorted(sizes)[-count:] if count > 0 else []


def thread_counts(cores: int, ranks: int, device_type: str, auto: int | None = None) -> list[int | None]:
    """Threads per rank tried: on a CPU the cores shared out over the ranks, half that, and what
    auto gives now (within the share); on a GPU the config's (the host threads feed the device)."""
    if device_type != "cpu":
        return [None]
    share = max(1, cores // ranks)
    counts = {share, max(1, share // 2)} | ({min(auto, share)} if auto else set())
    return [*sorted(counts, reverse=True)]


def worker_counts(loader_fed: bool, cores: int, ranks: int) -> list[int | None]:
    if not loader_fed:
        return [None]
    spare = max(1, min(LOADER_WORKERS_MAX, cores // ranks))
    return [*sorted({0, spare})]


def rank_counts(space: Space) -> tuple[list[int], list[Pruned]]:
    """1..max_ranks where the batch divides over them and ranks ≤ cores on a CPU (gloo ranks beyond
    the cores only queue for them)."""
    kept, pruned = [], []
    for ranks in range(1, space.max_ranks + 1):
        why = None
        if space.batch_size % ranks:
            why = f"train.batch_size={space.batch_size} does not divide over {ranks} ranks"
        elif space.device_type == "cpu" and ranks > space.cores:
            why = f"{ranks} ranks on {space.cores} cores: each rank needs a core of its own"
        if why:
            pruned.append(Pruned(Candidate(ranks, strategies_for(ranks)[0]), why))
        else:
            kept.append(ranks)
    return kept, pruned


def generate(space: Space) -> tuple[list[Candidate], list[Pruned]]:
    """Every candidate to measure, in the order to measure them, and what the plan rules out.

    The order: without compile before with (compile costs a long first step); fewer ranks first;
    auto's thread count first, then more threads before fewer; and within one layout, the
    micro-batch ascending (the scheduler skips 2b where b failed)."""
    ranks_kept, pruned = rank_counts(space)
    out: list[Candidate] = []
    first_threads: dict[int, int | None] = {}
    for ranks in ranks_kept:
        share = space.batch_size // ranks
        auto = space.auto_threads(ranks) if space.device_type == "cpu" else None  # read once: it samples the load
        first_threads[ranks] = min(auto, max(1, space.cores // ranks)) if auto else None
        for strategy in strategies_for(ranks):
            problem = space.left_out(ranks, strategy)
            if problem is not None:
                pruned.append(Pruned(Candidate(ranks, strategy), f"the plan leaves it out: {problem}"))
                continue
            for micro in micro_batches(share, space.micro_batches):
                accum = share // micro
                ac, why = _lightest_fitting(space, ranks, strategy, micro, accum)
                if ac is None:
                    pruned.append(Pruned(Candidate(ranks, strategy, micro, accum, "full"), why or "does not fit"))
                    continue
                for threads in thread_counts(space.cores, ranks, space.device_type, auto):
                    for workers in worker_counts(space.loader_fed, space.cores, ranks):
                        for compiled, graphs in _compile_modes(space, strategy):
                            out.append(Candidate(ranks, strategy, micro, accum, ac, threads, compiled, graphs, workers))
    out.sort(key=lambda c: _order(c, first_threads.get(c.ranks)))
    return out, pruned


def _lightest_fitting(space: Space, ranks: int, strategy: str, micro: int, accum: int) -> tuple[str | None, str | None]:
    why = None
    for ac in AC_ORDER:
        why = space.fits(ranks, strategy, ac, micro, accum)
        if why is None:
            return ac, None
    return None, f"the plan: does not fit even with full checkpointing ({why})"


def _compile_modes(space: Space, strategy: str) -> list[tuple[bool, bool]]:
    modes = [(c, False) for c in space.compile]
    if space.device_type == "cuda" and strategy in ("none", "ddp"):
        modes.append((False, True))  # CUDA graphs: torch.compile's reduce-overhead, one device or DDP
    return modes


def _order(c: Candidate, first_threads: int | None) -> tuple[Any, ...]:
    # auto's thread count first: the other counts are what a busy machine makes slowest
    not_auto = first_threads is not None and c.threads != first_threads
    return (
        c.compile or c.cuda_graphs,
        c.ranks,
        not_auto,
        -(c.threads or 0),
        c.strategy,
        c.num_workers or 0,
        c.micro_batch,
    )
