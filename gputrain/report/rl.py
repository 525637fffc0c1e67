"""What a `gputrain rl` run has in place of a supervised run's figures: its environment, the
environment steps and episodes it ran, the return it reached, and environment steps per second.
Its curves (returns and the PPO figures) are curves.py's `rl_figures`; it has no test split."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gputrain.report.rundir import Run

LOSS_TITLE = "PPO loss (policy − ent_coef·entropy + vf_coef·value)"
"""What an RL run logs as its loss (rl/trainer.py): the combined objective each minibatch minimises."""


def rl_facts(run: Run) -> dict[str, Any]:
    """summary.json's rl section once the run has ended; before (still going), the same figures
    from its logged rows: env steps and the return so far, episodes summed over the rows."""
    summary = (run.summary or {}).get("rl")
    if isinstance(summary, dict) and run.status != "running":
        return summary
    episodes = run.steps.get("episodes")
    return {
        "env": (run.config or {}).get("rl", {}).get("env"),
        "env_steps": run.steps.last("env_steps"),
        "env_steps_per_s": run.steps.last("env_steps_per_s"),
        "episodes": float(np.nansum(episodes)) if episodes is not None else None,
        "episodic_return": run.steps.last("return_last_100"),
        "solved": None,
    }


def _count(value: Any) -> str:
    return f"{value:,.0f}" if isinstance(value, (int, float)) and math.isfinite(value) else "–"


def rl_tiles(run: Run) -> list[tuple[str, str]]:
    """The header's tiles of an RL run, after the ones every run has."""
    facts = rl_facts(run)
    value = facts.get("episodic_return")
    tiles = [
        ("environment", str(facts.get("env") or "–")),
        ("env steps", _count(facts.get("env_steps"))),
        ("episodes", _count(facts.get("episodes"))),
        ("return (last 100 episodes)", f"{value:.2f}" if isinstance(value, (int, float)) else "–"),
        ("env steps/s", _count(facts.get("env_steps_per_s"))),
    ]
    if facts.get("solved") is not None:
        tiles.append(("rl.stop_at_return", "reached" if facts["solved"] else "not reached"))
    return tiles


def rl_stop_reason(run: Run) -> str:
    """Why an RL run stopped early: its return reached rl.stop_at_return (it has no validation metric)."""
    target = (run.config or {}).get("rl", {}).get("stop_at_return")
    return f"the mean return of the last 100 episodes reached rl.stop_at_return = {target}"
