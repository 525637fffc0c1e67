"""Config values a new user or an attacker would try (issue 13, section 4): NaN and ±Inf in every
float field, integers beyond what each int field's consumer takes, control characters in every
string field, wrong types, unknown keys and sections, malformed TOML files and overrides, and the
run directory's config.toml round trip.

Every bad value is a ConfigError (or UsageError) naming the field or file, raised by `load_config`
before torch is imported; through the real command (a handful of cases, in a subprocess) it is
exit 2, one line on stderr, no traceback, and torch never imported. The fields are read from the
schema, so a field added later is attacked too.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any, Literal

import pytest

from gputrain.config import Config, config_to_toml, load_config
from gputrain.config.limits import LIMITS
from gputrain.config.schema import SECTIONS
from gputrain.errors import ConfigError, UsageError

ROOT = Path(__file__).resolve().parents[2]
HINTS = {f"{s}.{f.name}": typing.get_type_hints(cls)[f.name] for s, cls in SECTIONS.items()
         for f in dataclasses.fields(cls)}


def _leaves(annotation: Any) -> set[Any]:
    """The plain types a field's annotation is made of (Literal choices count as their type, tagged)."""
    if typing.get_origin(annotation) is Literal:
        return {("literal", type(a)) for a in typing.get_args(annotation)}
    args = typing.get_args(annotation)
    return set().union(*map(_leaves, args)) if args else {annotation}


def _is_list(key: str) -> bool:
    return "list[" in str(HINTS[key])


FLOAT_FIELDS = sorted(k for k, a in HINTS.items() if float in _leaves(a))
INT_FIELDS = sorted(k for k, a in HINTS.items() if int in _leaves(a))
TEXT_FIELDS = sorted(k for k, a in HINTS.items() if str in _leaves(a))  # free text, not Literal choices


def rejected(source: Any = None, overrides: Any = (), *, field: str, words: tuple[str, ...] = ()) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(source, overrides)
    err = info.value
    assert err.field == field, str(err)
    for word in words:
        assert word in str(err), (word, str(err))
    assert "Traceback" not in str(err) and len(str(err).splitlines()) <= 2 and len(str(err)) < 400
    return err


def test_the_schema_has_the_fields_attacked_below():
    assert len(FLOAT_FIELDS) >= 13 and len(INT_FIELDS) >= 38 and len(TEXT_FIELDS) >= 10
    assert {"optim.lr", "optim.eps", "train.clip_grad_norm", "parallel.timeout_s"} <= set(FLOAT_FIELDS)
    assert {"train.seed", "train.batch_size", "model.hidden_sizes", "data.num_samples"} <= set(INT_FIELDS)
    assert {"data.path", "checkpoint.resume", "eval.metrics", "train.device"} <= set(TEXT_FIELDS)


# --- NaN and ±Inf in every float field (TOML's nan, inf, -inf; 1e999 reads as inf) -----------------

@pytest.mark.parametrize("literal", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("key", FLOAT_FIELDS)
def test_non_finite_float(key: str, literal: str) -> None:
    value = f"[0.9, {literal}]" if _is_list(key) else literal
    rejected(None, [f"{key}={value}"], field=key, words=(f"{key} = ", "must be a finite number"))


# --- integers beyond what each int field's consumer takes -----------------------------------------

@pytest.mark.parametrize("beyond", ["bound+1", "2**63"])
@pytest.mark.parametrize("key", INT_FIELDS)
def test_int_beyond_its_bound(key: str, beyond: str) -> None:
    high = int(LIMITS[key].high)
    value = high + 1 if beyond == "bound+1" else 2**63  # 2**63: int64's end, where torch and numpy stop
    said = LIMITS[key].text or f"at most {high}"  # a range in words (parallel degrees, milestones) or the bound
    rejected({key: [value] if _is_list(key) else value}, field=key, words=(f"must be {said}",))


@pytest.mark.parametrize("overrides, field, words", [
    (["train.seed=9223372036854775808"], "train.seed", ("at most 4294967295", "numpy seeds are 32-bit")),
    (["train.seed=4294967296"], "train.seed", ("at most 4294967295",)),
    (["train.batch_size=9223372036854775807"], "train.batch_size", ("at most 16777216",)),
    (["model.hidden=100000000000"], "model.hidden", ("at most 65536",)),
    (["train.seed=" + "9" * 5000], "train.seed", ("cannot be read", "number too long")),
    (["optim.lr=1" + "0" * 400], "optim.lr", ("must be a finite number",)),  # an int beyond float's range
    (["model.name=gpt", "model.n_layer=1024", "model.d_model=65536", "model.n_head=64"], "model.d_model",
     ("parameters", "machine's memory of")),  # 211 TB of weights: no machine has the memory
    (["data.name=synthetic", "data.num_samples=2000000000", "data.shape=[3, 224, 224]"], "data.num_samples",
     ("fp32 samples of shape [3, 224, 224]", "machine's memory of")),
])
def test_named_huge_values(overrides: list[str], field: str, words: tuple[str, ...]) -> None:
    rejected(None, overrides, field=field, words=words)


# --- control characters in every string field, through each way in -------------------------------

@pytest.mark.parametrize("way, char", [("override", "\n"), ("toml file", "\x00"), ("mapping", "\x1b")])
@pytest.mark.parametrize("key", TEXT_FIELDS)
def test_control_character_in_a_string(tmp_path: Path, key: str, way: str, char: str) -> None:
    text = f"x{char}y"
    value: Any = [text] if _is_list(key) else text
    section, _, name = key.partition(".")
    words = (f"control character U+{ord(char):04X}",)
    if way == "override":
        rejected(None, [f"{key}={text}"] if not _is_list(key) else [f'{key}=["x\\ny"]'], field=key, words=words)
    elif way == "toml file":
        path = tmp_path / "c.toml"
        literal = '"x\\u0000y"'
        path.write_text(f"[{section}]\n{name} = {f'[{literal}]' if _is_list(key) else literal}\n")
        rejected(path, field=key, words=words)
    else:
        rejected({key: value}, field=key, words=words)


# --- wrong types -----------------------------------------------------------------------------------

@pytest.mark.parametrize("override, field, words", [
    ("train.epochs=ten", "train.epochs", ("expected an integer",)),
    ("train.epochs=true", "train.epochs", ("expected an integer",)),
    ("train.epochs=2.5", "train.epochs", ("expected an integer",)),
    ("optim.lr=fast", "optim.lr", ("expected a number",)),
    ("optim.lr=[0.1]", "optim.lr", ("expected a number",)),
    ("optim.betas=0.9", "optim.betas", ("expected a list of numbers",)),
    ("model.hidden_sizes=[64, 1.5]", "model.hidden_sizes", ("expected a list of integers",)),
    ("model.hidden_sizes=[[64]]", "model.hidden_sizes", ("expected a list of integers",)),
    ("train.compile=yes", "train.compile", ("expected true or false",)),
    ("data.path=3", "data.path", ("expected a string",)),
    ("train.epochs=1979-05-27", "train.epochs", ("expected an integer",)),  # a TOML date
    ("train.epochs={a = 1}", "train.epochs", ("expected an integer",)),  # a TOML inline table
])
def test_wrong_type(override: str, field: str, words: tuple[str, ...]) -> None:
    rejected(None, [override], field=field, words=words)


# --- unknown keys and sections ---------------------------------------------------------------------

@pytest.mark.parametrize("source, field, words", [
    ({"train.bach_size": 32}, "train.bach_size", ("unknown key", "did you mean 'batch_size'")),
    ({"trian.epochs": 3}, "trian", ("unknown section", "did you mean 'train'")),
    ({"train.epochs.x": 3}, "train.epochs.x", ("section.key",)),
    ("[train]\nepoch = 3\n", "train.epoch", ("unknown key", "did you mean 'epochs'")),
    ("epochs = 3\n", "epochs", ("unknown section",)),
    ("[train.sub]\nx = 1\n", "train.sub", ("unknown key",)),
    ("train = 3\n", "train", ("must be a table",)),
    ("[[train]]\nepochs = 3\n", "train", ("must be a table",)),
])
def test_unknown_key_or_section(tmp_path: Path, source: Any, field: str, words: tuple[str, ...]) -> None:
    if isinstance(source, str):
        path = tmp_path / "c.toml"
        path.write_text(source)
        source = path
    rejected(source, field=field, words=words)


# --- malformed TOML files and overrides ------------------------------------------------------------

@pytest.mark.parametrize("content, words", [
    (b"[train\nepochs = 3\n", ("is not valid TOML", "line 1")),
    (b"[train]\nepochs = 3\nepochs = 4\n", ("is not valid TOML", "line 3")),
    (b"[train]\nepochs = \n", ("is not valid TOML",)),
    (b"[data]\npath = 'unclosed\n", ("is not valid TOML",)),
    (b"[data]\npath = \"a\x01b\"\n", ("is not valid TOML",)),  # a raw control character, not escaped
    (b"[data]\npath = \"\xff\xfe\"\n", ("is not UTF-8 text",)),
    (b"[train]\nseed = " + b"9" * 5000 + b"\n", ("cannot be read", "number too long")),
    (b"[optim]\nbetas = " + b"[" * 3000 + b"]" * 3000 + b"\n", ("cannot be read", "nested too deeply")),
    (b'{"train": {"epochs": 3}}\n', ("is not valid TOML",)),  # JSON is not TOML
])
def test_malformed_toml_file_names_the_file(tmp_path: Path, content: bytes, words: tuple[str, ...]) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(content)
    with pytest.raises(UsageError) as info:
        load_config(path)
    assert str(path) in str(info.value) and len(str(info.value).splitlines()) == 1
    for word in words:
        assert word in str(info.value), str(info.value)


def test_config_path_that_is_missing_or_a_folder(tmp_path: Path) -> None:
    for path in (tmp_path / "missing.toml", tmp_path):
        with pytest.raises(UsageError, match=f"config file not found: {re.escape(str(path))}"):
            load_config(path)


def test_byte_order_mark_is_read_as_utf8(tmp_path: Path) -> None:
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf[train]\nepochs = 3\n")  # what Windows editors save
    assert load_config(path).train.epochs == 3


@pytest.mark.parametrize("override, kind, words", [
    ("train.epochs", UsageError, ("section.key=value",)),
    ("=3", UsageError, ("section.key=value",)),
    ("train..epochs=1", ConfigError, ("train..epochs", "config keys are section.key")),
    ("train.ep-ochs=2", UsageError, ("section.key=value",)),
    ("train.epochs=" + "[" * 3000 + "]" * 3000, ConfigError, ("train.epochs", "nested too deeply")),
    ("train.epochs=3\n[optim]\nlr = 5", ConfigError, ("train.epochs", "more than one value")),  # TOML smuggled in
    ('data.path="x"\nepochs = 5', ConfigError, ("data.path", "an override is one line")),
])
def test_malformed_override(override: str, kind: type[Exception], words: tuple[str, ...]) -> None:
    with pytest.raises(kind) as info:
        load_config(None, [override])
    for word in words:
        assert word in str(info.value)
    assert len(str(info.value)) < 300


# --- the run directory's config.toml reloads to an equal Config ------------------------------------

@pytest.mark.parametrize("overrides", [
    {"data.path": 'C:\\data\\"quoted" file.csv'},
    {"data.path": "\\\\server\\share\\x.csv", "data.val_path": "\\u0041 is six characters here"},
    {"checkpoint.resume": "runs/é 🙂 \u2028 \u200b/ckpt"},
    {"data.label_column": "'''", "eval.early_stop_metric": '"""'},
    {"eval.metrics": ["accuracy", 'f"1', "loss\\"]},
    {"optim.lr": 5e-324, "optim.min_lr": 0.1, "optim.betas": [0.0, 0.9999999999999999]},
    {"optim.weight_decay": -0.0, "parallel.timeout_s": 604800, "train.clip_grad_norm": 1e-300},
    {"data.image_size": [224, 160], "optim.milestones": [1, 2147483647], "train.seed": 4294967295},
])
def test_saved_config_reloads_equal(tmp_path: Path, overrides: dict[str, Any]) -> None:
    config = load_config(overrides)
    path = tmp_path / "config.toml"
    path.write_text(config_to_toml(config), encoding="utf-8")
    assert load_config(path) == config
    assert load_config(path) != Config()


# --- the real command: exit 2, one line, no traceback, torch never imported ------------------------

def gputrain(*args: str | bytes, tmp_path: Path) -> tuple[subprocess.CompletedProcess[bytes], list[str]]:
    """Run `python -X importtime -m gputrain ARGS`; returns the process and its stderr minus the
    import-time lines, which are scanned for torch."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")} | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "gputrain", *args], cwd=tmp_path, env=env,
                          capture_output=True, timeout=120)
    lines = done.stderr.decode("utf-8", "backslashreplace").splitlines()
    imported = [line for line in lines if line.startswith("import time:")]
    assert not [line for line in imported if re.search(r"\|\s*torch(\.|\s*$)", line)], "torch was imported"
    assert any("gputrain.config" in line for line in imported)  # the scan sees the imports
    return done, [line for line in lines if not line.startswith("import time:")]


@pytest.mark.parametrize("args, words", [
    (["train", "optim.lr=nan"], ["config error: optim.lr = nan: must be a finite number"]),
    (["train", "--nproc-per-node", "2", "parallel.timeout_s=nan"], ["parallel.timeout_s = nan"]),
    (["train", "trian.epochs=3"], ["config error: trian: unknown section; did you mean 'train'?"]),
    (["train", "--config", "bad.toml"], ["bad.toml is not valid TOML", "line 2"]),
    (["train", b"data.path=caf\xe9.csv"], ["data.path", "not UTF-8"]),  # argv that is not UTF-8
    (["profile", "model.hidden=100000000000"], ["model.hidden = 100000000000: must be at most 65536"]),
    (["train", "train.device=tpu"], ["train.device = 'tpu': unknown device; choose from auto, cpu, cuda"]),
])
def test_real_command_exits_2_with_one_line_before_torch(tmp_path: Path, args: list[Any], words: list[str]) -> None:
    (tmp_path / "bad.toml").write_text("[train]\nepochs = = 3\n")
    done, err = gputrain(*args, "--run-dir", "run", tmp_path=tmp_path)
    assert done.returncode == 2, err
    assert len(err) == 1 and "Traceback" not in err[0], err
    for word in words:
        assert word in err[0], err
    assert not (tmp_path / "run").exists()
