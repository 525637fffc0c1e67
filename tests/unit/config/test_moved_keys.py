"""Keys that moved (config/schema.py MOVED: rl.learning_rate → optim.lr, rl.adam_eps → optim.eps,
rl.max_grad_norm → train.clip_grad_norm): named with their new place on the command line; read as
they meant in a config file written before the move (every run's config.toml holds them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gputrain.config import load_config
from gputrain.config.schema import ppo_defaults
from gputrain.errors import ConfigError

OLD_FILE = """[optim]
lr = 0.001
eps = 1e-08

[rl]
env = "Pendulum-v1"
learning_rate = {lr}
adam_eps = 1e-05
max_grad_norm = 0.5
"""


def test_an_old_file_read_by_train_drops_the_keys_that_were_rls_alone(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(OLD_FILE.format(lr=0.01))
    config = load_config(path)
    assert (config.optim.lr, config.optim.eps, config.train.clip_grad_norm) == (0.001, 1e-8, None)


@pytest.mark.parametrize("lr, expected", [('"auto"', 3e-4), ("0.01", 0.01)])
def test_an_old_file_read_by_rl_moves_them_over_the_shared_keys(tmp_path: Path, lr: str, expected: float) -> None:
    path = tmp_path / "config.toml"
    path.write_text(OLD_FILE.format(lr=lr))
    config = load_config(path, defaults=ppo_defaults)  # "auto": CleanRL's, by the kind of action
    assert (config.optim.lr, config.optim.eps, config.train.clip_grad_norm) == (expected, 1e-5, 0.5)
    # an override still wins over the file, as for any key
    assert load_config(path, ["optim.lr=0.5"], defaults=ppo_defaults).optim.lr == 0.5


@pytest.mark.parametrize("source", [{"rl.learning_rate": 0.01}, {"rl": {"learning_rate": 0.01}}])
def test_a_moved_key_given_now_is_named_with_its_new_place(source: dict) -> None:
    with pytest.raises(ConfigError, match=r"rl.learning_rate: moved to optim.lr\n  did you mean 'optim.lr'\?"):
        load_config(source, defaults=ppo_defaults)
    with pytest.raises(ConfigError, match="moved to optim.lr"):
        load_config(None, ["rl.learning_rate=0.01"])


@pytest.mark.parametrize("text, section", [("rl = 5\n", "rl"), ('rl = "learning_rate"\n', "rl"),
                                           ("optim = 7\n[rl]\nlearning_rate = 1e-3\n", "optim"),
                                           ("train = []\n[rl]\nmax_grad_norm = 1.0\n", "train")])
def test_a_file_whose_section_is_no_table_is_named_not_a_traceback(tmp_path: Path, text: str, section: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text)
    for defaults in (None, ppo_defaults):
        with pytest.raises(ConfigError, match=rf"^config error: {section}: must be a table of keys"):
            load_config(path, defaults=defaults)


def test_a_bad_value_under_an_old_key_is_named_as_the_file_holds_it(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[rl]\nlearning_rate = "abc"\n')
    with pytest.raises(ConfigError, match=r"^config error: rl.learning_rate \(now optim.lr\) = 'abc': expected a number"):
        load_config(path, defaults=ppo_defaults)
    with pytest.raises(ConfigError, match=r"^config error: optim.lr = 'abc'"):  # the override's own value
        load_config(path, ["optim.lr=abc"], defaults=ppo_defaults)
