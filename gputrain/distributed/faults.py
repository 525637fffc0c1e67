"""A test-only fault: make one rank die or raise at a chosen training forward pass, to test failure handling.

Off unless GPUTRAIN_TEST_FAULT is set, and then only a forward pre-hook is added (nothing in the
step itself). Format: "rank=1,forward=5,action=exit|raise|stop[,once=/path/marker]". `exit` ends the
process at once (as a kill would); `raise` raises an exception inside the forward; `stop`
freezes the process (SIGSTOP) mid-training, for a test to act while it is held (kill its parent,
then SIGCONT). With `once`,
the fault fires only while the marker file does not exist (it is created first), so a restarted
job runs through.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from torch import nn

ENV = "GPUTRAIN_TEST_FAULT"


def install_test_fault(model: nn.Module, rank: int) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    fields = dict(item.split("=", 1) for item in spec.split(","))
    if int(fields["rank"]) != rank:
        return
    at, action, once = int(fields["forward"]), fields.get("action", "exit"), fields.get("once")
    calls = 0

    def hook(module: nn.Module, args: object) -> None:
        nonlocal calls
        if not module.training:  # evaluation passes (and the checks before training) do not count
            return
        calls += 1
        if calls != at:
            return
        if once is not None:
            marker = Path(once)
            if marker.exists():
                return
            marker.touch()
        if action == "exit":
            os._exit(17)
        if action == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
            return
        raise RuntimeError(f"test fault injected at forward {at}")

    model.register_forward_pre_hook(hook)
