"""Malformed configs and overrides: exit 2, a short error naming the field or file, no traceback,
nothing started (issue 7, figure 6). The generators below know what is valid independently of the
loader: they are written from the user contract (a bad config or override exits 2 with one short
error naming the field, before anything heavy starts) and the schema's documented ranges."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import subprocess
import sys
import tomllib
import typing
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gputrain.cli import main
from gputrain.config.limits import LIMITS
from gputrain.config.schema import SECTIONS
from tests.unit.reliability.chaos import REPO

FIELDS = {(s, f.name): typing.get_type_hints(cls)[f.name] for s, cls in SECTIONS.items()
          for f in dataclasses.fields(cls)}

# Values outside each field's documented range (type-correct, so only the range check can catch them).
OUT_OF_RANGE: dict[str, st.SearchStrategy[Any]] = {
    "train.epochs": st.integers(max_value=0), "train.max_steps": st.integers(max_value=0),
    "train.batch_size": st.integers(max_value=0), "train.grad_accum": st.integers(max_value=0),
    "train.micro_batch_size": st.integers(max_value=0), "train.seed": st.integers(max_value=-1),
    "train.clip_grad_norm": st.floats(max_value=0.0, allow_nan=False, allow_infinity=False),
    "train.clip_grad_value": st.floats(max_value=0.0, allow_nan=False, allow_infinity=False),
    "optim.lr": st.floats(max_value=0.0, allow_nan=False, allow_infinity=False),
    "optim.weight_decay": st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False),
    "optim.eps": st.floats(max_value=0.0, allow_nan=False, allow_infinity=False),
    "optim.warmup_steps": st.integers(max_value=-1), "optim.step_size": st.integers(max_value=0),
    "optim.betas": st.lists(st.floats(min_value=1.0, max_value=1e6), min_size=2, max_size=2),
    "optim.milestones": st.lists(st.integers(max_value=0), min_size=1, max_size=3),
    "data.val_fraction": st.floats(min_value=1.0, max_value=1e9) | st.floats(max_value=-1e-9, min_value=-1e9),
    "data.test_fraction": st.floats(min_value=1.0, max_value=1e9),
    "data.num_workers": st.integers(max_value=-1), "data.seq_len": st.integers(max_value=0),
    "data.num_samples": st.integers(max_value=0), "data.num_classes": st.integers(max_value=0),
    "data.shape": st.lists(st.integers(max_value=0), min_size=1, max_size=3) | st.just([]),
    "model.dropout": st.floats(min_value=1.0, max_value=1e9), "model.hidden": st.integers(max_value=0),
    "model.channels": st.lists(st.integers(max_value=0), min_size=1, max_size=3) | st.just([]),
    "model.hidden_sizes": st.lists(st.integers(max_value=0), min_size=1, max_size=3),
    "eval.every_epochs": st.integers(max_value=-1), "eval.patience": st.integers(max_value=0),
    "checkpoint.every_steps": st.integers(max_value=-1), "checkpoint.keep_last": st.integers(max_value=0),
    "log.every_steps": st.integers(max_value=0),
    "parallel.tp": st.integers(max_value=-2) | st.just(0), "parallel.pp": st.integers(max_value=-2) | st.just(0),
}
# Free-text fields whose valid values are a fixed set (checked against registries or the machine).
CHOICE_TEXT = ["model.name", "data.name", "train.device"]


def _leaves(annotation: Any) -> set[Any]:
    if get_origin(annotation) is Literal:
        return {("literal", type(a)) for a in get_args(annotation)}
    return set().union(*map(_leaves, get_args(annotation))) if get_args(annotation) else {annotation}


# Issue 13: values that would reach torch, numpy or config.toml unchecked. Every float field takes
# NaN and ±Inf; every int field an integer above 2**32 (past every field's consumer: numpy seeds,
# int32 counts, sizes); every free-text field a control character.
FLOATS = sorted(k for k, a in FIELDS.items() if float in _leaves(a))
INTS = sorted(k for k, a in FIELDS.items() if int in _leaves(a))
TEXTS = sorted(k for k, a in FIELDS.items() if str in _leaves(a))

_names = st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True)
_toml_values: st.SearchStrategy[Any] = st.recursive(
    st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12),
    lambda inner: st.lists(inner, max_size=3), max_leaves=4)


def _accepts(annotation: Any, value: Any) -> bool:
    """Whether a TOML value has the type the field declares (independent of the loader)."""
    origin = get_origin(annotation)
    if origin is Literal:
        return not isinstance(value, bool) and value in get_args(annotation)
    if origin in (typing.Union, __import__("types").UnionType):
        return any(_accepts(a, value) for a in get_args(annotation))
    if origin is list:
        return isinstance(value, list) and all(_accepts(get_args(annotation)[0], v) for v in value)
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, annotation)


@st.composite
def malformed(draw: st.DrawFn) -> tuple[str, Any, str]:
    """(kind, payload, what the error must name). Payload: (dotted key, value) or raw text."""
    kind = draw(st.sampled_from(["unknown_key", "unknown_section", "wrong_type", "out_of_range", "bad_choice",
                                 "broken_toml", "bad_override", "cross_field", "non_finite", "huge_int",
                                 "control_char"]))
    if kind in ("non_finite", "huge_int", "control_char"):
        section, key = draw(st.sampled_from({"non_finite": FLOATS, "huge_int": INTS, "control_char": TEXTS}[kind]))
        if kind == "non_finite":
            value: Any = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
        elif kind == "huge_int":  # past 2**32 and past the field's own limit (rl.total_timesteps takes 2**40)
            low = max(2**32, int(LIMITS[f"{section}.{key}"].high) + 1)
            value = draw(st.integers(min_value=low, max_value=2**80))
        else:
            value = draw(st.text(max_size=4)) + draw(st.sampled_from(["\n", "\x00", "\x1b", "\x7f", "\x85"]))
        if "list[" in str(FIELDS[section, key]):
            value = [value]
        return "out_of_range", (f"{section}.{key}", value), f"{section}.{key}"
    if kind == "unknown_key":
        section = draw(st.sampled_from(sorted(SECTIONS)))
        key = draw(_names)
        assume((section, key) not in FIELDS)
        return kind, (f"{section}.{key}", draw(_toml_values)), f"{section}.{key}"
    if kind == "unknown_section":
        section = draw(_names)
        assume(section not in SECTIONS)
        return kind, (f"{section}.{draw(_names)}", draw(_toml_values)), section
    if kind == "wrong_type":
        section, key = draw(st.sampled_from(sorted(FIELDS)))
        value = draw(_toml_values)
        assume(not _accepts(FIELDS[section, key], value))
        return kind, (f"{section}.{key}", value), f"{section}.{key}"
    if kind == "out_of_range":
        dotted = draw(st.sampled_from(sorted(OUT_OF_RANGE)))
        return kind, (dotted, draw(OUT_OF_RANGE[dotted])), dotted
    if kind == "bad_choice":
        literal = [k for k, a in FIELDS.items() if get_origin(a) is Literal]
        section, key = draw(st.sampled_from(literal + [tuple(c.split(".")) for c in CHOICE_TEXT]))
        value = draw(_names)
        assume(value not in ("auto", "cpu", "cuda", "mps") and value not in get_args(FIELDS.get((section, key))))
        assume(not (key == "name" and value in ("mlp", "cnn", "digits", "csv", "synthetic")))
        return kind, (f"{section}.{key}", value), f"{section}.{key}"
    if kind == "cross_field":  # each value is fine alone; the combination (or the machine) rejects it
        word = draw(_names)
        assume(word not in ("accuracy", "precision", "recall", "f1", "auroc", "loss"))
        pairs, names = draw(st.sampled_from([
            ([("eval.metrics", ["accuracy", word])], "eval.metrics"),
            ([("eval.early_stop_metric", word)], "eval.early_stop_metric"),
            ([("checkpoint.resume", f"/nonexistent/{word}")], "checkpoint.resume"),
            ([("data.name", "csv")], "data.path"),
            ([("data.name", "csv"), ("data.path", f"/nonexistent/{word}.csv")], f"/nonexistent/{word}.csv"),
            ([("train.batch_size", 100_000)], "train.batch_size"),
            ([("train.batch_size", 64), ("train.grad_accum", 3)], "train.batch_size"),
            ([("train.clip_grad_norm", 1.0), ("train.clip_grad_value", 1.0)], "train.clip_grad_value"),
            ([("optim.name", "sgd"), ("optim.momentum", 0.0), ("optim.nesterov", True)], "optim.nesterov"),
            ([("train.precision", "fp16"), ("train.device", "cpu")], "train.precision"),
            ([("data.val_fraction", 0.5), ("data.test_fraction", 0.45)], "data.val_fraction"),
        ]))
        return kind, pairs, names
    if kind == "broken_toml":
        text = draw(st.sampled_from(["[train\nepochs = 3\n", "[train]\nepochs = \n", "[train]\nepochs = 3 3\n",
                                     "[data]\nname = 'digits\n", "[train]\nepochs = 3\nepochs = 4\n",
                                     "[optim]\nbetas = [0.9, \n", "= 3\n", "[[train]]\n[train]\n"]))
        junk = draw(st.text(st.sampled_from("[]=\"'{},#\n abc123."), max_size=6))
        text = text + junk if draw(st.booleans()) else junk + text
        try:
            tomllib.loads(text)
            assume(False)
        except tomllib.TOMLDecodeError:
            pass
        return kind, text, "config.toml"
    text = draw(st.sampled_from(["train.epochs", "epochs=3", "=3", ".=1", "train..epochs=1", "train.ep-ochs=2",
                                 "train epochs=3", "-x", "train.epochs:3"]))
    return kind, text, text.partition("=")[0].strip() or text


def _literal(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # nan, inf, -inf: TOML's spelling (JSON has none)
    if isinstance(value, list):
        return "[" + ", ".join(map(_literal, value)) + "]"
    # JSON scalars and arrays are TOML literals too, once DEL is escaped (JSON leaves it raw, TOML does not)
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def _run(args: list[str]) -> tuple[int, str]:
    err, out = io.StringIO(), io.StringIO()
    with redirect_stderr(err), redirect_stdout(out):
        try:
            code = main(args)
        except SystemExit as exit_:  # argparse's own usage errors
            code = exit_.code  # type: ignore[assignment]
    return int(code or 0), err.getvalue()


def check_rejected(tmp: Path, case: tuple[str, Any, str], via_file: bool) -> None:
    kind, payload, names = case
    run_dir = tmp / "run"
    if kind == "broken_toml" or (via_file and kind != "bad_override"):
        path = tmp / "config.toml"
        if kind == "broken_toml":
            path.write_text(payload)
        else:
            tables: dict[str, list[str]] = {}
            for k, v in (payload if kind == "cross_field" else [payload]):
                tables.setdefault(k.partition(".")[0], []).append(f"{k.partition('.')[2]} = {_literal(v)}")
            path.write_text("".join(f"[{t}]\n" + "\n".join(rows) + "\n" for t, rows in tables.items()))
        args = ["train", "--config", str(path), "--run-dir", str(run_dir)]
        names = str(path) if kind == "broken_toml" else names
    elif kind == "bad_override":
        args = ["train", "--run-dir", str(run_dir), payload]
    else:
        pairs = payload if kind == "cross_field" else [payload]
        args = ["train", "--run-dir", str(run_dir), *(f"{k}={_literal(v)}" for k, v in pairs)]
    code, err = _run(args)
    lines = err.strip().splitlines()
    assert code == 2, (case, err)
    assert "Traceback" not in err and 1 <= len(lines) <= 3, (case, err)
    assert names in err, (case, err)
    assert not run_dir.exists(), case


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture])
@given(case=malformed(), via_file=st.booleans())
def test_200_malformed_configs_exit_2_naming_the_field(tmp_path_factory: pytest.TempPathFactory,
                                                       case: tuple[str, Any, str], via_file: bool) -> None:
    check_rejected(tmp_path_factory.mktemp("fuzz"), case, via_file)


@pytest.mark.parametrize("args, names", [
    (["train.epochs=-1"], "train.epochs"),
    (["optim.name=adamm"], "optim.name"),
    (["trian.epochs=3"], "trian"),
    (["--config", "/nonexistent/config.toml"], "/nonexistent/config.toml"),
])
def test_real_processes_exit_2_without_a_traceback(tmp_path: Path, args: list[str], names: str) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "gputrain", "train", "--run-dir", str(run_dir), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) <= 3
    assert names in done.stderr
    assert not run_dir.exists()
