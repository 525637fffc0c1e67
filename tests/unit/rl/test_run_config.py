"""What `gputrain rl` reads of the config: `READS` is exactly the fields a PPO run reads (recorded
while one runs), every other field set away from its default is refused naming it, a continued
run's own values are kept, and the rollout is bounded by the memory of the device that holds it."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

from gputrain.config import load_config
from gputrain.config.schema import SECTIONS, Config, ppo_defaults
from gputrain.errors import ConfigError
from gputrain.rl.build import placed_fields
from gputrain.rl.run_config import READS, check_fields_read, check_rollout_fits, reads
from gputrain.rl.trainer import PPOTrainer

TINY = ["rl.num_envs=2", "rl.num_steps=4", "rl.num_minibatches=1", "rl.update_epochs=1", "rl.total_timesteps=16",
        "rl.hidden_sizes=[4]", "log.progress=none", "log.tensorboard=false", "train.device=cpu"]
ALL_FIELDS = [f"{section}.{name}" for section, cls in SECTIONS.items() for name in cls.__dataclass_fields__]
# what reads a config without running with it: loading and checking it, writing config.toml, comparing
# it with a run's saved one
NOT_RUNNING = ("gputrain.config", "dataclasses", "gputrain.run.prior", "gputrain.run.files", __name__)
CHECKING = "check_fields_read"
"""The check that compares every field with its default: it reads them all, and uses none."""


def _recording(config: Config, reads_seen: set[str]) -> Config:
    """`config` with sections that note each field the run's code reads. A read of a field that
    `placed_fields` sets is the placement's value, not the user's: noted only on the user's section."""
    placed = {f"{section}.{name}" for section, fields in placed_fields(1).items() for name in fields}
    users: set[int] = set()

    def recorder(section: str, cls: type) -> type:
        def __getattribute__(self: Any, name: str) -> Any:
            key = f"{section}.{name}"
            if name in cls.__dataclass_fields__ and (key not in placed or id(self) in users):
                frame = sys._getframe(1)
                if not frame.f_globals.get("__name__", "").startswith(NOT_RUNNING) and frame.f_code.co_name != CHECKING:
                    reads_seen.add(key)
            return object.__getattribute__(self, name)

        return type(f"Recording{cls.__name__}", (cls,), {"__slots__": (), "__getattribute__": __getattribute__})

    sections = {}
    for section, cls in SECTIONS.items():
        given = getattr(config, section)
        values = {f.name: getattr(given, f.name) for f in dataclasses.fields(given)}
        sections[section] = recorder(section, cls)(**values)
        users.add(id(sections[section]))
    return dataclasses.replace(config, **sections)


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
def test_reads_is_what_a_run_reads(tmp_path: Path, env: str) -> None:
    """A run, and the same run again (its complete record kept): every field its code reads, beyond
    [rl], is in READS, and READS names no field it leaves out."""
    seen: set[str] = set()
    config = _recording(load_config(None, [*TINY, f"rl.env={env}"], defaults=ppo_defaults), seen)
    PPOTrainer(config, run_dir=tmp_path / "run").fit()
    PPOTrainer(config, run_dir=tmp_path / "run").fit()
    outside_rl = {key for key in seen if not key.startswith("rl.")}
    assert outside_rl == {key for key in ALL_FIELDS if reads(key) and not key.startswith("rl.")}
    assert "rl." in READS


UNREAD = [key for key in ALL_FIELDS if not reads(key)]


def _with(config: Config, key: str, value: Any) -> Config:
    """`config` with `key` holding `value`, past the sections' own checks (any value other than the
    default is a user's setting to this check)."""
    section, name = key.split(".")
    copy = dataclasses.replace(config, **{section: dataclasses.replace(getattr(config, section))})
    setattr(getattr(copy, section), name, value)
    return copy


@pytest.mark.parametrize("key", UNREAD)
def test_each_field_a_run_leaves_out_is_refused_when_set(key: str) -> None:
    config = load_config(None, TINY, defaults=ppo_defaults)
    check_fields_read(config)  # all at their defaults
    with pytest.raises(ConfigError, match=rf"^config error: {key} = .*: gputrain rl does not use this field"):
        check_fields_read(_with(config, key, "set by the user"))


@pytest.mark.parametrize("key", [key for key in ALL_FIELDS if reads(key)])
def test_a_field_a_run_reads_is_never_refused_as_unused(key: str) -> None:
    check_fields_read(_with(load_config(None, TINY, defaults=ppo_defaults), key, "set by the user"))


def test_adam_said_as_such_is_what_rl_does() -> None:
    check_fields_read(load_config(None, [*TINY, "optim.name=adam"], defaults=ppo_defaults))
    with pytest.raises(ConfigError, match=r"optim.name = 'sgd': gputrain rl does not use this field; leave it unset"):
        check_fields_read(load_config(None, [*TINY, "optim.name=sgd"], defaults=ppo_defaults))


def test_the_message_names_what_sets_it_in_rl() -> None:
    with pytest.raises(ConfigError) as err:
        check_fields_read(load_config(None, [*TINY, "train.epochs=3"], defaults=ppo_defaults))
    assert str(err.value) == ("config error: train.epochs = 3: gputrain rl does not use this field (what sets this in "
                              "rl: rl.total_timesteps); leave it unset")


def test_a_continued_runs_own_values_are_kept() -> None:
    """A run written before the check may hold an unread field set: continued, it keeps it."""
    old = load_config(None, [*TINY, "model.name=mlp"], defaults=ppo_defaults)
    check_fields_read(old, saved=old)
    with pytest.raises(ConfigError, match=r"model\.name = 'gpt'"):
        check_fields_read(load_config(None, [*TINY, "model.name=gpt"], defaults=ppo_defaults), saved=old)


def test_an_empty_policy_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^config error: rl.hidden_sizes = \[\]: needs at least one hidden layer"):
        load_config(None, ["rl.hidden_sizes=[]"])


@pytest.mark.parametrize(("ranks", "fits"), [(1, False), (4, True)])
def test_the_rollout_is_bounded_by_the_devices_memory(ranks: int, fits: bool) -> None:
    rl = load_config(None, ["rl.num_envs=64", "rl.num_steps=128"]).rl
    memory = (64 * 128 * 100 // 2, "a test's limit")  # half of what 100 bytes a transition take on one rank
    if fits:
        check_rollout_fits(rl, ranks, 100, memory, "cuda:0")  # each rank holds a quarter
        return
    with pytest.raises(ConfigError) as err:
        check_rollout_fits(rl, ranks, 100, memory, "cuda:0")
    assert str(err.value).startswith("config error: rl.num_envs = 64: with rl.num_steps = 128, a rollout holds 8,192 "
                                     "transitions: 800.0 KiB or more, but cuda:0 has 400.0 KiB (a test's limit)")


def test_the_rollout_check_can_be_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    rl = load_config(None, ["rl.num_envs=64"]).rl
    check_rollout_fits(rl, 1, 100, None, "the host")  # no limit known
    monkeypatch.setenv("GPUTRAIN_SKIP_MEMORY_CHECK", "1")
    check_rollout_fits(rl, 1, 100, (1, "a test's limit"), "the host")


def test_config_toml_records_the_resolved_rl_section(tmp_path: Path) -> None:
    """The README calls config.toml the config the run trained with: the [rl] section's `auto`s (9 of
    them by default) are written as the values that ran, and the run continues from that file."""
    import tomllib

    run = tmp_path / "run"
    PPOTrainer(run_dir=run, overrides=["rl.total_timesteps=512", "log.progress=none", "log.tensorboard=false",
                                       "train.device=cpu"]).fit()
    recorded = tomllib.loads((run / "config.toml").read_text())["rl"]
    assert [k for k, v in recorded.items() if v == "auto"] == []
    settings = load_config(None, [], defaults=ppo_defaults).rl.resolved()
    assert (recorded["policy"], recorded["num_envs"], recorded["num_steps"], recorded["env_dtype"]) == (
        "categorical", settings.num_envs, settings.num_steps, "float64")
    assert recorded["ent_coef"] == settings.ent_coef and recorded["normalize_obs"] is False
    longer = PPOTrainer(run_dir=run, overrides=["rl.total_timesteps=1024", "log.progress=none",
                                                 "log.tensorboard=false", "train.device=cpu"])
    assert longer.fit()["global_step"] == 2  # continued from its own config.toml: 2 iterations of 512
