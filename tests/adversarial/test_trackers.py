"""Experiment trackers attacked (issue 32): tracking URIs MLflow could not open and W&B modes that
are no mode are refused as config (exit 2, before training); a tracker failing at any call of its
life is one warning, the run completes and summary.json says what failed; rows a tracker would
refuse (odd metric names, non-finite figures, nulls) never fail it; a damaged or foreign
trackers.json never stops a resumed run; and many rows go in batches MLflow accepts.

The sink cases drive the MLflow sink directly against one SQLite store (made once: its migrations
are the slow part); the failure cases train a tiny linear model in-process."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from gputrain.config import load_config
from gputrain.errors import ConfigError
from tests.adversarial.helpers import linear_trainer, read_summary

mlflow = pytest.importorskip("mlflow", reason="mlflow is in the test extra: pip install 'gputrain[test]'")

# ----------------------------------------------------------------- URIs and modes, judged as config

BAD_URIS = [
    ("htp://host:5000", "scheme 'htp'"),
    ("ftp://host/x", "scheme 'ftp'"),
    ("s3://bucket/x", "scheme 's3'"),
    ("runs:/abc/model", "scheme 'runs'"),
    ("databricks", None),  # a bare word is a folder: accepted (see GOOD_URIS); here with a scheme:
    ("databricks://profile", "scheme 'databricks'"),
    ("http://", "names no host"),
    ("http://:5000", "names no host"),
    ("https:///path", "names no host"),
    ("http://host:port", "not a URI MLflow can open"),
    ("http://host:99999", "not a URI MLflow can open"),
    ("http://host:0", "port 0"),
    ("http://[::1", "not a URI MLflow can open"),
    ("sqlite://", "names no database file"),
    ("sqlite:///", "names no database file"),
    ("postgresql:///db", "names no database host"),
    ("mysql://", "names no database host"),
    ("file:", "names no folder"),
    (" sqlite:///x.db", "spaces around it"),
    ("http://host:5000 ", "spaces around it"),
    ("javascript:alert(1)", "scheme 'javascript'"),
    ("mlflow-artifacts:/x", "scheme 'mlflow-artifacts'"),
]
BAD_URIS = [(uri, why) for uri, why in BAD_URIS if why is not None]

GOOD_URIS = [
    "mlruns",
    "./runs/mlflow",
    "/tmp/mlruns",
    "databricks",
    "file:/tmp/mlruns",
    "file:///tmp/mlruns",
    "sqlite:///mlflow.db",
    "sqlite:////tmp/abs/mlflow.db",
    "http://127.0.0.1:5000",
    "http://tracking.example.com",
    "https://tracking.example.com:8443/prefix",
    "HTTP://HOST:5000",
    "postgresql://user:pw@db:5432/mlflow",
    "postgresql+psycopg2://db/mlflow",
    "mysql+pymysql://db/mlflow",
    "mssql+pyodbc://db/mlflow",
    "C:/mlruns",
    "",
]


@pytest.mark.parametrize(("uri", "why"), BAD_URIS, ids=[u for u, _ in BAD_URIS])
def test_a_tracking_uri_mlflow_cannot_open_is_a_config_error(uri: str, why: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(None, {"log.mlflow": uri})
    assert raised.value.field == "log.mlflow" and why in raised.value.problem
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("uri", GOOD_URIS)
def test_a_tracking_uri_mlflow_opens_is_taken(uri: str) -> None:
    assert load_config(None, {"log.mlflow": uri}).log.mlflow == uri


@pytest.mark.parametrize("mode", ["Offline", "on", "true", "false", "", "disabled", "shared", "offline "])
def test_a_wandb_mode_that_is_no_mode_is_a_config_error(mode: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(None, {"log.wandb": mode})
    assert raised.value.field == "log.wandb"


@pytest.mark.parametrize(
    "override",
    ["log.mlflow=http://host:port", "log.mlflow=sqlite://", "log.wandb=yes"],
)
def test_bad_tracker_settings_stop_the_cli_before_training(cli, tmp_path: Path, override: str) -> None:
    result = cli("train", "--run-dir", str(tmp_path / "run"), "model.name=mlp", "data.name=synthetic", override)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and override.split("=")[0] in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


# ----------------------------------------------------------------- the sink against a real store


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One SQLite store for the module (its artifacts under the same folder)."""
    from mlflow.tracking import MlflowClient

    where = tmp_path_factory.mktemp("store")
    uri = f"sqlite:///{where}/mlflow.db"
    here = os.getcwd()
    os.chdir(where)  # the default experiment's artifacts: ./mlruns where the store is made
    try:
        MlflowClient(uri).search_experiments()  # make the tables now, once
    finally:
        os.chdir(here)
    return uri


def facts(run_dir: Path, resume_step: int | None = None) -> Any:
    from gputrain.observe.trackers import RunFacts

    run_dir.mkdir(parents=True, exist_ok=True)
    return RunFacts(load_config(None, {}), run_dir, "cpu", "fp32", 1, resume_step)


def logged(
    uri: str, run_dir: Path, rows: list[dict[str, Any]], resume_step: int | None = None, status: str = "completed"
) -> tuple[Any, dict[str, Any]]:
    """Rows through an MLflow sink, flushed as the metrics logger does, and the run ended."""
    from gputrain.observe.mlflow_sink import MlflowSink
    from gputrain.observe.trackers import Trackers

    sink = MlflowSink(uri, facts(run_dir, resume_step))
    for i, row in enumerate(rows):
        sink.write(row)
        if i % 7 == 6:
            sink.flush()
    sink.close()
    trackers = Trackers([sink])
    trackers.finish({"status": status, "global_step": rows[-1]["step"] if rows else 0})
    (run_dir / "summary.json").write_text("{}")
    return sink, trackers.store(run_dir / "summary.json", status)["mlflow"]


def history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    return sorted((m.step, m.value) for m in MlflowClient(uri).get_metric_history(run_id, key))


ODD_ROWS = [
    ("metric named with odd characters", {"step": 1, "split": "val", "f1@0.5 (macro)": 0.5}, "val/f1_0.5 _macro_", 0.5),
    ("unicode metric name", {"step": 1, "split": "val", "précision": 0.25}, "val/pr_cision", 0.25),
    ("nan loss", {"step": 1, "loss": float("nan")}, "train/loss", "nan"),
    ("inf grad norm", {"step": 1, "grad_norm": float("inf")}, "train/grad_norm", "inf"),
    ("integer figure", {"step": 1, "tokens": 7}, "train/tokens", 7.0),
    ("null figure skipped", {"step": 1, "grad_norm": None, "loss": 1.0}, "train/loss", 1.0),
    ("flag skipped", {"step": 1, "stopped": True, "loss": 2.0}, "train/loss", 2.0),
    ("text skipped", {"step": 1, "note": "hi", "loss": 3.0}, "train/loss", 3.0),
    ("huge value", {"step": 1, "loss": 1e308}, "train/loss", 1e308),
    ("step zero", {"step": 0, "loss": 4.0}, "train/loss", 4.0),
]


@pytest.mark.parametrize(("row", "key", "value"), [c[1:] for c in ODD_ROWS], ids=[c[0] for c in ODD_ROWS])
def test_a_row_the_tracker_would_refuse_never_fails_it(
    store: str, tmp_path: Path, row: dict, key: str, value: Any
) -> None:
    _, state = logged(store, tmp_path / "run", [row])
    assert state["status"] == "logged", state
    points = history(store, state["run_id"], key)
    assert len(points) == 1 and points[0][0] == row["step"]
    got = points[0][1]
    if value == "nan":
        assert math.isnan(got)
    elif value == "inf":
        assert math.isinf(got) or got >= 1.7e308  # a store may keep inf as the largest double
    else:
        assert got == value


def test_many_rows_go_in_batches_mlflow_accepts(store: str, tmp_path: Path) -> None:
    """3,000 rows of 9 figures in one flush: 27,000 points in one log_batch, past the server's
    1,000 a request (MlflowClient chunks it; a REST call of our own would not)."""
    from gputrain.observe.mlflow_sink import MlflowSink
    from gputrain.observe.trackers import Trackers

    sink = MlflowSink(store, facts(tmp_path / "run"))
    for step in range(1, 3001):
        sink.write({"step": step, **{f"f{i}": float(step * i) for i in range(9)}})
    sink.close()
    state = Trackers([sink]).store(tmp_path / "none.json", "completed")["mlflow"]
    assert state["status"] == "logged"
    assert history(store, state["run_id"], "train/f3") == [(s, 3.0 * s) for s in range(1, 3001)]


DAMAGED_TRACKERS = [
    ("not JSON", "{"),
    ("a list", "[1, 2]"),
    ("mlflow entry not an object", '{"mlflow": "abc"}'),
    ("a run id the store lacks", '{"mlflow": {"tracking_uri": "STORE", "run_id": "0123456789abcdef"}}'),
    ("a run id of another type", '{"mlflow": {"tracking_uri": "STORE", "run_id": 7}}'),
    ("another store's run", '{"mlflow": {"tracking_uri": "sqlite:///elsewhere.db", "run_id": "x"}}'),
    ("binary", "\udcff"),
]


@pytest.mark.parametrize("text", [c[1] for c in DAMAGED_TRACKERS], ids=[c[0] for c in DAMAGED_TRACKERS])
def test_a_damaged_or_foreign_trackers_json_starts_a_new_mlflow_run(store: str, tmp_path: Path, text: str) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "trackers.json").write_text(text.replace("STORE", store), errors="surrogateescape")
    _, state = logged(store, run_dir, [{"step": 6, "loss": 1.0}], resume_step=5)
    assert state["status"] == "logged"
    assert json.loads((run_dir / "trackers.json").read_text())["mlflow"]["run_id"] == state["run_id"]
    assert history(store, state["run_id"], "train/loss") == [(6, 1.0)]


RUN_STATUS = [("completed", "FINISHED"), ("stopped_early", "FINISHED"), ("interrupted", "KILLED"), ("failed", "FAILED")]


@pytest.mark.parametrize(("status", "mlflow_status"), RUN_STATUS)
def test_the_mlflow_run_ends_as_the_run_did(store: str, tmp_path: Path, status: str, mlflow_status: str) -> None:
    from mlflow.tracking import MlflowClient

    _, state = logged(store, tmp_path / "run", [{"step": 1, "loss": 1.0}], status=status)
    run = MlflowClient(store).get_run(state["run_id"])
    assert run.info.status == mlflow_status and run.data.tags["gputrain.status"] == status


# ----------------------------------------------------------------- a failing tracker, in a real run

FAILING_CALLS = [
    ("create_run", "the start"),
    ("get_run", None),  # only a resumed run asks for its run: a fresh one never calls it
    ("log_batch", "the params"),
    ("log_artifact", "the end"),
    ("set_terminated", "the end"),
]


@pytest.mark.parametrize(("method", "when"), FAILING_CALLS, ids=[c[0] for c in FAILING_CALLS])
def test_a_tracker_failing_at_any_call_is_one_warning_and_the_run_completes(
    store: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    gputrain_warnings: list[str],
    method: str,
    when: str | None,
) -> None:
    from mlflow.tracking import MlflowClient

    calls: list[str] = []

    def broken(*args: Any, **kwargs: Any) -> Any:
        calls.append(method)
        raise RuntimeError(f"{method} broke")

    monkeypatch.setattr(MlflowClient, method, broken)
    run_dir = tmp_path / "run"
    summary = linear_trainer(run_dir, **{"log.mlflow": store}).fit()
    assert summary["status"] == "completed" and read_summary(run_dir)["trackers"] == summary["trackers"]
    warned = [m for m in gputrain_warnings if m.startswith("mlflow:")]
    if when is None:
        assert calls == [] and summary["trackers"]["mlflow"]["status"] == "logged" and warned == []
        return
    assert summary["trackers"]["mlflow"]["status"] == "failed"
    assert summary["trackers"]["mlflow"]["error"] == f"RuntimeError: {method} broke"
    assert calls == [method] and warned == [f"mlflow: RuntimeError: {method} broke; training goes on without it"]
