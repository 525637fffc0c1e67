"""How a run's training ended, kept in the checkpoint taken at its end.

The end of a run is a sequence: the last steps, the last validation, the end's checkpoint, the test
evaluation, the final weights (model.safetensors), summary.json. The end's checkpoint is the commit
of the training: it records that the training had ended there (completed or stopped early, why, and
the last validation's metrics). A resume from it trains nothing and validates nothing again: it goes
on with what follows, the test evaluation and the final save, so a run stopped (or killed) anywhere
after that checkpoint ends exactly as the run that was never stopped. Saved under state.pt's
"ended" (RunShell's `states`); a checkpoint taken before the end holds {} there.
"""

from __future__ import annotations

from typing import Any

ENDINGS = ("completed", "stopped_early")
"""The ways training ends that go on to the test evaluation and the final save (train.max_time's
timed_out continues training when it is raised: not an end)."""


class TrainingEnded:
    """The run's end, as the checkpoint at the end holds it; `status` None while training goes on."""

    def __init__(self) -> None:
        self.status: str | None = None
        self.reason: str | None = None
        """Why the run stopped early (summary.json's stop_reason)."""
        self.val: dict[str, float] = {}
        """The last validation's metrics (summary.json's "val"), not evaluated again on a resume."""
        self.total = 0
        """The steps the run trained to: a run continued to train longer (a raised train.epochs)
        has not ended at this checkpoint."""

    def mark(self, status: str | None, reason: str | None, val: dict[str, float], total: int) -> None:
        """Training ends here (before the end's checkpoint is taken); None: it has not (yet)."""
        self.status, self.reason, self.val, self.total = status, reason, dict(val), total

    def at(self, total: int) -> str | None:
        """How training ended, where a run that trains to `total` steps has ended here; else None."""
        return self.status if self.total == total else None

    def state_dict(self) -> dict[str, Any]:
        if self.status is None:
            return {}
        return {"status": self.status, "reason": self.reason, "val": dict(self.val), "total": self.total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """From a checkpoint. What is not an end as `state_dict` writes it (a checkpoint before the
        end, or one older than this record) is no end: the resume trains on, as it always did."""
        status, reason, val, total = (state.get(k) for k in ("status", "reason", "val", "total"))
        plain = isinstance(val, dict) and all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) for k, v in val.items()
        )
        if status in ENDINGS and (reason is None or isinstance(reason, str)) and plain and _count(total):
            assert isinstance(val, dict) and isinstance(total, int)  # what `plain` and `_count` said
            self.mark(status, reason, val, total)
        else:
            self.mark(None, None, {}, 0)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
