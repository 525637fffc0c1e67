"""Hand-edited run files read by `gputrain report`: every file a report reads, each field of it that
the report uses, given a wrong kind, NaN or infinity, an integer of 400 digits, nesting 100,000
deep, removed; the whole file emptied, replaced by binary garbage, by nesting, by a link to
/etc/passwd or to a secret outside the run, by a FIFO. The promise: exit 0 with a note naming the
file, or exit 2 with one line naming it; never a traceback, never a hang, and nothing from outside
the run directory in report.html."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gputrain.cli import main
from gputrain.evaluate.scores import Scores, save_scores
from gputrain.run import shapes
from tests.adversarial.helpers import linear_trainer

SECRET = "SECRET-7f3a9c-not-for-the-report"
DEEP = "[" * 100_000 + "]" * 100_000
HUGE = "1" + "0" * 400

LR_FIND = {
    "suggested_lr": 0.01,
    "rule": "steepest",
    "rule_text": "steepest descent",
    "suggested_index": 3,
    "other_rules": {"valley": 0.02},
    "ranks_agreeing": 1,
    "stopped": "diverged",
    "start_lr": 1e-5,
    "end_lr": 1.0,
    "steps": 8,
    "steps_run": 6,
    "lrs": [1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0],
    "losses": [2.3, 2.2, 2.0, 1.5, 3.0, None],
    "smoothed": [2.3, 2.25, 2.1, 1.8, 2.4, None],
    "batch_size": 16,
    "grad_accum": 1,
    "precision": "fp32",
    "device": "cpu",
    "world_size": 1,
}
PROFILE = {
    "facts": {"step_time_s": 0.01, "device": "cpu"},
    "findings": [{"bottleneck": "data", "evidence": "60% waiting", "change": "data.num_workers=4"}],
    "top_device_ops": [],
    "top_host_ops": [{"name": "aten::addmm", "calls": 10, "self_host_us": 120.0, "self_device_us": 0}],
}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run with every file a report reads: its own, and a sweep's, a profile's, test scores
    and an error log beside them."""
    run_dir = tmp_path_factory.mktemp("runs") / "run"
    linear_trainer(run_dir).fit()
    (run_dir / "lr_find.json").write_text(json.dumps(LR_FIND))
    (run_dir / "profile.json").write_text(json.dumps(PROFILE))
    (run_dir / "error.log").write_text("Traceback (most recent call last):\nValueError: boom\n")
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(3), size=20).astype(np.float32)
    save_scores(run_dir / "scores-test.npz", Scores("classification", probs, rng.integers(0, 3, 20), 20))
    return run_dir


def _report(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["report", str(run_dir)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ----------------------------------------------------------------- the cases


Edit = Callable[[Path], None]


def _set_field(name: str, key: str, value: str | None) -> Edit:
    """`name`'s field `key` (a/b for a nested one) set to the JSON text `value`, or removed (None)."""

    def edit(run_dir: Path) -> None:
        record = json.loads((run_dir / name).read_text())
        *parents, last = key.split("/")
        inner = record
        for parent in parents:
            inner = inner.setdefault(parent, {})
        inner.pop(last, None)
        if value is None:
            (run_dir / name).write_text(json.dumps(record))
            return
        inner[last] = "@@VALUE@@"
        (run_dir / name).write_text(json.dumps(record).replace('"@@VALUE@@"', value))

    return edit


def _set_list_item(name: str, key: str, value: str) -> Edit:
    """The first object of `name`'s list `key` given `value` (JSON text) in place of each field."""

    def edit(run_dir: Path) -> None:
        record = json.loads((run_dir / name).read_text())
        record[key] = [dict.fromkeys(record[key][0] if record[key] else ["name"], "@@VALUE@@")]
        (run_dir / name).write_text(json.dumps(record).replace('"@@VALUE@@"', value))

    return edit


WRONG = {
    "text": '"abc"',
    "list": "[1, 2]",
    "object": '{"a": 1}',
    "bool": "true",
    "null": "null",
    "nan": "NaN",
    "inf": "-Infinity",
    "huge": HUGE,
    "deep": DEEP,
    "markup": '"<script>alert(1)</script>"',
}
JSON_FILES = {
    "summary.json": shapes.SUMMARY,
    "env.json": shapes.ENV,
    "lr_find.json": shapes.LR_FIND,
    "profile.json": shapes.PROFILE,
}


def _field_cases() -> list[Any]:
    cases = []
    for name, shape in JSON_FILES.items():
        nested = {**(shape.nested or {})}
        keys = [(key, key) for key in shape.fields]
        keys += [(f"{outer}/{key}", f"{outer}.{key}") for outer, inner in nested.items() for key in inner.fields]
        for key, shown in keys:
            for wrong, value in WRONG.items():
                cases.append(pytest.param(name, _set_field(name, key, value), id=f"{name}-{shown}-{wrong}"))
            cases.append(pytest.param(name, _set_field(name, key, None), id=f"{name}-{shown}-missing"))
        for key in (shape.each or {}):
            for wrong in ("text", "huge", "nan", "object"):
                cases.append(
                    pytest.param(name, _set_list_item(name, key, WRONG[wrong]), id=f"{name}-{key}[0]-{wrong}")
                )
    return cases


def _write(name: str, data: bytes | str) -> Edit:
    def edit(run_dir: Path) -> None:
        path = run_dir / name
        path.unlink(missing_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())

    return edit


def _secret_file(path: Path, name: str) -> None:
    """A file outside the run holding SECRET where the report would show it, were the link followed."""
    if name == "scores-test.npz":
        np.savez(path, task=np.array(SECRET), scores=_probs(), targets=np.zeros(10), total=np.array(10))
        return
    texts = {
        "summary.json": json.dumps({"status": "failed", "global_step": 10**6, "error": SECRET}),
        "env.json": json.dumps({"secret": SECRET}),
        "lr_find.json": json.dumps({**LR_FIND, "rule_text": SECRET}),
        "profile.json": json.dumps({"facts": {"secret": SECRET}}),
        "metrics.jsonl": json.dumps({"step": 1, "split": SECRET, "accuracy": 0.5}),
        "config.toml": f'[data]\nname = "{SECRET}"\n',
        "model.safetensors": SECRET,
    }
    path.write_text(texts.get(name, f"{SECRET}\n"))


def _link(name: str, target: str) -> Edit:
    def edit(run_dir: Path) -> None:
        (run_dir / name).unlink(missing_ok=True)
        if target == "secret":
            secret = run_dir.parent / f"secret-{name}"
            _secret_file(secret, name)
            os.symlink(secret, run_dir / name)
            if name == "error.log":  # a report shows the log of a failed run
                _set_field("summary.json", "status", '"failed"')(run_dir)
        else:
            os.symlink(target, run_dir / name)

    return edit


def _fifo(name: str) -> Edit:
    def edit(run_dir: Path) -> None:
        (run_dir / name).unlink(missing_ok=True)
        os.mkfifo(run_dir / name)

    return edit


def _folder(name: str) -> Edit:
    def edit(run_dir: Path) -> None:
        (run_dir / name).unlink(missing_ok=True)
        (run_dir / name).mkdir()
        (run_dir / name / "inside").write_text(SECRET)

    return edit


def _oversize(name: str) -> Edit:
    def edit(run_dir: Path) -> None:
        with open(run_dir / name, "r+b") as f:  # sparse: large without taking the disk
            f.truncate(1 << 30)

    return edit


READ_FILES = ("summary.json", "env.json", "lr_find.json", "profile.json", "metrics.jsonl", "config.toml",
              "error.log", "scores-test.npz")


def _whole_file_cases() -> list[Any]:
    cases = []
    for name in READ_FILES:
        edits: dict[str, Edit] = {
            "empty": _write(name, b""),
            "garbage": _write(name, bytes(range(256)) * 4),
            "deep": _write(name, DEEP),
            "huge-int": _write(name, HUGE * 20),
            "a-list": _write(name, "[1, 2, 3]"),
            "link-passwd": _link(name, "/etc/passwd"),
            "link-secret": _link(name, "secret"),
            "link-dev-null": _link(name, "/dev/null"),
            "link-to-nothing": _link(name, "/nonexistent/file"),
            "fifo": _fifo(name),
            "folder": _folder(name),
        }
        if name != "error.log":  # a log's tail is read, whatever its size
            edits["oversize"] = _oversize(name)
        cases += [pytest.param(name, edit, id=f"{name}-{what}") for what, edit in edits.items()]
    return cases


def _metrics_row(text: str) -> Edit:
    def edit(run_dir: Path) -> None:
        with open(run_dir / "metrics.jsonl", "a") as f:
            f.write(text + "\n")

    return edit


METRICS_ROWS = {
    "step-text": '{"step": "abc", "loss": 1.0}',
    "step-nan": '{"step": NaN, "loss": 1.0}',
    "step-inf": '{"step": Infinity, "loss": 1.0}',
    "step-huge": f'{{"step": {HUGE}, "loss": 1.0}}',
    "loss-huge": f'{{"step": 100, "loss": {HUGE}}}',
    "loss-nan": '{"step": 100, "loss": NaN}',
    "loss-text": '{"step": 100, "loss": "<b>x</b>"}',
    "split-list": '{"step": 100, "split": [1], "accuracy": 0.5}',
    "split-object": '{"step": 100, "split": {"a": 1}, "accuracy": 0.5}',
    "eval-huge": f'{{"step": 100, "split": "val", "accuracy": {HUGE}}}',
    "eval-bool": '{"step": 100, "split": "val", "accuracy": true}',
    "row-deep": '{"step": 100, "x": ' + DEEP + "}",
    "row-list": "[1, 2]",
    "row-text": '"abc"',
    "long-line": '{"step": 100, "loss": 1.0, "pad": "' + "x" * (2 << 20) + '"}',
    "many-keys": json.dumps({"step": 100, **{f"k{i}": 1.0 for i in range(5000)}}),
    "distinct-keys": "\n".join(json.dumps({"step": 100 + i, f"k{i}": 1.0}) for i in range(2000)),
    "many-splits": "\n".join(json.dumps({"step": 100, "split": f"s{i}", "accuracy": 0.5}) for i in range(50)),
    "garbage": "\x00\xff\xfe garbage",
}


def _toml(text: str) -> Edit:
    return _write("config.toml", text)


CONFIG_CASES = {
    "section-not-table": "data = 5\n",
    "task-list": '[data]\ntask = [1, 2]\nname = "csv"\n',
    "model-name-table": "[model.name]\nx = 1\n",
    "every-steps-text": '[log]\nevery_steps = "abc"\n',
    "huge-int": "[train]\nepochs = " + "9" * 5000 + "\n",
    "deep-array": "[train]\nx = " + "[" * 100_000 + "]" * 100_000 + "\n",
    "bom": "\ufeff[train]\nepochs = 2\n",
    "rl-section-list": "rl = [1]\n",
}


def _npz(**arrays: Any) -> Edit:
    def edit(run_dir: Path) -> None:
        path = run_dir / "scores-test.npz"
        path.unlink()
        with open(path, "wb") as f:
            np.savez(f, **arrays)

    return edit


def _probs(n: int = 10, c: int = 3) -> np.ndarray:
    return np.full((n, c), 1 / c, dtype=np.float32)


SCORES_CASES = {
    "unknown-task": _npz(task=np.array("lm"), scores=_probs(), targets=np.zeros(10), total=np.array(10)),
    "task-markup": _npz(task=np.array("<script>"), scores=_probs(), targets=np.zeros(10), total=np.array(10)),
    "rows-differ": _npz(task=np.array("classification"), scores=_probs(), targets=np.zeros(7), total=np.array(10)),
    "target-out-of-range": _npz(
        task=np.array("classification"), scores=_probs(), targets=np.full(10, 9), total=np.array(10)
    ),
    "target-negative": _npz(
        task=np.array("classification"), scores=_probs(), targets=np.full(10, -1), total=np.array(10)
    ),
    "target-fraction": _npz(
        task=np.array("classification"), scores=_probs(), targets=np.full(10, 0.5), total=np.array(10)
    ),
    "scores-1d": _npz(task=np.array("classification"), scores=np.zeros(10), targets=np.zeros(10), total=np.array(10)),
    "scores-3d": _npz(
        task=np.array("classification"), scores=np.zeros((10, 3, 2)), targets=np.zeros(10), total=np.array(10)
    ),
    "scores-0d": _npz(task=np.array("classification"), scores=np.array(1.0), targets=np.zeros(1), total=np.array(1)),
    "zero-rows": _npz(
        task=np.array("classification"), scores=np.zeros((0, 3)), targets=np.zeros(0), total=np.array(0)
    ),
    "zero-classes": _npz(
        task=np.array("classification"), scores=np.zeros((10, 0)), targets=np.zeros(10), total=np.array(10)
    ),
    "nan-scores": _npz(
        task=np.array("classification"), scores=_probs() * np.nan, targets=np.zeros(10), total=np.array(10)
    ),
    "complex": _npz(
        task=np.array("classification"), scores=_probs().astype(complex), targets=np.zeros(10), total=np.array(10)
    ),
    "strings": _npz(
        task=np.array("classification"), scores=np.array([["a"] * 3] * 10), targets=np.zeros(10), total=np.array(10)
    ),
    "pickled": _npz(
        task=np.array("classification"), scores=np.array([{}] * 10, dtype=object), targets=np.zeros(10),
        total=np.array(10),
    ),
    "total-huge": _npz(
        task=np.array("classification"), scores=_probs(), targets=np.zeros(10), total=np.array(2**62) * 4
    ),
    "total-negative": _npz(task=np.array("classification"), scores=_probs(), targets=np.zeros(10), total=np.array(-1)),
    "total-array": _npz(task=np.array("classification"), scores=_probs(), targets=np.zeros(10), total=np.arange(3)),
    "missing-targets": _npz(task=np.array("classification"), scores=_probs(), total=np.array(10)),
    "regression-mismatch": _npz(
        task=np.array("regression"), scores=np.zeros((10, 2)), targets=np.zeros((10, 3)), total=np.array(10)
    ),
    "task-array": _npz(task=np.array(["a", "b"]), scores=_probs(), targets=np.zeros(10), total=np.array(10)),
}


def _linked_parent(run_dir: Path) -> None:
    """The run directory's files reached through a folder link: summary.json leads to a folder
    outside by way of a link inside."""
    outside = run_dir.parent / "outside-folder"
    outside.mkdir(exist_ok=True)
    (outside / "summary.json").write_text(json.dumps({"status": SECRET, "global_step": 1}))
    os.symlink(outside, run_dir / "sub")
    (run_dir / "summary.json").unlink()
    os.symlink("sub/summary.json", run_dir / "summary.json")


def _link_inside(run_dir: Path) -> None:
    """A link that stays inside the run directory is read as train's rules allow."""
    (run_dir / "summary.json").rename(run_dir / "summary-copy.json")
    os.symlink("summary-copy.json", run_dir / "summary.json")


OTHER_CASES: dict[str, tuple[str, Edit]] = {
    "linked-parent": ("summary.json", _linked_parent),
    "link-inside": ("summary.json", _link_inside),
    "lr_find-lengths-differ": ("lr_find.json", _set_field("lr_find.json", "lrs", "[1, 2]")),
    "lr_find-empty-curve": ("lr_find.json", _set_field("lr_find.json", "lrs", "[]")),
    "lr_find-suggested-negative": ("lr_find.json", _set_field("lr_find.json", "suggested_lr", "-1")),
    "lr_find-lr-zero": ("lr_find.json", _set_field("lr_find.json", "lrs", "[0, 1, 2, 3, 4, 5]")),
    "lr_find-lr-negative": ("lr_find.json", _set_field("lr_find.json", "lrs", "[-1, 1, 2, 3, 4, 5]")),
    "lr_find-other-rule-zero": ("lr_find.json", _set_field("lr_find.json", "other_rules", '{"valley": 0}')),
    "lr_find-losses-huge": ("lr_find.json", _set_field("lr_find.json", "losses", "[1e308, 1e308, 1, 1, 1, 1]")),
    "lr_find-config-not-tables": ("lr_find.json", _set_field("lr_find.json", "config", '{"data": 5}')),
    "summary-status-unknown": ("summary.json", _set_field("summary.json", "status", '"<b>weird</b>"')),
    "summary-step-negative": ("summary.json", _set_field("summary.json", "global_step", "-5")),
    "summary-interrupted-world-huge": ("summary.json", _set_field("summary.json", "world_size", HUGE)),
    "summary-val-text": ("summary.json", _set_field("summary.json", "val", '{"accuracy": "abc"}')),
    "summary-train-breakdown-text": (
        "summary.json", _set_field("summary.json", "train/time_breakdown", '{"data": "x"}')
    ),
    "summary-rl-solved-text": ("summary.json", _set_field("summary.json", "rl", '{"solved": "yes", "env": 5}')),
    "env-run-world-text": ("env.json", _set_field("env.json", "run", '{"world_size": "two"}')),
    "profile-facts-list": ("profile.json", _set_field("profile.json", "facts", "[1]")),
    "profile-findings-texts": ("profile.json", _set_field("profile.json", "findings", '["a", "b"]')),
}

ALL = (
    _field_cases()
    + _whole_file_cases()
    + [pytest.param("metrics.jsonl", _metrics_row(r), id=f"metrics.jsonl-{what}") for what, r in METRICS_ROWS.items()]
    + [pytest.param("config.toml", _toml(text), id=f"config.toml-{what}") for what, text in CONFIG_CASES.items()]
    + [pytest.param("scores-test.npz", edit, id=f"scores-test.npz-{what}") for what, edit in SCORES_CASES.items()]
    + [pytest.param(name, edit, id=what) for what, (name, edit) in OTHER_CASES.items()]
)


@pytest.mark.parametrize(("name", "edit"), ALL)
def test_a_hand_edited_run_file(base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str,
                                edit: Edit) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(base, run_dir, symlinks=True)
    edit(run_dir)
    code, out, err = _report(run_dir, capsys)
    assert "Traceback" not in out + err
    if code == 2:
        assert len(err.strip().splitlines()) == 1, err
        assert name in err, err
        assert not (run_dir / "report.html").exists()
        return
    assert code == 0, err
    html = (run_dir / "report.html").read_text()
    assert SECRET not in html and "root:x:0:0" not in html
    assert SECRET not in out


def _is_refused(name: str, out: str) -> bool:
    return any(line.startswith("note: run: ") and name in line for line in out.splitlines())


@pytest.mark.parametrize(
    ("name", "target"),
    [(n, t) for n in READ_FILES for t in ("/etc/passwd", "secret", "/dev/null")],
)
def test_a_link_out_of_the_run_is_a_note_naming_it(base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    name: str, target: str) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(base, run_dir, symlinks=True)
    _link(name, target)(run_dir)
    code, out, err = _report(run_dir, capsys)
    assert code == 0, err
    assert _is_refused(name, out), out
    assert "leading out of the run directory" in out


# ----------------------------------------------------------------- the use commands: `gputrain evaluate`

USE_RUN = ["model.name=mlp", "model.hidden_sizes=[8]", "data.name=synthetic", "data.shape=[4]",
           "data.num_samples=128", "train.batch_size=32", "train.device=cpu", "log.progress=none",
           "log.tensorboard=false", "train.epochs=2"]


@pytest.fixture(scope="module")
def use_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run trained from a config (so evaluate can rebuild its data), with a checkpoint per epoch and
    the best step tracked on its validation split."""
    import contextlib
    import io

    from gputrain.train.trainer import Trainer

    run_dir = tmp_path_factory.mktemp("use") / "run"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        Trainer.from_config(None, run_dir=run_dir, overrides=USE_RUN).fit()
    return run_dir


def _state(edit_loop: Callable[[dict[str, Any]], None] | None = None, whole: Any = None) -> Edit:
    """The last checkpoint's state.pt with its loop state edited (or replaced by `whole`), sealed again
    as someone who controls the files would."""

    def edit(run_dir: Path) -> None:
        import torch

        from tests.unit.checkpoint.helpers import reseal

        ckpt = sorted((run_dir / "checkpoints").glob("step-*"), key=lambda p: int(p.name[5:]))[-1]
        state = torch.load(ckpt / "state.pt", weights_only=True)
        if edit_loop is not None:
            edit_loop(state)
        torch.save(state if whole is None else whole, ckpt / "state.pt")
        reseal(ckpt)

    return edit


def _loop(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(state: dict[str, Any]) -> None:
        if key == "loop":
            state["loop"] = value
        else:
            state["loop"][key] = value

    return edit


class _Hostile:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("touch PWNED",))


USE_CASES: dict[str, tuple[str, Edit, tuple[str, ...]]] = {
    # (the file named, the edit, the --checkpoint used)
    "config-link-passwd": ("config.toml", _link("config.toml", "/etc/passwd"), ()),
    "config-link-secret": ("config.toml", _link("config.toml", "secret"), ()),
    "config-fifo": ("config.toml", _fifo("config.toml"), ()),
    "config-oversize": ("config.toml", _oversize("config.toml"), ()),
    "config-garbage": ("config.toml", _write("config.toml", bytes(range(256))), ()),
    "config-deep": ("config.toml", _write("config.toml", "[train]\nx = " + "[" * 100_000 + "]" * 100_000), ()),
    "config-huge-int": ("config.toml", _write("config.toml", "[train]\nepochs = " + "9" * 5000), ()),
    "config-section-not-table": ("config.toml", _write("config.toml", "train = 5\n"), ()),
    "config-dev-null": ("config.toml", _link("config.toml", "/dev/null"), ()),
    "summary-link-secret": ("summary.json", _link("summary.json", "secret"), ()),
    "summary-fifo": ("summary.json", _fifo("summary.json"), ()),
    "summary-deep": ("summary.json", _write("summary.json", DEEP), ()),
    "summary-huge-int": ("summary.json", _write("summary.json", HUGE * 20), ()),
    "summary-garbage": ("summary.json", _write("summary.json", bytes(range(256))), ()),
    "summary-oversize": ("summary.json", _oversize("summary.json"), ()),
    "summary-step-text": ("summary.json", _set_field("summary.json", "global_step", '"8"'), ()),
    "summary-step-huge": ("summary.json", _set_field("summary.json", "global_step", HUGE), ()),
    "summary-step-nan": ("summary.json", _set_field("summary.json", "global_step", "NaN"), ()),
    "summary-a-list": ("summary.json", _write("summary.json", "[]"), ()),
    "weights-link-secret": ("model.safetensors", _link("model.safetensors", "secret"), ()),
    "weights-fifo": ("model.safetensors", _fifo("model.safetensors"), ()),
    "checkpoints-link-out": ("checkpoints", lambda d: _move_out(d, "checkpoints"), ("--checkpoint", "last")),
    "best-loop-text": ("best", _state(_loop("loop", "x")), ("--checkpoint", "best")),
    "best-step-text": ("best", _state(_loop("best_step", "4")), ("--checkpoint", "best")),
    "best-step-bool": ("best", _state(_loop("best_step", True)), ("--checkpoint", "best")),
    "best-step-negative": ("best", _state(_loop("best_step", -4)), ("--checkpoint", "best")),
    "best-step-huge": ("best", _state(_loop("best_step", 10**400)), ("--checkpoint", "best")),
    "best-step-float": ("best", _state(_loop("best_step", 4.0)), ("--checkpoint", "best")),
    "best-step-missing-checkpoint": ("best", _state(_loop("best_step", 3)), ("--checkpoint", "best")),
    "best-state-a-list": ("best", _state(whole=[1, 2]), ("--checkpoint", "best")),
    "best-state-pickled": ("best", _state(whole={"loop": _Hostile()}), ("--checkpoint", "best")),
}


def _move_out(run_dir: Path, name: str) -> None:
    outside = run_dir.parent / f"outside-{name.replace('/', '-')}"
    shutil.move(run_dir / name, outside)
    os.symlink(outside, run_dir / name)


@pytest.mark.parametrize(("name", "edit", "options"), [pytest.param(*v, id=k) for k, v in USE_CASES.items()])
def test_evaluate_on_a_hand_edited_run(use_base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch, name: str, edit: Edit,
                                       options: tuple[str, ...]) -> None:
    """`gputrain evaluate` reads config.toml, summary.json, the weights and a checkpoint's state by the
    run's rules: a file it needs, refused, is one line naming it (exit 2); summary.json only says
    which step the final weights are from, so a damaged one leaves the step unknown."""
    run_dir = tmp_path / "run"
    shutil.copytree(use_base, run_dir, symlinks=True)
    edit(run_dir)
    monkeypatch.chdir(tmp_path)
    code = main(["evaluate", str(run_dir), *options, "--output-dir", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    assert not (tmp_path / "PWNED").exists()
    assert SECRET not in captured.out + captured.err
    if name == "summary.json" and "link" not in edit.__qualname__ and "fifo" not in edit.__qualname__:
        assert code == 0, captured.err  # the final weights, their step unknown
        return
    assert code == 2, captured.out + captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and name in lines[0], captured.err


@pytest.mark.parametrize(("name", "edit"), ALL)
def test_a_hand_edited_run_compared_with_a_whole_one(base: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str], name: str,
                                                     edit: Edit) -> None:
    """The comparison page reads the same files and draws them side by side: the same promise."""
    run_dir = tmp_path / "run"
    shutil.copytree(base, run_dir, symlinks=True)
    edit(run_dir)
    out_file = tmp_path / "compare.html"
    code = main(["report", str(base), str(run_dir), "-o", str(out_file)])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    if code == 2:
        assert len(captured.err.strip().splitlines()) == 1 and name in captured.err, captured.err
        return
    assert code == 0, captured.err
    html = out_file.read_text()
    assert SECRET not in html and "root:x:0:0" not in html


@pytest.mark.parametrize("row", ["step-huge", "step-nan", "row-deep", "row-list", "garbage", "split-list"])
def test_a_continued_run_reads_its_hand_edited_metrics(base: Path, tmp_path: Path, warned: list[str],
                                                       row: str) -> None:
    """Resuming cuts metrics.jsonl back to the checkpoint's step, passing over damaged lines (said once)."""
    run_dir = tmp_path / "run"
    shutil.copytree(base, run_dir, symlinks=True)
    _metrics_row(METRICS_ROWS[row])(run_dir)
    summary = linear_trainer(run_dir, **{"train.epochs": 3}).fit()
    assert summary["status"] == "completed" and summary["global_step"] == 12
    damaged = row != "split-list"  # a row with a numeric step: after the resume step, so cut with the rest
    assert any("damaged line" in w for w in warned) == damaged, warned


@pytest.mark.parametrize("choice", ["last", "best"])
def test_a_checkpoint_linked_from_outside_is_passed_over(use_base: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str], warned: list[str],
                                                         choice: str) -> None:
    """checkpoints/step-4 a link to a checkpoint outside the run (a whole one: it verifies): not this
    run's weights, so passed over as damaged, and said."""
    run_dir = tmp_path / "run"
    shutil.copytree(use_base, run_dir, symlinks=True)
    _move_out(run_dir, "checkpoints/step-4")
    code = main(["evaluate", str(run_dir), "--checkpoint", choice, "--output-dir", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    said = " ".join([*warned, captured.err])
    assert "step-4" in said and "leading out of the run directory" in said, said
    if code == 0:
        said = captured.out + captured.err  # the weights used are said on stderr
        assert "weights (step 2)" in said and "(step 4)" not in said, said
    else:
        assert code == 2 and len(captured.err.strip().splitlines()) == 1


@pytest.mark.parametrize("what", ["link-passwd", "link-secret", "fifo", "oversize", "folder"])
def test_lr_find_reads_a_runs_config_by_the_runs_rules(base: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str], what: str) -> None:
    """`lr-find --run-dir RUN` starts from RUN's config.toml: one leading out of the run, or not a
    regular file, is one line naming it, before any work."""
    run_dir = tmp_path / "run"
    shutil.copytree(base, run_dir, symlinks=True)
    sweep = (run_dir / "lr_find.json").read_bytes()
    if what == "folder":
        (run_dir / "config.toml").unlink()
        (run_dir / "config.toml").mkdir()
    else:
        edits = {"link-passwd": _link("config.toml", "/etc/passwd"), "link-secret": _link("config.toml", "secret"),
                 "fifo": _fifo("config.toml"), "oversize": _oversize("config.toml")}
        edits[what](run_dir)
    code = main(["lr-find", "--run-dir", str(run_dir), "--steps", "5"])
    captured = capsys.readouterr()
    assert code == 2, captured.out + captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "config.toml" in lines[0] and SECRET not in captured.err, captured.err
    assert (run_dir / "lr_find.json").read_bytes() == sweep
