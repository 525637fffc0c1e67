"""`gputrain lr-find`: a learning-rate range test (train/lr_find.py), the suggested optim.lr and
the rule behind it, and `lr_find.json`, whose curve `gputrain report` draws.

The sweep trains parts built for it alone: an existing run's weights, checkpoints and records are
never read or written; into its directory (`--run-dir`) goes `lr_find.json` and nothing else.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from gputrain.cli.launching import add_launch_arguments, is_launcher, launch_ranks
from gputrain.config.docs import RL_SECTION, fields_help_text
from gputrain.errors import RunError, UsageError
from gputrain.run.layout import CONFIG, LR_FIND

if TYPE_CHECKING:
    from gputrain.config import Config
    from gputrain.train.build import TrainingParts
    from gputrain.train.lr_find import LRCurve, Suggestion, Sweep

# what the sweep never does, whatever the config says: it saves, resumes and logs nothing
_FORCED = (
    "checkpoint.enabled=false",
    "checkpoint.resume=never",
    "log.tensorboard=false",
    'log.mlflow=""',
    "log.wandb=off",
    "log.breakdown_every=0",
)
_STOPPED = {
    "completed": "ran every step",
    "diverged": "stopped: the running average of the loss rose past 4× its lowest",
    "nonfinite": "stopped: the loss was not finite",
    "overflow": "stopped: fp16 gradients overflowed at every loss scale",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE.toml",
        help="TOML config file (overrides still apply on top); default: --run-dir's config.toml where it has one",
    )
    parser.add_argument(
        "--run-dir",
        metavar="DIR",
        help="where lr_find.json goes: an existing run's directory (nothing else in it is touched) or a new one "
        "(default runs/<model>-<data>-<time>-lr-find/)",
    )
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps of the sweep (default 100)")
    parser.add_argument("--start-lr", type=float, default=1e-7, help="learning rate of the first step (default 1e-7)")
    parser.add_argument("--end-lr", type=float, default=10.0, help="learning rate of the last step (default 10)")
    parser.add_argument(
        "--rule",
        choices=("steepest", "minimum"),
        default="steepest",
        help="steepest: where the smoothed loss falls fastest (default); minimum: a tenth of the lr at its minimum",
    )
    add_launch_arguments(parser, restarts=False)
    parser.add_argument(
        "overrides", nargs="*", metavar="section.key=value", help="config overrides, as for gputrain train"
    )
    parser.epilog = fields_help_text(omit=(RL_SECTION,))


def _check(args: argparse.Namespace) -> None:
    """The sweep's numbers within train/lr_find.py's bounds, before anything is loaded."""
    from gputrain.train.lr_find import END_LR_MAX, START_LR_MIN, STEPS_MAX, STEPS_MIN

    if args.steps < STEPS_MIN:
        raise UsageError(f"--steps must be at least {STEPS_MIN} (the rules need a curve), got {args.steps}")
    if args.steps > STEPS_MAX:
        raise UsageError(
            f"--steps must be at most {STEPS_MAX} (a longer sweep is a training run, not a range test), "
            f"got {args.steps}"
        )
    for name in ("start_lr", "end_lr"):
        value, option = getattr(args, name), f"--{name.replace('_', '-')}"
        if not (math.isfinite(value) and value > 0):
            raise UsageError(f"{option} must be a number > 0, got {value}")
        if not START_LR_MIN <= value <= END_LR_MAX:
            raise UsageError(
                f"{option} must be in [{START_LR_MIN:g}, {END_LR_MAX:g}] (from where a step moves an fp32 weight "
                f"up to the largest optim.lr), got {value:g}"
            )
    if args.end_lr <= args.start_lr:
        raise UsageError(f"--end-lr ({args.end_lr:g}) must be larger than --start-lr ({args.start_lr:g})")


def run(args: argparse.Namespace) -> int:
    from gputrain.config import load_config
    from gputrain.run.files import default_run_dir, run_dir_path
    from gputrain.run.reader import read_bytes

    _check(args)
    given = run_dir_path(args.run_dir) if args.run_dir is not None else None
    if given is not None:
        check_sweep_dir(given)  # before its config is read, the sweep built, or any rank started
    own_config = given / CONFIG if given is not None and args.config is None else None
    # the run's rules (run/reader.py): no link out, a regular file, a bounded size
    if own_config is not None and read_bytes(own_config.parent, CONFIG) is not None:
        args.config = str(own_config)  # the run's own config: the sweep that run starts with
    config = load_config(args.config, [*args.overrides, *_FORCED])
    run_dir = given or Path(f"{default_run_dir(config.model.name, config.data.name)}-lr-find")
    if given is None:
        check_sweep_dir(run_dir)
    if is_launcher(args):
        options = ("--steps", str(args.steps), "--start-lr", repr(args.start_lr), "--end-lr", repr(args.end_lr))
        return launch_ranks(args, "lr-find", str(run_dir), (*options, "--rule", args.rule))
    from gputrain.distributed.context import shutdown_distributed
    from gputrain.train.lr_find import Sweep, agree_on_suggestion, build_sweep_parts, run_sweep, suggest_lr

    sweep = Sweep(args.start_lr, args.end_lr, args.steps)
    try:
        parts = build_sweep_parts(config, run_dir)
        curve = run_sweep(parts, sweep)
        try:
            suggestion = agree_on_suggestion(suggest_lr(curve, args.rule), parts)
        except ValueError as err:
            _write(parts, curve, sweep, None, config)  # the curve still shows where it went wrong
            raise RunError(
                f"lr-find: no suggestion: {err} ({_STOPPED[curve.stopped]} at step {len(curve.lrs)}); "
                f"lower --start-lr (now {sweep.start_lr:g})"
            ) from None
        _write(parts, curve, sweep, suggestion, config)
    finally:
        shutdown_distributed()
    if parts.place.dist.is_main:  # rank 0 speaks for the job: every rank holds its suggestion
        mine = own_config is not None and args.config == str(own_config)
        _print_result(parts.run_dir, curve, sweep, suggestion, args.config if mine else None)
        world = parts.place.dist.world_size
        if suggestion.ranks_agreeing < world:  # cannot happen with the same averaged losses; said if it does
            print(f"warning: {suggestion.ranks_agreeing} of {world} ranks computed this suggestion; rank 0's is used")
        _note_rank_dependence(parts, world)
    return 0


def check_sweep_dir(run_dir: Path) -> None:
    """Where lr_find.json goes (run/output.py's rules): a new or empty directory, a sweep's own, or a
    training run's directory, never an RL run's (its config is not a model's to sweep), a folder of
    the user's holding other files, nor a place inside another run; an lr_find.json there is one a
    sweep wrote.

    Raises:
        UsageError: naming --run-dir, the path and what would be right.
    """
    from gputrain.run.files import check_run_dir, run_dir_path
    from gputrain.run.output import Owner, check_output_file, check_output_folder, is_rl_run

    run_dir = run_dir_path(str(run_dir))
    owner = Owner.of(runs=[run_dir], designated=[LR_FIND])
    check_output_folder(run_dir, "--run-dir", owner, _sweep_may_write)  # first: a name too long is one line
    if os.path.isdir(run_dir) and is_rl_run(run_dir):
        raise UsageError(
            f"--run-dir {run_dir}: holds a gputrain rl run; an LR sweep is for a training run's config: choose a "
            "training run's directory, or a new one"
        )
    check_output_file(run_dir / LR_FIND, "--run-dir", owner, _lr_find_record)
    check_run_dir(run_dir)  # it can be created and written: not under a file, in /proc, nor a name too long


def _sweep_may_write(run_dir: Path) -> bool:
    """A training run's directory (its config beside a run's records), or a sweep's own (its
    lr_find.json, and its report)."""
    from gputrain.run.layout import CHECKPOINTS, ENV, EXPORT_RECORD, METRICS, REPORT, SUMMARY

    names = {p.name for p in run_dir.iterdir()}
    if CONFIG in names and EXPORT_RECORD not in names and names & {ENV, SUMMARY, METRICS, CHECKPOINTS}:
        return True
    return LR_FIND in names and names <= {LR_FIND, REPORT}


def _lr_find_record(path: Path) -> bool:
    """An lr_find.json a sweep wrote: the only one a sweep replaces."""
    from gputrain.run.output import json_record

    return json_record("lr-find", "suggested_lr", "lrs", "losses", "stopped")(path)


def _note_rank_dependence(parts: TrainingParts, world: int) -> None:
    """Where N ranks sweep the one-process curve and where not: said under several ranks."""
    from gputrain.train.lr_find import rank_dependent_layers

    layers = rank_dependent_layers(parts.model) if world > 1 else []
    if layers:
        print(
            f"note: the model has {' and '.join(layers)}, so {world} ranks sweep a curve equal to one "
            "process's in distribution, not point for point"
        )


def _write(parts: TrainingParts, curve: LRCurve, sweep: Sweep, suggestion: Suggestion | None, config: Config) -> None:
    """lr_find.json, by rank 0: the only file the sweep writes."""
    from gputrain.run.files import write_json
    from gputrain.run.output import make_folder, marked
    from gputrain.train.lr_find import lr_find_record

    if parts.place.dist.is_main:
        make_folder(parts.run_dir, "--run-dir")
        record = lr_find_record(curve, sweep, suggestion, parts, config)
        write_json(parts.run_dir / LR_FIND, {**record, **marked("lr-find")})


def _print_result(run_dir: Path, curve: LRCurve, sweep: Sweep, suggestion: Suggestion, run_config: str | None) -> None:
    """Printed whatever log.progress says: the suggestion is the command's answer. `run_config`:
    the config file of the run whose directory was given, where the sweep took its config from."""
    from gputrain.train.lr_find import other_suggestions

    if run_config is not None:
        print(f"config: {run_config} (the run's own)")
    print(
        f"lr-find: {len(curve.lrs)} of {sweep.steps} steps, lr {curve.lrs[0]:.3g} → {curve.lrs[-1]:.3g} "
        f"({_STOPPED[curve.stopped]})"
    )
    others = "; ".join(f"{rule} rule: {lr:.2e}" for rule, lr in other_suggestions(curve, suggestion.rule).items())
    print(f"suggested optim.lr={suggestion.lr:.2e} (rule: {suggestion.rule_text}; {others})")
    print(f"wrote {run_dir / LR_FIND}; its curve: gputrain report {shlex.quote(str(run_dir))}")
