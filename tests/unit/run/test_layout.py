"""The run directory's layout is spelled in one place, gputrain/run/layout.py (issue 26).

The package is read with `ast`: a run file's name as a string constant of its own (`"summary.json"`)
anywhere but in layout.py is a second spelling, which a rename would miss. Docstrings (expression
statements) and comments are words for the reader, not names the code uses, so they are not counted;
nor is a message that says the name inside longer text ("no config.toml").
"""

from __future__ import annotations

import ast
import fnmatch
from collections import defaultdict
from pathlib import Path

from gputrain.run import layout

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "gputrain"
LAYOUT = "gputrain/run/layout.py"

NAMES = (
    "summary.json",
    "config.toml",
    "env.json",
    "metrics.jsonl",
    "error.log",
    "model.safetensors",
    "lr_find.json",
    "tune.json",
    "report.html",
    "checkpoints",
    "tensorboard",
)
"""A run's file and folder names that code must take from layout.py."""

ALLOWED = {
    ("gputrain/models/hf_models.py", "model.safetensors"): "a Hugging Face model folder's file, not a run's",
    ("gputrain/observe/sinks.py", "tensorboard"): "the Python package an ImportError names, not the folder",
}
"""Other uses of a name, each with why it is not the run's file."""


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that stand alone as statements (docstrings, attribute docs)."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }


def name_constants(root: Path = PACKAGE, names: tuple[str, ...] = NAMES) -> dict[str, list[str]]:
    """{name: ["path:line", ...]} of each string constant equal to one of `names` under `root`."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        skip = _docstrings(tree)
        rel = path.relative_to(root.parent).as_posix()
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names and id(node) not in skip:
                found[node.value].append(f"{rel}:{node.lineno}")
    return {name: sorted(places, key=lambda w: (w.rsplit(":", 1)[0], int(w.rsplit(":", 1)[1])))
            for name, places in found.items()}


def test_each_run_file_name_is_spelled_only_in_the_layout():
    found = name_constants()
    stray = {
        name: [where for where in places if (where.rsplit(":", 1)[0], name) not in ALLOWED and
               not where.startswith(LAYOUT + ":")]
        for name, places in found.items()
    }
    stray = {name: places for name, places in stray.items() if places}
    assert not stray, f"run file names spelled outside {LAYOUT} (use its names):\n" + "\n".join(
        f"  {name}: {', '.join(places)}" for name, places in sorted(stray.items())
    )
    for name in NAMES:  # each once in the layout itself, so the test above reads the right module
        in_layout = [w for w in found.get(name, []) if w.startswith(LAYOUT + ":")]
        assert len(in_layout) == 1, (name, in_layout)


def test_the_allow_list_is_still_needed():
    found = name_constants()
    for (path, name), why in ALLOWED.items():
        assert any(w.rsplit(":", 1)[0] == path for w in found.get(name, [])), f"{path} no longer says {name!r} ({why})"


def test_the_scan_counts_code_not_words(tmp_path):
    """A docstring, an attribute's doc and a message naming the file are words; a path built from
    the literal, even inside an f-string, is a name."""
    package = tmp_path / "gputrain"
    package.mkdir()
    (package / "m.py").write_text(
        '"""Writes summary.json."""\n'
        'X = 1\n'
        '"""summary.json"""\n'
        'def f(run_dir):\n'
        '    """summary.json"""\n'
        '    # "summary.json"\n'
        '    print("no summary.json here")\n'
        '    print(f"wrote {run_dir / \'summary.json\'}")\n'
        '    return run_dir / "summary.json"\n'
    )
    assert name_constants(package) == {"summary.json": ["gputrain/m.py:8", "gputrain/m.py:9"]}


def test_the_patterns_match_the_names_they_stand_for():
    """check_run_dir checks files of these forms: each per-rank, per-split name falls under one."""
    names = [
        layout.error_log_name(3),
        layout.scores_name("val"),
        layout.trace_name(None),
        layout.trace_name(2),
        layout.profile_name(None),
        layout.profile_name(1),
        layout.memory_snapshot_name(0),
    ]
    for name in names:
        assert any(fnmatch.fnmatch(name, p) for p in layout.RUN_FILE_PATTERNS), name
    assert layout.error_log_name(0) == layout.ERROR_LOG
    assert layout.step_of_name(layout.checkpoint_name(120)) == 120
    assert fnmatch.fnmatch(layout.checkpoint_name(7), layout.CHECKPOINT_GLOB)
    assert [layout.step_of_name(n) for n in ("step-", "step-x", "steps-3", "3", ".step-3.tmp-9")] == [None] * 5


def test_what_identifies_a_run_to_the_report():
    """The report's set differs from what a run writes: an LR sweep's directory holds only lr_find.json,
    a tune's only tune.json."""
    for own in (layout.LR_FIND, layout.TUNE):
        assert own in layout.REPORTED_FILES and own not in layout.RUN_FILES
    assert set(layout.REPORTED_FILES) - {layout.LR_FIND, layout.TUNE} <= set(layout.RUN_FILES)
