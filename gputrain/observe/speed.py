"""The speed report of a run: FLOPs per step, achieved FLOP/s, MFU and the time breakdown.

One `SpeedMeter` per run. The loop wraps the first optimizer step in `step_context()` (that step
is the one whose FLOPs are counted) and asks for `record_fields` on logging steps and
`summary_fields` at the end; everything here is host arithmetic on numbers the loop already has.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from gputrain.bench.cache import device_name, load_cached
from gputrain.observe.breakdown import CATEGORIES, StepTimer
from gputrain.observe.flops import StepFlopCounter, gpt_dims, gpt_flops_per_token
from gputrain.observe.peak import resolve_peak
from gputrain.observe.rank_memory import RankMemory, host_peak_rss_bytes

_NO_COUNT = contextlib.nullcontext()
log = logging.getLogger("gputrain")
_mfu_hint_given = False


SPEED_FIELDS = (
    "flops_per_step",
    "achieved_flops",
    "mfu",
    "mfu_peak_source",
    "flops_per_step_formula",
    "mfu_formula",
    "host_peak_rss_bytes",
    "time_breakdown",
    "time_breakdown_s",
    "time_breakdown_steps",
)
"""The keys `SpeedMeter.summary_fields` gives summary.json's "train" section (null where a run failed
before it had a meter)."""


def _fraction(rate: float | None, peak: float | None) -> float | None:
    """rate / peak as MFU, or None: without both, or above 1, which no hardware does (a peak
    measured under load, or on other hardware: `summary_fields` says so)."""
    if not rate or not peak or rate > peak:
        return None
    return rate / peak


class SpeedMeter:
    """Args:
    model: the unwrapped model (for the GPT formula).
    device, precision: what the peak is looked up for.
    world_size: ranks sharing each optimizer step (one rank's FLOPs × world_size = the step's).
    global_batch: samples per optimizer step; seq_len: tokens per sample for language models (the
        GPT formula is given for those alone), else None.
    breakdown_every: time every N-th step (0: never).
    count_flops: False where the counter cannot run (pipeline schedules call autograd.grad,
        which rejects the counter's module hooks); the FLOP figures are then null.
    comm_timed: the step times data-parallel gradient communication apart (breakdown.py); on
        several ranks without it, comm is reported as null (not measured), not as 0.
    rank: this process's rank among `world_size` (its slot in every rank's peak memory).
    """

    def __init__(
        self,
        model: nn.Module,
        device: torch.device,
        precision: str,
        world_size: int,
        global_batch: int,
        seq_len: int | None,
        breakdown_every: int,
        count_flops: bool = True,
        comm_timed: bool = False,
        rank: int = 0,
    ) -> None:
        self.device = device
        self.memory = RankMemory(device, rank, world_size)
        """Every rank's peak memory: gathered on logging steps (train/metrics.py) and at the end."""
        self.comm_timed = comm_timed
        self.precision = precision
        self.world_size = world_size
        self.timer = StepTimer(device, breakdown_every)
        self._counter = StepFlopCounter()
        self._counted = not count_flops
        self._peak: tuple[float | None, str | None] | None = None
        # the formula counts a language model's tokens: without the data's tokens per sample (a
        # classifier, or a task not told) there is none, rather than one at the model's context length
        dims = gpt_dims(model, seq_len) if seq_len else None
        self.formula_flops_per_step: float | None = None
        if dims is not None:
            per_token = gpt_flops_per_token(dims.n_params, dims.n_layer, dims.n_head, dims.head_dim, dims.seq_len)
            self.formula_flops_per_step = float(per_token * global_batch * dims.seq_len)

    def step_context(self) -> contextlib.AbstractContextManager[None]:
        """Wrap each optimizer step: the first is counted, the rest get a no-op context."""
        if self._counted:
            return _NO_COUNT
        self._counted = True
        return self._counter.counting()

    @property
    def flops_per_step(self) -> float | None:
        """FLOPs of one optimizer step over all ranks (None until counted, or if counting failed)."""
        if self._counter.total is None:
            return None
        return float(self._counter.total * self.world_size)

    def peak(self) -> tuple[float | None, str | None]:
        """(peak FLOP/s of the whole job, source); looked up once."""
        if self._peak is None:
            peak, source = resolve_peak(self.device, self.precision)
            self._peak = (peak * self.world_size if peak else None, source if peak else None)
        return self._peak

    def _rates(self, steps: int, seconds: float, prefix: str = "") -> dict[str, Any]:
        flops = self.flops_per_step
        peak, _ = self.peak()
        achieved = flops * steps / seconds if flops and steps and seconds > 0 else None
        fields: dict[str, Any] = {
            f"{prefix}achieved_flops": achieved,
            f"{prefix}mfu": _fraction(achieved, peak),
        }
        if self.formula_flops_per_step is not None and steps and seconds > 0:
            formula_rate = self.formula_flops_per_step * steps / seconds
            fields[f"{prefix}mfu_formula"] = _fraction(formula_rate, peak)
        return fields

    def _breakdown(self, values: Mapping[str, float] | None) -> Mapping[str, float | None] | None:
        if values is None or self.world_size == 1 or self.comm_timed:
            return values
        return {**values, "comm": None}  # TP/PP traffic is inside forward_backward, not measured apart

    def record_fields(self, steps: int, seconds: float) -> dict[str, Any]:
        """Speed figures for a metrics.jsonl row covering `steps` steps in `seconds`."""
        fields: dict[str, Any] = {"step_time_s": seconds / steps if steps else None}
        fields.update(self._rates(steps, seconds))
        fields.update(self.memory.row_fields())  # as gathered on this logging step, with the loss
        fractions = self._breakdown(self.timer.fractions())
        if fractions is not None:
            fields.update({f"time_{c}": fractions[c] for c in CATEGORIES})
        return fields

    def summary_fields(self, steps: int, seconds: float) -> dict[str, Any]:
        """The speed part of summary.json's "train" section."""
        peak, source = self.peak()
        rates = self._rates(steps, seconds)
        if peak and rates["achieved_flops"] and rates["achieved_flops"] > peak:
            # more than the hardware can do: the peak is stale, and a figure over 100% would mislead
            log.warning(
                "this run did %.3g FLOP/s, more than the %s peak of %.3g FLOP/s, so that peak is too low and MFU "
                "is not shown%s",
                rates["achieved_flops"],
                source,
                peak,
                " (it was measured on a busy machine? run `gputrain bench` again on an idle one)"
                if source is not None and source.startswith("bench")
                else "",
            )
            source = None
        global _mfu_hint_given
        if (
            rates["mfu"] is None
            and rates["achieved_flops"]
            and peak is None
            and self.device.type == "cpu"
            and not _mfu_hint_given
        ):
            _mfu_hint_given = True  # once per process: a program that trains many models hears it once
            quick_only = bool(load_cached(device_name(self.device)))  # a --quick bench sets no peak
            log.info(
                "MFU on a CPU needs a measured peak (CPUs have no datasheet figure): run `gputrain bench`%s once "
                "on this machine, on an idle moment; later runs report MFU against it",
                " (without --quick: its small matrices do not set the peak)" if quick_only else "",
            )
        return {
            "flops_per_step": self.flops_per_step,
            "achieved_flops": rates["achieved_flops"],
            "mfu": rates["mfu"],
            "mfu_peak_source": source if rates["mfu"] is not None else None,
            "flops_per_step_formula": self.formula_flops_per_step,
            "mfu_formula": rates.get("mfu_formula"),
            "host_peak_rss_bytes": host_peak_rss_bytes(),
            "time_breakdown": self._breakdown(self.timer.fractions()),
            "time_breakdown_s": self._breakdown(self.timer.mean_seconds()),
            "time_breakdown_steps": self.timer.steps_behind_mean,
        }
