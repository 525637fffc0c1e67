"""Framework overhead on CPU: gputrain's Trainer against a hand-written PyTorch loop.

Both train the same model on the same in-memory data with the same optimizer (AdamW, torch's
default CPU kernels), the same constant LR schedule and the same batch order, in one process;
repeats alternate between the two, and the overhead is the median of the paired differences.
The time per step is the slope of CPU time (`time.process_time`) over two runs of different
length (N/5 and N steps): set-up costs cancel, and on a busy shared machine CPU time is not
inflated by the process waiting for a core. The difference per step is what the framework adds.

`--callbacks` adds a third loop to the tiny MLP's: the Trainer with three callbacks whose hooks do
nothing (each defines every hook), alternating with the other two; the figure is the median of the
paired differences against the Trainer without them (issue 29: under 2 µs a step).

Models: the digits CNN (`gputrain train`'s default model, batch 64) and a tiny MLP
(32 → 64 → 10, batch 64), where a step is so short that overhead dominates.

    python benchmarks/overhead_cpu.py [--repeats 9] [--threads 1]

`--trackers`: only what the MLflow sink (issue 32) adds to the tiny MLP's step, alternating with
the same loop without it: with a row at the end only (every step that logs no row) and with a row
every 10 steps.

The last line is the foundation issue's figure: the wall time of a whole `Trainer.fit` (set-up,
first-step FLOP count and all) against the hand loop over the default job's 380 steps.

One intra-op thread by default: on a small shared machine a second OpenMP thread adds
milliseconds of scheduling noise to a microsecond-scale step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gputrain import Trainer  # noqa: E402
from gputrain.data.tensors import TensorData  # noqa: E402
from gputrain.data.batches import BatchPlan  # noqa: E402


def hand_loop(model: nn.Module, data: TensorData, batch: int, steps: int, seed: int) -> None:
    """A plain training loop."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    plan = BatchPlan(num_samples=len(data), global_batch=batch, grad_accum=1, seed=seed)
    model.train()
    done = 0
    epoch = 0
    while done < steps:
        for (idx,) in plan.micro_batches(epoch):
            x, y = data.inputs[idx], data.targets[idx]
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            done += 1
            if done == steps:
                break
        epoch += 1
    loss.item()


def gputrain_loop(model: nn.Module, data: TensorData, batch: int, steps: int, seed: int,
                  on_nonfinite: str = "stop", callbacks: tuple = (), log: dict | None = None) -> None:
    """The same training through the Trainer (with its default non-finite guard unless told);
    `log`: log.* settings over the default of one row at the end."""
    with tempfile.TemporaryDirectory() as run_dir:
        config = {"train.device": "cpu", "train.batch_size": batch, "train.max_steps": steps, "train.epochs": 10**6,
                  "train.seed": seed, "log.every_steps": 10**6, "log.progress": "none", "log.tensorboard": False,
                  "checkpoint.enabled": False, "eval.every_epochs": 0, "train.on_nonfinite": on_nonfinite,
                  **(log or {})}
        summary = Trainer(model, data, loss_fn=F.cross_entropy, config=config, run_dir=run_dir,
                          callbacks=callbacks).fit()
    assert summary["global_step"] == steps


def digits_case() -> tuple[Callable[[], nn.Module], TensorData]:
    from gputrain.config.schema import DataConfig, ModelConfig
    from gputrain.data import build_data
    from gputrain.models import build_model

    bundle = build_data(DataConfig(), seed=0)
    return (lambda: build_model(ModelConfig(), bundle.spec)), bundle.train  # type: ignore[return-value]


def mlp_case() -> tuple[Callable[[], nn.Module], TensorData]:
    generator = torch.Generator().manual_seed(0)
    data = TensorData(torch.randn(4096, 32, generator=generator), torch.randint(0, 10, (4096,), generator=generator))
    return (lambda: nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))), data


class NoOp:
    """A callback with every hook, each doing nothing: what the dispatch itself costs."""

    def on_fit_start(self, trainer): pass
    def on_step_end(self, trainer, step, metrics): pass
    def on_eval_end(self, trainer, split, metrics): pass
    def on_checkpoint(self, trainer, path): pass
    def on_train_end(self, trainer, status): pass
    def on_fit_end(self, trainer, summary): pass


def callbacks_loop(model: nn.Module, data: TensorData, batch: int, steps: int, seed: int) -> None:
    gputrain_loop(model, data, batch, steps, seed, callbacks=(NoOp(), NoOp(), NoOp()))


def measure_trackers(name: str, case: tuple[Callable[[], nn.Module], TensorData], steps: int, repeats: int) -> dict:
    """What the MLflow sink (a SQLite store) adds to a step, alternating with the same loop without
    it, twice: with the other loops' logging (a row at the end only: what every step that logs no
    row pays) and with a row every 10 steps (the default; MLflow's SQLite store takes ~1 ms of CPU a
    row, on the tracker's own thread). The median of paired differences of the slope of CPU time,
    the whole process's (the tracker's thread included) and the training thread's alone."""
    import os

    make_model, data = case
    short = max(1, steps // 5)
    result: dict = {"case": name, "steps": steps}
    with tempfile.TemporaryDirectory() as store:
        here = os.getcwd()
        os.chdir(store)  # the SQLite store's artifacts go to ./mlruns
        try:
            for every, what in ((10**6, "a row at the end only"), (10, "a row every 10 steps")):
                base = {"log.every_steps": every}
                loops = (("base", base), ("mlflow", {**base, "log.mlflow": f"sqlite:///{store}/mlflow.db"}))
                times: dict[str, dict[str, list[float]]] = {label: {"process": [], "thread": []} for label, _ in loops}
                for r in range(repeats + 1):  # the first round makes the database and warms up; dropped
                    for label, log in loops:
                        spent: dict[str, list[float]] = {"process": [], "thread": []}
                        for n in (short, steps):
                            torch.manual_seed(r)
                            process, thread = time.process_time(), time.thread_time()
                            gputrain_loop(make_model(), data, 64, n, r, log=log)
                            spent["process"].append(time.process_time() - process)
                            spent["thread"].append(time.thread_time() - thread)
                        if r > 0:
                            for clock, (a, b) in spent.items():
                                times[label][clock].append((b - a) / (steps - short))
                for clock, whose in (("process", "CPU, its thread included"), ("thread", "the training thread's CPU")):
                    growth = statistics.median(m - b for b, m in zip(times["base"][clock], times["mlflow"][clock]))
                    result[f"every_{every}_{clock}_us"] = growth * 1e6
                    print(f"{name:12s} MLflow sink (SQLite), {what}: {growth * 1e6:+.2f} µs/step of {whose} "
                          f"(without it {statistics.median(times['base'][clock]) * 1e6:.1f} µs/step; "
                          f"median of {repeats} paired rounds)")
            result["hot_path_us"] = tracker_hot_path_us(f"sqlite:///{store}/mlflow.db")
        finally:
            os.chdir(here)
    return result


def tracker_hot_path_us(uri: str, number: int = 100_000) -> float:
    """What the training thread does for the MLflow sink per logged row, free of the machine's
    noise: the row appended (`write`), and every 100th row the list handed to the tracker's
    thread (`flush`), timeit's best of 5. A step that logs no row calls no sink at all."""
    import timeit

    from gputrain.config import load_config
    from gputrain.observe.mlflow_sink import MlflowSink
    from gputrain.observe.trackers import RunFacts, Trackers

    with tempfile.TemporaryDirectory() as run_dir:
        sink = MlflowSink(uri, RunFacts(load_config(None, {}), Path(run_dir), "cpu", "fp32", 1, None))
        sink.log_rows = lambda rows: None  # type: ignore[method-assign]  # the thread's side is not measured here
        row = {"step": 1, "epoch": 1, "loss": 0.5, "lr": 1e-3, "grad_norm": 1.0, "samples_per_s": 1e5}
        count = [0]

        def logged_row() -> None:
            sink.write(row)
            count[0] += 1
            if count[0] % 100 == 0:
                sink.flush()

        best = min(timeit.repeat(logged_row, number=number, repeat=5)) / number
        sink.close()
        Trackers([sink]).store(Path(run_dir) / "none.json", "completed")
    print(f"{'':12s} the MLflow sink's work on the training thread: {best * 1e6:.3f} µs a logged row "
          f"(timeit, best of 5 × {number}); a step that logs no row calls no sink")
    return best * 1e6


def unguarded_loop(model: nn.Module, data: TensorData, batch: int, steps: int, seed: int) -> None:
    gputrain_loop(model, data, batch, steps, seed, on_nonfinite="off")


def measure(name: str, case: tuple[Callable[[], nn.Module], TensorData], steps: int, repeats: int,
            guard_off: bool = False, callbacks: bool = False) -> dict:
    """Per-step CPU time of the hand loop and gputrain (and, with `guard_off`, gputrain with
    train.on_nonfinite=off, which drops the guard's check and its one sync per step; with
    `callbacks`, gputrain with three no-op callbacks)."""
    make_model, data = case
    loops = [("hand", hand_loop), ("gputrain", gputrain_loop)] + ([("guard off", unguarded_loop)] if guard_off else [])
    loops += [("3 callbacks", callbacks_loop)] if callbacks else []
    times: dict[str, list[float]] = {label: [] for label, _ in loops}
    short = max(1, steps // 5)
    for r in range(repeats + 1):  # the first round warms up every path and is dropped
        for label, loop in loops:
            cpu = []
            for n in (short, steps):
                torch.manual_seed(r)
                start = time.process_time()
                loop(make_model(), data, 64, n, r)
                cpu.append(time.process_time() - start)
            if r > 0:
                times[label].append((cpu[1] - cpu[0]) / (steps - short))
    hand = statistics.median(times["hand"])
    result: dict = {"case": name, "steps": steps, "hand_us": hand * 1e6}
    line = f"{name:12s} step: hand {hand * 1e6:8.1f} µs"
    for label in list(times)[1:]:
        ours = statistics.median(times[label])
        # the median of paired differences: each pair ran back to back, so a slow spell of the
        # machine lands on both halves of a pair instead of on one side's median
        overhead = statistics.median(g - h for h, g in zip(times["hand"], times[label]))
        # and the difference of the fastest runs: noise only ever adds time, so each side's
        # minimum is its least disturbed figure (timeit's convention)
        overhead_min = min(times[label]) - min(times["hand"])
        result[label] = {"us": ours * 1e6, "overhead_us": overhead * 1e6, "overhead_min_us": overhead_min * 1e6,
                         "ratio": ours / hand}
        line += (f" | {label} {ours * 1e6:8.1f} µs, overhead {overhead * 1e6:+6.1f} µs/step "
                 f"(fastest runs {overhead_min * 1e6:+.1f}), ratio {ours / hand:.3f}")
    print(line + f"  [medians of {repeats} rounds; slope over {short} and {steps} steps]")
    if callbacks:  # what the three no-op callbacks add to the Trainer's step, pair by pair
        growth = statistics.median(c - g for g, c in zip(times["gputrain"], times["3 callbacks"]))
        result["callbacks_growth_us"] = growth * 1e6
        print(f"{name:12s} three no-op callbacks add {growth * 1e6:+.2f} µs/step (median of {repeats} paired rounds)")
        result["callbacks_dispatch_us"] = dispatch_us()
    return result


def dispatch_us(number: int = 200_000) -> float:
    """The loop's per-step work for three no-op callbacks alone, free of the machine's noise: the
    test of the hook list and the three calls (timeit's best of 5)."""
    import timeit

    from gputrain.train.callbacks import Callbacks

    calls = Callbacks([NoOp(), NoOp(), NoOp()])

    def step() -> None:
        if calls.step_end:
            calls.step_ended(None, 1, None)  # type: ignore[arg-type]

    best = min(timeit.repeat(step, number=number, repeat=5)) / number
    print(f"{'':12s} their dispatch alone: {best * 1e6:.3f} µs/step (timeit, best of 5 × {number})")
    return best * 1e6


def tensor_dataset_fit(model: nn.Module, data: TensorData, batch: int, steps: int, seed: int) -> None:
    """What a user writes: their tensors in a torch TensorDataset, handed to the Trainer."""
    from torch.utils.data import TensorDataset

    gputrain_loop(model, TensorDataset(data.inputs, data.targets), batch, steps, seed)  # type: ignore[arg-type]


def _paired_calls(case: tuple[Callable[[], nn.Module], TensorData], ours: Callable[..., None], steps: int,
                  repeats: int, clock: Callable[[], float]) -> tuple[float, float, float]:
    """(hand, ours, median paired ratio) of whole calls timed by `clock`, set-up included, the two
    alternating; the first round warms up (imports, allocator) and is dropped."""
    make_model, data = case
    times: dict[str, list[float]] = {"hand": [], "ours": []}
    for r in range(repeats + 1):
        for label, loop in (("hand", hand_loop), ("ours", ours)):
            torch.manual_seed(r)
            model = make_model()
            start = clock()
            loop(model, data, 64, steps, r)
            if r > 0:
                times[label].append(clock() - start)
    ratios = [g / h for h, g in zip(times["hand"], times["ours"])]
    return statistics.median(times["hand"]), statistics.median(times["ours"]), statistics.median(ratios)


def measure_whole_fit(name: str, case: tuple[Callable[[], nn.Module], TensorData], steps: int, repeats: int) -> dict:
    """CPU time of a whole call, set-up included: Trainer(model, TensorDataset(...)).fit() against the
    hand loop, alternating; the median of the paired ratios."""
    hand, ours, ratio = _paired_calls(case, tensor_dataset_fit, steps, repeats, time.process_time)
    print(f"{name:12s} whole fit, TensorDataset: hand {hand:7.3f} s  Trainer.fit {ours:7.3f} s CPU  "
          f"ratio {ratio:.3f} (median of {repeats} paired runs of {steps} steps, set-up included)")
    return {"case": name, "hand_cpu_s": hand, "gputrain_cpu_s": ours, "ratio": ratio}


def measure_wall(name: str, case: tuple[Callable[[], nn.Module], TensorData], steps: int, repeats: int) -> dict:
    """Wall time of the whole call, set-up included: Trainer(...).fit() against the hand loop, alternating."""
    hand, ours, ratio = _paired_calls(case, gputrain_loop, steps, repeats, time.perf_counter)
    print(f"{name:12s} wall: hand {hand:7.3f} s  Trainer.fit {ours:7.3f} s  ratio {ratio:.3f} "
          f"(median of {repeats} paired runs of {steps} steps, set-up included)")
    return {"case": name, "hand_s": hand, "gputrain_s": ours, "ratio": ratio}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--mlp-steps", type=int, default=2000)
    parser.add_argument("--cnn-steps", type=int, default=300)
    parser.add_argument("--callbacks", action="store_true", help="also the tiny MLP with three no-op callbacks")
    parser.add_argument("--only-mlp", action="store_true", help="the tiny MLP's per-step figures only")
    parser.add_argument("--trackers", action="store_true", help="only what the MLflow sink adds to the tiny MLP's step")
    parser.add_argument("--wall-steps", type=int, default=380, help="steps of the wall-time comparison "
                        "(380 = the default job: 20 epochs of digits at batch 64)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
          f"{time.strftime('%Y-%m-%d')}")
    if args.trackers:
        measure_trackers("tiny MLP", mlp_case(), args.mlp_steps, args.repeats)
        return
    measure("tiny MLP", mlp_case(), args.mlp_steps, args.repeats, guard_off=not args.only_mlp, callbacks=args.callbacks)
    if args.only_mlp:
        return
    measure_whole_fit("tiny MLP", mlp_case(), args.mlp_steps, args.repeats)
    measure("digits CNN", digits_case(), args.cnn_steps, args.repeats)
    measure_wall("digits CNN", digits_case(), args.wall_steps, args.repeats)


if __name__ == "__main__":
    main()
