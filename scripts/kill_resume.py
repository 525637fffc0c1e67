"""Figure 1 of docs/reliability.md: SIGKILL a real run at random steps, resume, compare bit for bit.

    python scripts/kill_resume.py --trials 20 [--ranks 1|2] [--seed 0] [--keep DIR]

Each trial starts `gputrain train` on a tiny deterministic CPU config (digits, small MLP, every step
logged, a checkpoint every 4 steps), SIGKILLs it once metrics.jsonl reaches a random step, runs the
same command again (resume=auto from the run directory) and compares with one unbroken run:
every line of metrics.jsonl (loss, LR, grad norm, evaluations), model.safetensors byte for byte,
and the last checkpoint's optimizer, schedule, RNG, loop counters / data position. With --ranks 2
the job runs on two gloo ranks (`--nproc-per-node 2`, DDP) and the kill takes down the launcher and
both ranks at once, as a node failure would.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.unit.reliability.chaos import TINY, TINY_2_RANKS, compare_runs, kill_at_step, run_train, start_train  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ranks", type=int, choices=(1, 2), default=1, help="gloo ranks of each run")
    parser.add_argument("--keep", type=Path, help="keep the run directories here (default: a temporary folder)")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="gputrain-kill-resume-"))
    reference = root / "reference"
    job = TINY_2_RANKS if args.ranks == 2 else TINY
    if run_train(reference, job) != 0:
        print(f"the reference run failed; see {reference.with_suffix('.log')}")
        return 1
    total = json.loads((reference / "summary.json").read_text())["global_step"]
    rng = random.Random(args.seed)
    passed = 0
    for trial in range(args.trials):
        run_dir = root / f"trial{trial:02d}"
        target = rng.randint(1, total - 1)
        killed_at = kill_at_step(start_train(run_dir, job), run_dir, target)
        if killed_at is None or killed_at >= total:
            print(f"trial {trial:2d}: the run finished before step {target} was seen; not counted as a pass")
            continue
        code = run_train(run_dir, job)
        problems = [f"resume exited {code}"] if code else compare_runs(reference, run_dir)
        passed += not problems
        print(f"trial {trial:2d}: SIGKILL at step {killed_at:2d}/{total}: "
              + ("identical" if not problems else "DIFFERENT: " + "; ".join(problems[:3])))
    print(f"kill and resume ({args.ranks} rank{'s' if args.ranks > 1 else ''}): {passed}/{args.trials} resumed runs bit-identical to the unbroken run "
          f"(losses, weights, optimizer, schedule, RNG, data position); runs in {root}")
    return 0 if passed == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
