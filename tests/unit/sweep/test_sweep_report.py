"""`gputrain report SWEEP_DIR` (report/sweep.py): the trials table, the objective against each
parameter, the best trials' curves, from a study and run directories written here (no training)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gputrain.cli import main

optuna = pytest.importorskip("optuna", reason="gputrain sweep needs the optuna extra (pip install gputrain[optuna])")


def _sweep(tmp_path: Path) -> Path:
    from optuna.distributions import CategoricalDistribution, FloatDistribution
    from optuna.trial import TrialState, create_trial

    from gputrain.sweep.study import counted

    sweep_dir = tmp_path / "runs" / "sweep-s"
    sweep_dir.mkdir(parents=True)
    url = f"sqlite:///{sweep_dir / 'study.db'}"
    settings = {
        "metric": "loss",
        "space": {
            "params": [
                {"key": "optim.lr", "kind": "log_uniform", "values": [1e-4, 1e-1]},
                {"key": "model.activation", "kind": "choice", "values": ["relu", "<script>alert(1)</script>"]},
            ]
        },
        "objective": "final",
    }
    (sweep_dir / "sweep.json").write_text(json.dumps({"study": "s", "storage": url, "settings": settings}))
    study = optuna.create_study(study_name="s", storage=url)
    shape = {
        "optim.lr": FloatDistribution(1e-4, 1e-1, log=True),
        "model.activation": CategoricalDistribution(["relu", "<script>alert(1)</script>"]),
    }
    for number, (lr, act, state, value) in enumerate(
        [
            (1e-3, "relu", TrialState.COMPLETE, 0.5),
            (1e-2, "<script>alert(1)</script>", TrialState.COMPLETE, 0.3),
            (1e-4, "relu", TrialState.PRUNED, 2.0),
            (1e-2, "relu", TrialState.FAIL, None),  # failed and retried: bookkeeping, left out
        ]
    ):
        run_dir = sweep_dir / f"trial-{number:04d}"
        run_dir.mkdir()
        rows = [{"step": s, "split": "val", "loss": (value or 2.0) + 1.0 / s} for s in (5, 10)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run_dir / "summary.json").write_text(json.dumps({"status": "completed", "global_step": 10}))
        study.add_trial(
            create_trial(
                state=state,
                value=value,
                params={"optim.lr": lr, "model.activation": act},
                distributions=shape,
                user_attrs={"run_dir": str(run_dir)},
                intermediate_values={5: 3.0} if state == TrialState.PRUNED else None,
            )
        )
    retry = create_trial(
        state=TrialState.COMPLETE,
        value=0.4,
        params={"optim.lr": 1e-2, "model.activation": "relu"},
        distributions=shape,
        user_attrs={"run_dir": str(sweep_dir / "trial-0003")},
        system_attrs={"failed_trial": 3, "retry_history": [3]},
    )
    study.add_trial(retry)  # trial 3's copy, in its run directory
    assert len(counted(study.get_trials())) == 4
    return sweep_dir


def test_the_sweep_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep_dir = _sweep(tmp_path)
    assert main(["report", str(sweep_dir)]) == 0
    page = (sweep_dir / "report.html").read_text()
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    table = page[page.index("<table") : page.index("</table>")]
    assert table.count("<tr>") == 1 + 4  # the header, and the four trials the sweep counts (not the retried)
    assert '<td class="num best" data-value="0.3">' in table  # the best trial marked
    assert "loss against optim.lr" in page and "loss against model.activation" in page
    assert "log10(optim.lr)" in page
    curves = page[page.index("the best trials") :]
    assert curves.count('class="series"') == 3  # the complete trials' curves: 0, 1 and the retried copy
    assert "wrote" in capsys.readouterr().out


def test_a_sweep_report_never_replaces_a_users_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep_dir = _sweep(tmp_path)
    (sweep_dir / "report.html").write_text("my notes")
    assert main(["report", str(sweep_dir)]) == 2
    assert (sweep_dir / "report.html").read_text() == "my notes"
    assert "never replaced" in capsys.readouterr().err
