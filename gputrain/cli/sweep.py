"""`gputrain sweep SPACE.toml`: a hyperparameter search over Optuna (gputrain/sweep/).

Every trial is an ordinary gputrain run in the sweep directory (trial-NNNN/), started in a fresh
process through the launcher `gputrain train` uses; the study lives in an RDB storage (SQLite in
the sweep directory by default), which several sweep processes may share. Everything the sweep is
given is checked before the first trial: the space's keys and values against the config, the
metric against what the run logs, the storage by opening it.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from gputrain.cli.launching import add_launch_arguments, whole_number
from gputrain.errors import UsageError
from gputrain.terminal import printable

if TYPE_CHECKING:
    import optuna

    from gputrain.config import Config
    from gputrain.sweep.space import Space
    from gputrain.sweep.study import Settings
    from gputrain.sweep.trial import Launch

_VAL_PREFIXES = ("val_", "val/")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}")
"""A study's name: it names the sweep directory (runs/sweep-NAME), so no path and no leading dot."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("space", metavar="SPACE.toml", help="the search space: config keys and their distributions")
    parser.add_argument("--config", metavar="FILE.toml", help="TOML config file every trial starts from")
    parser.add_argument(
        "--trials", type=whole_number(1), default=20, metavar="N", help="trials of the study (default 20)"
    )
    parser.add_argument("--study", metavar="NAME", help="the study's name (default: the space file's name)")
    parser.add_argument(
        "--storage",
        metavar="URL",
        help="the study's SQLAlchemy URL (default sqlite:///SWEEP_DIR/study.db); a sweep elsewhere naming "
        "the same storage and study shares its trials",
    )
    parser.add_argument("--sweep-dir", metavar="DIR", help="where the trials' runs go (default runs/sweep-NAME/)")
    parser.add_argument("--sampler", choices=("tpe", "random", "grid"), default="tpe", help="default tpe")
    parser.add_argument("--seed", type=int, metavar="S", help="the sampler's seed (default: none)")
    parser.add_argument(
        "--metric", default="loss", metavar="NAME", help="the validation metric: loss (val_loss), accuracy, ..."
    )
    parser.add_argument(
        "--direction",
        choices=("minimize", "maximize"),
        help="default: minimize loss, mse, mae, perplexity (eval.mode decides others); else maximize",
    )
    parser.add_argument(
        "--objective",
        choices=("final", "best"),
        default="final",
        help="a trial's value: its last validation's metric (default) or its best validation's",
    )
    parser.add_argument("--pruner", choices=("median", "none"), default="median", help="default median")
    parser.add_argument(
        "--prune-startup",
        type=whole_number(0),
        default=5,
        metavar="K",
        help="finished trials before pruning (default 5)",
    )
    parser.add_argument(
        "--prune-warmup", type=whole_number(0), default=0, metavar="STEPS", help="steps before a trial may be pruned"
    )
    parser.add_argument(
        "--show", action="store_true", help="print the study's trials and best trial, write best.toml, run nothing"
    )
    add_launch_arguments(parser, restarts=False)
    parser.add_argument(
        "overrides", nargs="*", metavar="section.key=value", help="fixed config overrides for every trial"
    )


def metric_name(given: str) -> str:
    """`--metric` as metrics.jsonl's val rows name it: val_loss, val/loss and loss are one."""
    for prefix in _VAL_PREFIXES:
        if given.startswith(prefix):
            return given[len(prefix) :]
    return given


def check_metric(metric: str, config: Config) -> None:
    """The metric is one the trials' validations log (eval.metrics, or the task's defaults).

    Raises:
        UsageError: naming --metric and the metrics there are.
    """
    from gputrain.report.rundir import TASK_OF_DATA
    from gputrain.train.tasks import DEFAULT_METRICS

    listed = config.eval.metrics
    if isinstance(listed, list):
        logged = sorted({*listed, "loss"})
    elif config.data.name in TASK_OF_DATA:
        logged = DEFAULT_METRICS[TASK_OF_DATA[config.data.name]]
    else:  # a source of either task: its task is known once its data is read
        logged = sorted({m for names in DEFAULT_METRICS.values() for m in names})
    if metric not in logged:
        raise UsageError(f"--metric {metric}: the trials' validations do not log it; they log {', '.join(logged)}")
    if not config.eval.every_epochs and not config.eval.every_steps:
        raise UsageError(
            "--metric: the trials never validate before their end (eval.every_epochs=0, eval.every_steps=0): "
            "set one, so the metric is reported and trials can be pruned"
        )


def _sweep_dir(args: argparse.Namespace, study: str) -> Path:
    """The sweep directory: a new or empty one, or this study's own.

    Raises:
        UsageError: it is a run directory, a file, another study's sweep, or a folder of other files.
    """
    from gputrain.run.layout import CONFIG
    from gputrain.run.output import read_json
    from gputrain.sweep.layout import STUDY_DB, SWEEP_RECORD, is_sweep_dir

    path = Path(args.sweep_dir) if args.sweep_dir else Path("runs") / f"sweep-{study}"
    option = "--sweep-dir" if args.sweep_dir else "the sweep directory"
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise UsageError(f"{option} {path} is not a directory: give a new or empty one")
    if (path / CONFIG).exists():
        raise UsageError(f"{option} {path} is a run's directory: give a directory of its own")
    if is_sweep_dir(path):
        record = read_json(path / SWEEP_RECORD)
        theirs = record.get("study") if isinstance(record, dict) else None
        if theirs != study:
            raise UsageError(
                f"{option} {path} holds study {theirs!r}, not {study!r}: give another --sweep-dir or --study {theirs}"
            )
    elif path.is_dir() and not all(p.name.startswith(STUDY_DB) for p in path.iterdir()):
        # a study.db alone: a sweep stopped before it wrote sweep.json
        raise UsageError(f"{option} {path} holds other files and no sweep: give a new or empty directory")
    return path


def _check_overrides(space: Space, overrides: list[str], where: str) -> None:
    from gputrain.config.load import parse_override

    searched = {p.key for p in space.params}
    for text in overrides:
        key = parse_override(text)[0]
        if key in searched:
            raise UsageError(f"{text}: {key} is searched by {where}: fix it there (drop it from the space) or here")


def run(args: argparse.Namespace) -> int:
    from gputrain.config import load_config
    from gputrain.sweep.layout import default_storage
    from gputrain.sweep.space import check_space, read_space
    from gputrain.sweep.study import HEARTBEAT_S, Settings, open_storage, open_study, sampler
    from gputrain.sweep.trial import Launch, overrides_of
    from gputrain.train.tasks import metric_mode

    try:
        import optuna  # noqa: F401 - the extra, said before anything else is read
    except ImportError:
        raise UsageError("gputrain sweep needs Optuna: pip install 'gputrain[optuna]'") from None
    if args.storage is not None and not args.storage.strip():
        raise UsageError("--storage is empty: give a SQLAlchemy URL, or leave it out for SQLite in the sweep directory")
    space_path = Path(args.space)
    space = read_space(space_path)
    _check_overrides(space, args.overrides, str(space_path))
    if args.nnodes > 1 or args.node_rank or args.rdzv_endpoint is not None:
        option = "--nnodes" if args.nnodes > 1 else "--node-rank" if args.node_rank else "--rdzv-endpoint"
        raise UsageError(
            f"{option}: a sweep's trials run on this node (--nproc-per-node ranks each); start a sweep on each "
            "node instead, all naming one --storage"
        )
    config_file = str(Path(args.config).resolve()) if args.config else None
    check_space(space, str(space_path), config_file, args.overrides)
    fixed = [*overrides_of(space.base), *args.overrides]  # the space's base, the command line's over it
    config = load_config(config_file, fixed)
    metric = metric_name(args.metric)
    check_metric(metric, config)
    lower_is_better = metric_mode(metric, config.eval.mode) == "min"
    direction: Literal["minimize", "maximize"] = args.direction or ("minimize" if lower_is_better else "maximize")
    study_name = args.study if args.study is not None else space_path.stem
    if not _NAME.fullmatch(study_name):
        option = "--study" if args.study is not None else f"the study's name (the space file's, {space_path.name})"
        raise UsageError(
            f"{option} {study_name!r}: give a name of letters, digits, '.', '_' and '-' (it names runs/sweep-NAME)"
        )
    sweep_dir = _sweep_dir(args, study_name)
    settings = Settings(
        metric=metric,
        direction=direction,
        objective=args.objective,
        pruner=args.pruner,
        prune_startup=args.prune_startup,
        prune_warmup=args.prune_warmup,
        space=space.describe(),
        fixed=fixed,
        config=config_file,
    )
    chosen = sampler(args.sampler, space, args.seed)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    url = args.storage or default_storage(sweep_dir)
    study = open_study(open_storage(url, HEARTBEAT_S), study_name, settings, chosen)
    _write_record(sweep_dir, study_name, url, settings, args)  # the study is this directory's now
    if args.show:
        return _show(study, sweep_dir, settings)
    launch = Launch(sweep_dir.resolve(), study_name, url, settings, args.nproc_per_node, HEARTBEAT_S)
    # SIGTERM, SIGHUP, ... end this command as Ctrl-C does (interrupts.end_of_the_start): a
    # KeyboardInterrupt here, so the running trial checkpoints and is requeued, then exit 130
    ran = _optimize(study, space, launch, args.trials)
    print(printable(f"this process ran {ran} trial(s)"))
    return _show(study, sweep_dir, settings)


def _write_record(sweep_dir: Path, study: str, url: str, settings: Settings, args: argparse.Namespace) -> None:
    from gputrain.run.files import write_json
    from gputrain.sweep.layout import SWEEP_RECORD
    from gputrain.sweep.study import redacted

    write_json(
        sweep_dir / SWEEP_RECORD,
        {
            "command": "sweep",
            "study": study,
            "storage": redacted(url),
            "trials": args.trials,
            "sampler": args.sampler,
            "settings": settings.as_dict(),
        },
    )


def _optimize(study: optuna.Study, space: Space, launch: Launch, budget: int) -> int:
    """Take trials until the study has `budget` of them (with every other process's); returns how
    many this process ran."""
    import optuna

    from gputrain.sweep.study import counted, distributions, give_back, is_retry, recover_dead, within_budget
    from gputrain.sweep.trial import TrialFailed, describe, run_trial

    shape = distributions(space)
    ran = 0
    while True:
        for number in recover_dead(study):
            print(printable(f"trial {number}: its sweep process died; queued again, to resume its run"))
        trials = study.get_trials(deepcopy=False)
        waiting = [t for t in trials if t.state == optuna.trial.TrialState.WAITING]
        if len(counted(trials)) >= budget and not waiting:
            return ran
        trial = study.ask(shape)
        # a queued copy of a dead trial stands in for one the budget counted already: it always runs
        if not is_retry(study, trial) and not within_budget(study, trial, budget):
            give_back(study, trial)
            return ran
        ran += 1
        said = f"trial {trial.number}: {describe(trial.params)}"
        try:
            value = run_trial(study, trial, launch)
        except optuna.TrialPruned as pruned:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            print(printable(f"{said}: {pruned}"))
            continue
        except TrialFailed as failed:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            print(printable(f"{said}: failed: {failed}"))
            continue
        study.tell(trial, value)
        print(printable(f"{said}: {launch.settings.metric} {value:.6g}"))


def _show(study: optuna.Study, sweep_dir: Path, settings: Settings) -> int:
    from optuna.trial import TrialState

    from gputrain.sweep.best import best_trial, write_best
    from gputrain.sweep.study import finished
    from gputrain.sweep.trial import describe

    trials = finished(study.get_trials(deepcopy=False))
    states = {s: sum(t.state == s for t in trials) for s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)}
    print(
        printable(
            f"study {study.study_name}: {len(trials)} finished trial(s): {states[TrialState.COMPLETE]} complete, "
            f"{states[TrialState.PRUNED]} pruned, {states[TrialState.FAIL]} failed"
        )
    )
    best = best_trial(study)
    if best is None:
        print("no complete trial yet")
        return 0
    where = f" ({best.run_dir})" if best.run_dir is not None else ""  # a retried trial's is its original's
    print(printable(f"best: trial {best.number}{where}, {settings.metric} {best.value:.6g}: {describe(best.params)}"))
    written = write_best(sweep_dir, best, settings.metric)
    if written is not None:
        print(printable(f"wrote {written}: gputrain train --config {written}"))
    else:
        print(printable(f"best.toml not written: {best.run_dir} holds no readable config.toml"))
    return 0
