"""Experiment trackers on 2 real gloo ranks (DDP): only rank 0 logs. One MLflow run holds the
job, each logged step once, with the world size among its tags; rank 1's summary names no tracker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.dist.harness import run_ranks
from tests.dist.jobs import train_runs

pytest.importorskip("mlflow", reason="mlflow is in the test extra: pip install 'gputrain[test]'")


def test_only_rank_0_logs_to_mlflow(tmp_path: Path, monkeypatch) -> None:
    uri = f"file:{tmp_path / 'mlruns'}"  # MLflow's file store: the artifacts stay inside it too
    run_dir = tmp_path / "run"
    summaries = run_ranks(train_runs, [(str(run_dir), ["parallel.strategy=ddp", f"log.mlflow={uri}"])], timeout_s=240)
    first, second = summaries[0][0], summaries[1][0]
    assert first["status"] == second["status"] == "completed" and first["world_size"] == 2
    assert first["trackers"]["mlflow"]["status"] == "logged" and "trackers" not in second
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # what the run set for itself, to read it back here
    client = MlflowClient(uri)
    runs = client.search_runs(["0"])
    assert [r.info.run_id for r in runs] == [first["trackers"]["mlflow"]["run_id"]]
    run = runs[0]
    assert run.data.tags["gputrain.world_size"] == "2" and run.info.status == "FINISHED"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted((m.step, m.value) for m in history) == [(r["step"], r["loss"]) for r in rows if "split" not in r]
