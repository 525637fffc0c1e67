"""Split sizes of the default digits job, read from the data instead of restated in each test.

The sizes follow from scikit-learn's digits count and the configured data.val_fraction and
data.test_fraction; tests/unit/data/test_sources.py checks that they do.
"""

from __future__ import annotations

from functools import cache

from gputrain.config import load_config
from gputrain.data import build_data


@cache
def digits_split_sizes(seed: int = 0) -> tuple[int, int, int]:
    """(train, val, test) sample counts of the default digits job (`load_config(None)`)."""
    config = load_config(None)
    bundle = build_data(config.data, seed)
    return len(bundle.train), len(bundle.val or ()), len(bundle.test or ())


def digits_train_size() -> int:
    """Training samples of the default digits job."""
    return digits_split_sizes()[0]
