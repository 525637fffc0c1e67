"""Microbenchmarks of the machine: matmul per dtype, conv2d, memory, transfers, all-reduce.

Figures are cached per machine (`bench.cache`) so training can report MFU against the measured
peak as well as the datasheet peak (`gputrain.env.peaks`).
"""

from __future__ import annotations

from gputrain.bench.cache import load_cached_peak, machine_key

__all__ = ["load_cached_peak", "machine_key"]
