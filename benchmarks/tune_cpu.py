"""Issue 31's CPU proof: for the default job and a tiny GPT on this machine, in one run, `gputrain
tune`'s choice against `parallel.strategy=auto` and against the best of all candidates.

Per job: a tune (1..--ranks gloo ranks, threads per rank, micro-batches, compile as --compile says)
within --budget, into a temporary directory; then, in rounds of fresh runs measured as the tune
measures (tune/trial.py: steady-state samples/s after the warm-up steps), --repeats times each and
alternately (a change of load hits all alike): the tuned choice (what `gputrain train
parallel.strategy=tuned` applies), auto's layout, and the next --rivals best candidates of the tune.
Goal: the tuned choice's median within 5% of the best median, and not below auto's. The machine's
load average is printed with the figures: on a shared machine the spread of the repeats is the
noise floor.

    python benchmarks/tune_cpu.py [--budget 2m] [--ranks 2] [--repeats 2] [--compile off]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

JOBS = {
    "default job (cnn, digits, batch 64)": [],
    "tiny GPT (2 layers, d_model 64, seq 64, batch 16)": [
        "model.name=gpt",
        "model.n_layer=2",
        "model.n_head=2",
        "model.d_model=64",
        "data.name=synthetic",
        "data.task=lm",
        "data.seq_len=64",
        "data.vocab_size=256",
        "data.num_samples=512",
        "train.batch_size=16",
    ],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", default="2m")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--micro-batches", type=int, default=2)
    parser.add_argument("--compile", choices=("try", "off", "on"), default="off")
    parser.add_argument("--rivals", type=int, default=2, help="candidates re-measured beside the tuned one")
    args = parser.parse_args()

    from gputrain.cli.tune import budget_seconds
    from gputrain.config import load_config
    from gputrain.tune.apply import resolve_tuned
    from gputrain.tune.candidates import AUTO, Candidate
    from gputrain.tune.fingerprint import machine
    from gputrain.tune.scheduler import best
    from gputrain.tune.session import COMPILE_MODES, TuneJob, run_tune
    from gputrain.tune.trial import TrainTrial

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; cores {len(os.sched_getaffinity(0))}")
    for name, overrides in JOBS.items():
        print(f"\n== {name}")
        config = load_config(None, overrides)
        with tempfile.TemporaryDirectory() as tmp:
            job = TuneJob(
                config=config,
                config_file=None,
                overrides=overrides,
                run_dir=Path(tmp) / "tune",
                budget_s=budget_seconds(args.budget),
                max_ranks=args.ranks,
                baseline_ranks=1,
                micro_batches=args.micro_batches,
                compile=COMPILE_MODES[args.compile],
            )
            results = run_tune(job)
            top = best(results)
            if top is None:
                print("no candidate ran: nothing to compare")
                continue
            tuned_config = load_config(
                None, [*overrides, "parallel.strategy=tuned", f"parallel.tune_file={job.run_dir}"]
            )
            tuned = resolve_tuned(
                tuned_config, machine(config.train.device if config.train.device != "auto" else "cpu"), None
            )
            print(tuned.line)
            chosen = tuned.candidate or Candidate(1, AUTO)
            ranked = sorted(
                (r for r in results if r.status == "ok" and r.samples_per_s), key=lambda r: -r.samples_per_s
            )
            measure: dict[str, Candidate] = {"tuned": chosen, "auto": Candidate(1, AUTO)}
            for r in ranked:
                if len(measure) >= 2 + args.rivals:
                    break
                if r.candidate not in measure.values():
                    measure[r.candidate.label()] = r.candidate
            trial = TrainTrial(None, overrides, int(config.train.batch_size))
            figures: dict[str, list[float]] = {key: [] for key in measure}
            for _ in range(args.repeats):
                for key, candidate in measure.items():
                    row = trial(candidate, 600.0)
                    if row.status == "ok" and row.samples_per_s:
                        figures[key].append(row.samples_per_s)
                    else:
                        print(f"{key}: {row.status}: {row.reason}")
            measured = [r for r in results if r.status == "ok"]
            print(
                f"tune: {len(results)} rows, {len(measured)} measured; its best: {top.candidate.label()} "
                f"{top.samples_per_s:,.0f} samples/s"
            )
            medians = {k: statistics.median(v) for k, v in figures.items() if v}
            for key, values in figures.items():
                if values:
                    shown = ", ".join(f"{v:,.0f}" for v in values)
                    print(f"re-measured {key:<40} median {medians[key]:>8,.0f} samples/s ({shown})")
            if "tuned" in medians and "auto" in medians:
                t, top_median = medians["tuned"], max(medians.values())
                print(
                    f"tuned / auto: {t / medians['auto']:.2f}×; tuned / best re-measured: {t / top_median:.2f}× "
                    f"(tuned = {chosen.label()})"
                )
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
