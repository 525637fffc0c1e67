"""Silences the log lines of other libraries that are known to be harmless, one by one, by logger and
message: never a logger, a library or a category whole. Installed when gputrain is imported (it
imports only `logging`), before any of those libraries loads.

- torchao, imported by transformers when it builds a model, tries to load its CUDA kernels
  (`_C_mxfp8…so`, `_C_cutlass_90a…so`) and logs "Failed to load …" for each; with a CPU build of
  torch they can never load, and nothing gputrain runs uses them (float8 training is
  torchao.float8, pure PyTorch). With a CUDA torch the line stays: there it may mean a mismatch.
- torch's pytree registry logs that registering an Enum as a constant "is deprecated" each time
  torchao registers one of its own: torchao's to change, nothing a user can do.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable


def _cpu_torch() -> bool:
    import torch  # by the time a record is logged, torch is loaded

    return torch.version.cuda is None and getattr(torch.version, "hip", None) is None


class _Known(logging.Filter):
    """Drops a record of its logger whose message matches `pattern` (and `when()` holds)."""

    def __init__(self, pattern: str, when: Callable[[], bool] | None = None) -> None:
        super().__init__()
        self.pattern = re.compile(pattern)
        self.when = when

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.pattern.search(record.getMessage()):
            return True
        return self.when is not None and not self.when()


KNOWN = {
    "torchao": _Known(r"^Failed to load \S*/torchao/_C_\S*\.so\b", _cpu_torch),
    "torch.utils._pytree": _Known(r"is an Enum subclass and is now natively supported by torch\.compile"),
}
"""Logger name → the filter of its known-harmless records."""


def install() -> None:
    """Adds each filter to its logger, once (importing gputrain twice adds nothing)."""
    for name, known in KNOWN.items():
        logger = logging.getLogger(name)
        if known not in logger.filters:
            logger.addFilter(known)
