"""Each command knows its own earlier output (the only existing file run/output.py lets it replace),
and nothing else: predict's CSV, report's page, evaluate's scores, an export's folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gputrain.evaluate.scores import Scores, is_scores_file, save_scores
from gputrain.report.build import is_report
from gputrain.use.export import is_export_folder
from gputrain.use.predict import written_by_predict


@pytest.mark.parametrize(
    ("text", "ours"),
    [
        ("input,predicted,p_cat,p_dog\n1,cat,0.9,0.1\n", True),
        ("input,class1,p1,class2,p2\nimg.png,cat,0.9,dog,0.1\n", True),
        ("input,price\n1,3.25\n", True),  # regression: the label column's name, numbers below
        ("input,y_0,y_1\n1,0.5,-2e-3\n", True),
        ("input\n1\n", False),
        ("a,b,label,c\n1,2,cat,3\n", False),  # the training CSV
        ("input,name\n1,alice\n", False),  # a user's table that starts like one
        ("input,predicted,notes\n1,cat,mine\n", False),
        ("input,class1,p1,class3\n", False),
        ("", False),
    ],
)
def test_predict_knows_its_csv_by_its_header(tmp_path: Path, text: str, ours: bool) -> None:
    path = tmp_path / "out.csv"
    path.write_text(text)
    assert written_by_predict(path) is ours


def test_report_knows_its_page_by_its_generator_tag(tmp_path: Path) -> None:
    page = tmp_path / "r.html"
    page.write_text('<!DOCTYPE html><html><head><meta name="generator" content="gputrain"><title>x</title>')
    assert is_report(page)
    page.write_text("<!DOCTYPE html><html><head><title>my notes</title>")
    assert not is_report(page)


def test_evaluate_knows_its_scores_by_their_arrays(tmp_path: Path) -> None:
    path = tmp_path / "scores-test.npz"
    save_scores(path, Scores("regression", np.zeros((2, 1)), np.zeros((2, 1)), 2))
    assert is_scores_file(path)
    np.savez(tmp_path / "other.npz", scores=np.zeros(2))
    (tmp_path / "text.npz").write_text("not a zip")
    assert not is_scores_file(tmp_path / "other.npz") and not is_scores_file(tmp_path / "text.npz")


def test_an_export_folder_holds_its_record_and_only_what_that_lists(tmp_path: Path) -> None:
    record = {"written_by": "gputrain export", "format": "pt2", "files": ["model.pt2", "preprocess.json"]}
    (tmp_path / "export.json").write_text(json.dumps(record))
    for name in record["files"]:
        (tmp_path / name).write_text("")
    assert is_export_folder(tmp_path)
    (tmp_path / "evil.so").write_text("")
    assert not is_export_folder(tmp_path)
    (tmp_path / "evil.so").unlink()
    (tmp_path / "export.json").write_text(json.dumps({**record, "files": ["../config.toml"]}))
    assert not is_export_folder(tmp_path)
    (tmp_path / "export.json").write_text(json.dumps({"format": "pt2", "files": ["model.pt2"]}))
    assert not is_export_folder(tmp_path)  # no marker, nor the keys an export.json has
