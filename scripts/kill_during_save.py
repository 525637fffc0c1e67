"""Figure 2 of docs/reliability.md: SIGKILL real runs at random moments inside checkpoint writes.

    python scripts/kill_during_save.py --trials 50 [--seed 0] [--delay 0.05] [--keep DIR]

Trials alternate synchronous and asynchronous (`checkpoint.async_save=true`) saving. Each phase of
a save is slowed by --delay seconds (the GPUTRAIN_TEST_SAVE_PHASE_DELAY_S test hook), the run is
killed at a random offset after a save has opened its temporary directory, and then:
  * every checkpoint at a final path (checkpoints/step-N) must verify; no model.safetensors or
    summary.json may exist (the run never finished);
  * the resumed run must start from the newest complete checkpoint, lose at most one checkpoint
    interval of steps (sync; async: at most two, the save in flight and the steps trained meanwhile),
    leave no temporary behind, and end bit-identical to an unbroken run.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.unit.reliability.chaos import (  # noqa: E402
    TINY, check_after_crash, compare_runs, kill_during_save, resumed_from, run_train,
)

EVERY = 4  # checkpoint.every_steps in TINY


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.05, help="seconds added to each of the 7 save phases")
    parser.add_argument("--keep", type=Path, help="keep the run directories here (default: a temporary folder)")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="gputrain-kill-save-"))
    reference = root / "reference"
    if run_train(reference, TINY) != 0:
        print(f"the reference run failed; see {reference.with_suffix('.log')}")
        return 1
    total = json.loads((reference / "summary.json").read_text())["global_step"]
    rng = random.Random(args.seed)
    passed, phases, worst_lost = 0, collections.Counter(), {"sync": 0, "async": 0}
    for trial in range(args.trials):
        mode = ("sync", "async")[trial % 2]
        overrides = TINY + [f"checkpoint.async_save={'true' if mode == 'async' else 'false'}"]
        run_dir = root / f"trial{trial:02d}-{mode}"
        left = kill_during_save(run_dir, overrides, rng.randint(1, total - 3), args.delay,
                                rng.uniform(0, 8 * args.delay))
        if left is None:
            print(f"trial {trial:2d} ({mode}): the run finished before it could be killed; not counted as a pass")
            continue
        problems, resume_from = check_after_crash(run_dir)
        resumed_step = int(resume_from.name[5:]) if resume_from else 0
        lost = left["killed_at_step"] - resumed_step
        worst_lost[mode] = max(worst_lost[mode], lost)
        if lost > (EVERY if mode == "sync" else 2 * EVERY):
            problems.append(f"lost {lost} steps")
        code = run_train(run_dir, overrides)
        if code != 0:
            problems.append(f"resume exited {code}")
        else:
            if resume_from is not None and not resumed_from(run_dir, resume_from):
                problems.append(f"did not resume from {resume_from}")
            if list((run_dir / "checkpoints").glob(".step-*")):
                problems.append("temporaries left behind after the resumed run")
            problems += compare_runs(reference, run_dir)
        passed += not problems
        phases[left["phase"]] += 1
        print(f"trial {trial:2d} ({mode:5s}): killed at step {left['killed_at_step']:2d} ({left['phase']}); "
              f"resumed from step {resumed_step}, {lost} steps lost: "
              + ("OK" if not problems else "FAILED: " + "; ".join(problems[:3])))
    print("kill moments: " + ", ".join(f"{phase}: {n}" for phase, n in phases.most_common()))
    print(f"crash while saving: {passed}/{args.trials} resumed from the last complete checkpoint, bit-identical "
          f"to the unbroken run, no partial file at a final path; most steps lost: sync {worst_lost['sync']}, "
          f"async {worst_lost['async']} (checkpoint every {EVERY} steps); runs in {root}")
    return 0 if passed == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
