"""The limits of the config's values, and the one check that applies them.

`check_values`, which every section's `__post_init__` (schema.py) runs first: every number is finite
and inside the `Range` that `LIMITS` declares for its field (a number field without one is a
programming error), and every string is printable UTF-8 text of bounded length, so nothing that
torch, numpy or the TOML file of the run directory cannot take gets past the config.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

from gputrain.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Range:
    """The numbers a field (or each item of a list field) accepts: low..high, either end open."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False
    why: str = ""
    """What sets `high` (said when a value exceeds it)."""
    text: str = ""
    """The accepted range in words, said instead of the end that was crossed."""

    def problem(self, value: float) -> str | None:
        """None when `value` is inside, else what is wrong (for a ConfigError)."""
        below = value < self.low or (self.low_open and value == self.low)
        above = value > self.high or (self.high_open and value == self.high)
        if not (below or above):
            return None
        if self.text:
            return f"must be {self.text}"
        if below:
            return f"must be {'>' if self.low_open else '>='} {_number(self.low)}"
        bound = f"must be < {_number(self.high)}" if self.high_open else f"must be at most {_number(self.high)}"
        return f"{bound} ({self.why})" if self.why else bound

    def describe(self, integer: bool) -> str:
        """The range as `config show` prints it: 1..64, [0, 1000], (0, 1)."""
        if self.text:
            return self.text.removeprefix("in ")
        if integer:
            return f"{int(self.low) + self.low_open}..{int(self.high) - self.high_open}"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"{left}{_number(self.low)}, {_number(self.high)}{right}"


def _number(x: float) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e16:
        return str(int(x))
    return f"{x:g}" if isinstance(x, float) else str(x)


def _positive(high: float, why: str = "") -> Range:
    return Range(0, high, low_open=True, why=why)


def _non_negative(high: float, why: str = "") -> Range:
    return Range(0, high, why=why)


COUNT_MAX = 2**31 - 1
"""Counts (epochs, steps, samples): int32's range, so a product of two (steps × batch) fits int64."""
BATCH_MAX = 1 << 24
"""Samples in one step: 16.7M, far beyond any batch that fits a device."""
WIDTH_MAX = 1 << 16
"""Channels or features of one layer (65536)."""
DEPTH_MAX = 1024
"""Transformer blocks or attention heads."""
CONTEXT_MAX = 1 << 20
"""Tokens per sequence (1M)."""
VOCAB_MAX = 1 << 22
"""Token ids or classes (4M): rows of an embedding or a classifier head."""
SEED_MAX = 2**32 - 1
"""numpy's seeding takes 0..2**32-1 (torch.manual_seed takes more, and derives per-epoch seeds from it)."""
RANKS_MAX = 1 << 20
ENVS_MAX = 1 << 20
"""RL environments stepped together (1M): far beyond what PPO runs use, and each holds its rollout."""
LR_MAX = 1e3
CLIP_MAX = 1e6
TIMEOUT_MAX_S = 7 * 24 * 3600.0
DURATION_MAX_S = 365 * 24 * 3600.0
"""A year: longer than any job a time limit is set for (train.max_time)."""
DURATION_FORMS = "seconds > 0, or a duration such as 45s, 90m, 2h, 1d or 1h30m"
TEXT_MAX = 4096
"""Characters of one string value (PATH_MAX on Linux)."""
LIST_MAX = 1024
"""Items of one list value."""

_WIDTH = _positive(WIDTH_MAX, "widths beyond this cannot be allocated")
_FRACTION = Range(0, 1, high_open=True, text="a fraction in [0, 1)")
RANK_DEGREE = Range(-1, RANKS_MAX, text=f"1..{RANKS_MAX}, or -1 for the remaining ranks")

LIMITS: dict[str, Range] = {
    # model
    "model.dropout": Range(0, 1, high_open=True, text="in [0, 1)"),
    "model.hidden_sizes": _WIDTH,
    "model.channels": _WIDTH,
    "model.hidden": _WIDTH,
    "model.base_width": _WIDTH,
    "model.n_layer": _positive(DEPTH_MAX),
    "model.n_head": _positive(DEPTH_MAX),
    "model.d_model": _WIDTH,
    "model.seq_len": _positive(CONTEXT_MAX),
    "model.vocab_size": _positive(VOCAB_MAX),
    # data
    "data.val_fraction": _FRACTION,
    "data.test_fraction": _FRACTION,
    "data.num_workers": _non_negative(1024),
    "data.seq_len": _positive(CONTEXT_MAX),
    "data.image_size": _positive(1 << 14, "pixels per side"),
    "data.max_eval_samples": _positive(COUNT_MAX),
    "data.shape": _positive(1 << 24),
    "data.num_samples": _positive(COUNT_MAX),
    "data.num_classes": _positive(VOCAB_MAX),
    "data.vocab_size": _positive(VOCAB_MAX),
    # train
    "train.epochs": _positive(COUNT_MAX),
    "train.max_steps": _positive(COUNT_MAX),
    "train.batch_size": _positive(BATCH_MAX),
    "train.grad_accum": _positive(BATCH_MAX),
    "train.micro_batch_size": _positive(BATCH_MAX),
    "train.clip_grad_norm": _positive(CLIP_MAX),
    "train.clip_grad_value": _positive(CLIP_MAX),
    "train.seed": _non_negative(SEED_MAX, "numpy seeds are 32-bit"),
    "train.num_threads": _positive(4096, "threads of one process"),
    "train.limit_batches": _positive(COUNT_MAX),
    "train.smoke_steps": _positive(COUNT_MAX),
    "train.max_time": Range(0, DURATION_MAX_S, low_open=True, text=DURATION_FORMS + ", at most a year"),
    # optim
    "optim.lr": _positive(LR_MAX),
    "optim.weight_decay": _non_negative(LR_MAX),
    "optim.momentum": Range(0, 1, high_open=True, text="in [0, 1)"),
    "optim.betas": Range(0, 1, high_open=True, text="two numbers in [0, 1), e.g. [0.9, 0.999]"),
    "optim.eps": _positive(1.0),
    "optim.warmup_steps": _non_negative(COUNT_MAX),
    "optim.step_size": _positive(COUNT_MAX),
    "optim.gamma": _positive(1.0, "a decay factor"),
    "optim.milestones": Range(0, COUNT_MAX, low_open=True, text="increasing positive step numbers"),
    "optim.min_lr": _non_negative(LR_MAX),
    "optim.base_batch_size": _positive(BATCH_MAX),
    # eval, checkpoint, log
    "eval.every_epochs": _non_negative(COUNT_MAX),
    "eval.patience": _positive(COUNT_MAX),
    "eval.every_steps": _non_negative(COUNT_MAX),
    "eval.max_batches": _positive(COUNT_MAX),
    "checkpoint.every_steps": _non_negative(COUNT_MAX),
    "checkpoint.every_epochs": _non_negative(COUNT_MAX),
    "checkpoint.keep_last": _positive(COUNT_MAX),
    "checkpoint.max_overhead": Range(0.0, 1.0, high_open=True, text="0 (save every time) up to below 1"),
    "log.every_steps": _positive(COUNT_MAX),
    "log.breakdown_every": _non_negative(COUNT_MAX),
    # parallel
    "parallel.dp_replicate": RANK_DEGREE,
    "parallel.dp_shard": RANK_DEGREE,
    "parallel.tp": RANK_DEGREE,
    "parallel.pp": RANK_DEGREE,
    "parallel.timeout_s": _positive(TIMEOUT_MAX_S, "a week"),
    # rl
    "rl.num_envs": _positive(ENVS_MAX, "environments stepped together; GPU simulators step thousands"),
    "rl.num_steps": _positive(CONTEXT_MAX),
    "rl.total_timesteps": _positive(1 << 40, "a trillion environment steps"),
    "rl.hidden_sizes": _WIDTH,
    "rl.gamma": Range(0, 1, text="in [0, 1]"),
    "rl.gae_lambda": Range(0, 1, text="in [0, 1]"),
    "rl.num_minibatches": _positive(BATCH_MAX),
    "rl.update_epochs": _positive(10_000),
    "rl.clip_coef": _positive(CLIP_MAX),
    "rl.ent_coef": _non_negative(CLIP_MAX),
    "rl.vf_coef": _non_negative(CLIP_MAX),
    "rl.target_kl": _positive(CLIP_MAX),
    "rl.clip_obs": _positive(CLIP_MAX),
    "rl.clip_reward": _positive(CLIP_MAX),
    "rl.max_episode_steps": _positive(COUNT_MAX),
    "rl.stop_at_return": Range(-1e12, 1e12),
}
"""The Range of every number field, `section.key` -> Range (for a list field: of each item)."""

# C0 and C1 control characters (Unicode category Cc) and lone surrogates: the first break the
# one-line messages and the run directory's config.toml, the second are bytes that were not UTF-8
# (Python's surrogateescape) and cannot be written to any UTF-8 file.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _text_problem(text: str) -> str | None:
    if len(text) > TEXT_MAX:
        return f"is {len(text)} characters long; at most {TEXT_MAX}"
    bad = _CONTROL.search(text)
    if bad:
        return f"contains the control character U+{ord(bad.group()):04X}; config strings must be printable text"
    bad = _SURROGATE.search(text)
    if bad:
        return "contains bytes that are not UTF-8; config strings must be UTF-8 text"
    return None


def _item_problem(key: str, item: Any) -> str | None:
    if item is None or isinstance(item, bool):
        return None
    if isinstance(item, str):
        return _text_problem(item)
    if isinstance(item, float) and not math.isfinite(item):
        return "must be a finite number"
    if isinstance(item, (int, float)):
        if key not in LIMITS:
            raise TypeError(f"{key} is a number field without a Range in gputrain.config.limits.LIMITS")
        return LIMITS[key].problem(item)
    return None


def shown_value(value: Any) -> Any:
    """The value as the error message shows it: long text cut, huge numbers and lists left out."""
    if isinstance(value, str) and len(value) > 80:
        return value[:80] + "…"
    if isinstance(value, int) and value.bit_length() > 64:
        return None
    if isinstance(value, list) and (len(value) > 16 or any(shown_value(v) is not v for v in value)):
        return None
    return value


def check_values(section: str, values: Any) -> None:
    """Check every field of one section's dataclass by its value's kind (see the module docstring).

    Raises:
        ConfigError: naming `section.field` and what is wrong.
    """
    for f in dataclasses.fields(values):
        key = f"{section}.{f.name}"
        value = getattr(values, f.name)
        items = value if isinstance(value, list) else [value]
        if len(items) > LIST_MAX:
            raise ConfigError(key, f"has {len(items)} items; at most {LIST_MAX}")
        for item in items:
            problem = _item_problem(key, item)
            if problem:
                raise ConfigError(key, problem, shown_value(value))
