"""`gputrain rl`: parse → build the config → PPOTrainer → fit (or start torchrun for several ranks)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gputrain.cli.launching import add_launch_arguments, is_launcher, launch_ranks, prepare_run, train_here
from gputrain.config.docs import fields_help_text

if TYPE_CHECKING:
    from gputrain.rl.trainer import PPOTrainer

EXAMPLES = """examples:
  gputrain rl                                                  # PPO on CartPole-v1, CleanRL's ppo.py settings
  gputrain rl rl.env=Pendulum-v1                               # Gaussian policy, ppo_continuous_action.py settings
  gputrain rl rl.num_envs=64 rl.num_steps=32 rl.stop_at_return=475
  gputrain rl --nproc-per-node 2 rl.num_envs=8                 # each rank steps 4 of the 8 environments
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE.toml", help="TOML config file ([rl] and the shared sections)")
    parser.add_argument("--run-dir", metavar="DIR", help="run directory (default runs/ppo-<env>-<time>/)")
    add_launch_arguments(parser)
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="section.key=value",
        help="config overrides, values as TOML literals (3, 1e-3, true) or strings, e.g. rl.env=Acrobot-v1",
    )
    parser.epilog = EXAMPLES + "\n" + fields_help_text()


def run(args: argparse.Namespace) -> int:
    # one run directory for every rank and every restart, so resume=auto finds the checkpoints; one
    # that holds a run continues it with its own config.toml
    from gputrain.config.schema import ppo_defaults

    config, run_dir = prepare_run(
        args, registry_model=False, default_name=lambda c: ("ppo", c.rl.env), defaults=ppo_defaults, kind="rl"
    )
    from gputrain.rl.run_config import check_fields_read, check_layout
    from gputrain.run.prior import continued_config

    # a field rl leaves out, set, is refused before any rank starts (a continued run's own are kept)
    check_fields_read(config, continued_config(run_dir, ppo_defaults))
    if is_launcher(args):
        check_layout(config, args.nproc_per_node * args.nnodes)
        return launch_ranks(args, "rl", str(run_dir))

    def build() -> PPOTrainer:
        from gputrain.rl.trainer import PPOTrainer

        return PPOTrainer(config, run_dir=run_dir)

    return train_here("rl", run_dir, build)
