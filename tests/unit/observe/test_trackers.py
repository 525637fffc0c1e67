"""The trackers against the real libraries: a run logged to MLflow (a SQLite store, an `mlflow
server` started here) and to W&B offline, read back as the libraries read it; a resumed run
continuing its MLflow run; an unreachable or failing tracker warned about once, the run completing.

mlflow and wandb come with the `test` extra (pip install 'gputrain[test]')."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dist.harness import free_port
from tests.waiting import wait_until

mlflow = pytest.importorskip("mlflow", reason="mlflow is in the test extra: pip install 'gputrain[test]'")

BASE = [
    "model.name=mlp", "data.name=synthetic", "data.shape=[8]", "data.num_samples=256", "model.hidden_sizes=[16]",
    "train.batch_size=32", "train.epochs=2", "log.every_steps=2", "log.tensorboard=false", "log.progress=none",
    "log.breakdown_every=0", "train.device=cpu", "optim.lr=0.01",
]  # fmt: skip


def train(run_dir: Path, *overrides: str) -> dict[str, Any]:
    from gputrain.train.trainer import Trainer

    return Trainer.from_config(None, run_dir=run_dir, overrides=[*BASE, *overrides]).fit()


def rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def expected_history(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl as MLflow should hold it: each figure under split/key, at its step."""
    history: dict[str, list[tuple[int, float]]] = {}
    for row in rows(run_dir):
        split = row.get("split", "train")
        for key, value in row.items():
            if key not in ("step", "epoch", "split") and type(value) in (int, float):
                history.setdefault(f"{split}/{key}", []).append((row["step"], float(value)))
    return history


def mlflow_history(client: Any, run_id: str) -> dict[str, list[tuple[int, float]]]:
    run = client.get_run(run_id)
    return {
        key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        for key in run.data.metrics
        if not key.startswith("summary.")
    }


def the_run(run_dir: Path, uri: str) -> tuple[Any, Any]:
    from mlflow.tracking import MlflowClient

    saved = json.loads((run_dir / "trackers.json").read_text())["mlflow"]
    assert saved["tracking_uri"] == uri
    client = MlflowClient(uri)
    return client, client.get_run(saved["run_id"])


def check_logged(run_dir: Path, uri: str, summary: dict[str, Any]) -> None:
    """What a completed run leaves in MLflow: params, the history of metrics.jsonl, tags, artifacts."""
    client, run = the_run(run_dir, uri)
    assert summary["trackers"]["mlflow"] == {"status": "logged", "tracking_uri": uri, "run_id": run.info.run_id}
    assert json.loads((run_dir / "summary.json").read_text())["trackers"] == summary["trackers"]
    assert run.info.status == "FINISHED" and run.info.run_name == run_dir.name
    params = run.data.params
    assert params["optim.lr"] == "0.01" and params["train.batch_size"] == "32" and params["model.name"] == "mlp"
    assert params["model.hidden_sizes"] == "[16]" and len(params) > 100  # the whole config, past one batch of 100
    assert mlflow_history(client, run.info.run_id) == expected_history(run_dir)
    tags = run.data.tags
    assert (tags["gputrain.device"], tags["gputrain.precision"], tags["gputrain.world_size"]) == ("cpu", "fp32", "1")
    assert tags["gputrain.status"] == "completed" and tags["gputrain.run_dir"] == str(run_dir.resolve())
    assert run.data.metrics["summary.global_step"] == summary["global_step"]
    assert run.data.metrics["summary.val.accuracy"] == summary["val"]["accuracy"]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert artifacts == {"config.toml", "model.safetensors", "summary.json"}
    local = Path(client.download_artifacts(run.info.run_id, "model.safetensors", str(run_dir.parent / "got")))
    assert local.read_bytes() == (run_dir / "model.safetensors").read_bytes()


def test_a_run_logged_to_a_sqlite_store_reads_back_as_metrics_jsonl(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the store's artifacts go to ./mlruns
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    summary = train(tmp_path / "run", f"log.mlflow={uri}")
    assert summary["status"] == "completed" and summary["global_step"] == 10
    check_logged(tmp_path / "run", uri, summary)


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[str]:
    """`mlflow server` on a free port with a SQLite backend (artifacts served by it), stopped after the test."""
    port = free_port()
    where = tmp_path / "server"
    where.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{where}/backend.db", "--artifacts-destination", str(where / "artifacts")],
        cwd=where, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    uri = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert proc.poll() is None, f"mlflow server exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    try:
        wait_until(ready, timeout_s=120, what="mlflow server's /health", poll_s=0.2)
        yield uri
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and the workers it started, none else
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_run_logged_to_an_mlflow_server(tmp_path: Path, mlflow_server: str) -> None:
    summary = train(tmp_path / "run", f"log.mlflow={mlflow_server}")
    check_logged(tmp_path / "run", mlflow_server, summary)


def test_a_resumed_run_continues_its_mlflow_run_without_a_step_twice(tmp_path: Path, monkeypatch) -> None:
    """The first run reaches step 10 with checkpoints at 5 and 10; the one at 10 is lost, so the
    second resumes at 5 while MLflow already holds the rows of steps 6..10 (a kill after they were
    logged): they are not logged again, and the history still equals metrics.jsonl point for point."""
    import shutil

    monkeypatch.chdir(tmp_path)
    uri, run_dir = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "run"
    first = train(run_dir, f"log.mlflow={uri}", "checkpoint.every_epochs=1")
    run_id = first["trackers"]["mlflow"]["run_id"]
    shutil.rmtree(run_dir / "checkpoints" / "step-10")
    second = train(run_dir, f"log.mlflow={uri}", "checkpoint.every_epochs=1", "train.epochs=3")
    assert second["global_step"] == 15 and second["trackers"]["mlflow"]["run_id"] == run_id
    client, run = the_run(run_dir, uri)
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    history, want = mlflow_history(client, run_id), expected_history(run_dir)
    for key in (k for k in want if not k.startswith("test/")):  # one point per step, metrics.jsonl's steps
        assert [step for step, _ in history[key]] == [step for step, _ in want[key]], key
    assert [step for step, _ in history["train/loss"]] == [2, 4, 6, 8, 10, 12, 14, 15]
    # bit-exact resume: the figures of the steps logged before the resume are the same (the speed
    # and memory figures of those steps are the first run's: they measure the machine, not the model)
    for key in ("train/loss", "train/lr", "train/grad_norm", "val/accuracy", "val/loss"):
        assert history[key] == want[key], key
    assert history["test/loss"][-1] == want["test/loss"][-1]  # (the first run's test at step 10 stays too)
    assert len(client.search_runs(["0"])) == 1


def test_an_unreachable_tracking_uri_warns_once_and_the_run_completes(tmp_path: Path, gputrain_warnings) -> None:
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    summary = train(tmp_path / "run", f"log.mlflow={uri}")
    assert summary["status"] == "completed" and summary["global_step"] == 10
    state = summary["trackers"]["mlflow"]
    assert state["status"] == "failed" and "unreachable" in state["error"] and uri in state["error"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["trackers"] == summary["trackers"]
    said = [m for m in gputrain_warnings if m.startswith("mlflow:")]
    assert len(said) == 1 and "training goes on without it" in said[0]


def test_a_tracker_failing_mid_run_is_warned_about_once_and_stops_logging(
    tmp_path: Path, monkeypatch, gputrain_warnings
) -> None:
    """The store takes the params, then refuses the first rows: one warning, nothing more is sent."""
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    calls: list[str] = []
    real = MlflowClient.log_batch

    def failing(self, run_id, metrics=(), params=(), tags=(), **kwargs):
        calls.append("metrics" if metrics else "params" if params else "tags")
        if metrics:
            raise OSError("disk full")
        return real(self, run_id, metrics=metrics, params=params, tags=tags, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", failing)
    summary = train(tmp_path / "run", f"log.mlflow=sqlite:///{tmp_path}/mlflow.db", "log.every_steps=1")
    assert summary["status"] == "completed"
    assert summary["trackers"]["mlflow"]["status"] == "failed"
    assert summary["trackers"]["mlflow"]["error"] == "OSError: disk full"
    assert calls.count("metrics") == 1 and "tags" not in calls  # no retry, no summary after the failure
    assert [m for m in gputrain_warnings if m.startswith("mlflow:")] == [
        "mlflow: OSError: disk full; training goes on without it"
    ]


def test_a_missing_package_is_one_line_naming_the_extra_before_training(cli, tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['mlflow'] = None\n")  # as if not installed
    env = {"PYTHONPATH": f"{site}{os.pathsep}{Path(__file__).resolve().parents[3]}"}
    result = cli("train", "--run-dir", str(tmp_path / "run"), *BASE, "log.mlflow=mlruns", env=env, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [
        "gputrain train: config error: log.mlflow: the mlflow package is not installed: "
        "pip install 'gputrain[mlflow]', or unset log.mlflow"
    ], result.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# ----------------------------------------------------------------- W&B offline

WANDB_BLOCK = 32768
"""The .wandb file is LevelDB's log format: 32 KiB blocks of records, each a 7-byte header (CRC,
length, type: full, first, middle, last) and its bytes, after W&B's own 7-byte file header."""


def wandb_records(path: Path) -> list[Any]:
    """Every record of an offline run's .wandb file, as W&B's protobuf Record."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, chunk, records = 7, b"", []
    while pos + 7 <= len(data):
        if WANDB_BLOCK - pos % WANDB_BLOCK < 7:  # a block's tail too short for a header is padding
            pos += WANDB_BLOCK - pos % WANDB_BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            break
        chunk = data[pos + 7 : pos + 7 + length] if kind in (1, 2) else chunk + data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            records.append(record)
    return records


def _key(item: Any) -> str:
    """An item's name: W&B keeps a name with a slash (train/loss) as its nested key's parts."""
    return item.key or "/".join(item.nested_key)


def test_a_run_logged_to_wandb_offline_reads_back(cli, tmp_path: Path) -> None:
    pytest.importorskip("wandb", reason="wandb is in the test extra: pip install 'gputrain[test]'")
    run_dir = tmp_path / "run"
    env = {"WANDB_MODE": "offline"}  # no network: nothing leaves the machine whatever log.wandb says
    result = cli(
        "train", "--run-dir", str(run_dir), *BASE, "log.wandb=offline", "log.progress=plain", env=env, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    state = summary["trackers"]["wandb"]
    assert state["status"] == "logged" and state["mode"] == "offline"
    offline = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and str(offline[0]).endswith(state["sync_dir"].split("/")[-1])
    # gputrain's one line about it, and none of W&B's own
    output = (result.stdout + result.stderr).splitlines()
    said = [line for line in output if line.lower().lstrip().startswith("wandb") or "w&b" in line.lower()]
    assert said == [f"wandb: offline run saved; upload it with: wandb sync {state['sync_dir']}"]
    records = wandb_records(offline[0] / f"run-{state['id']}.wandb")
    kinds = [r.WhichOneof("record_type") for r in records]
    run = records[kinds.index("run")].run
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["optim.lr"] == "0.01" and config["model.name"] == "mlp"
    logged: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {_key(item): json.loads(item.value_json) for item in record.history.item}
            for key, value in items.items():
                if not key.startswith("_"):
                    logged.setdefault(key, []).append((record.history.step.num, value))
    want = expected_history(run_dir)
    assert set(logged) == set(want)
    for key, points in want.items():
        assert [s for s, _ in logged[key]] == [s for s, _ in points]
        assert all(math.isclose(a, b, rel_tol=1e-12) for (_, a), (_, b) in zip(logged[key], points))
    final = {}
    for record in records:
        if record.WhichOneof("record_type") == "summary":
            final.update({_key(item): json.loads(item.value_json) for item in record.summary.update})
    assert final["status"] == "completed" and final["summary.global_step"] == 10
    assert kinds[-1] in ("exit", "footer", "final") or "exit" in kinds


def test_a_resumed_run_continues_its_wandb_run(cli, tmp_path: Path) -> None:
    """Trained longer (a new process, as after a kill), the run continues the same W&B id in a
    second offline folder, whose rows start after the resumed step; the console's sync command
    names both folders."""
    pytest.importorskip("wandb", reason="wandb is in the test extra: pip install 'gputrain[test]'")
    run_dir, env = tmp_path / "run", {"WANDB_MODE": "offline"}
    args = ("train", "--run-dir", str(run_dir), *BASE, "log.wandb=offline", "log.progress=plain")
    assert cli(*args, env=env, cwd=tmp_path).returncode == 0
    run_id = json.loads((run_dir / "summary.json").read_text())["trackers"]["wandb"]["id"]
    result = cli(*args, "train.epochs=3", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    state = json.loads((run_dir / "summary.json").read_text())["trackers"]["wandb"]
    assert state["status"] == "logged" and state["id"] == run_id
    folders = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(folders) == 2 and all((f / f"run-{run_id}.wandb").is_file() for f in folders)
    records = wandb_records(folders[1] / f"run-{run_id}.wandb")
    steps = [r.history.step.num for r in records if r.HasField("history")]
    assert steps == [12, 14, 15]
    said = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("wandb:")]
    assert said == [f"wandb: offline run saved; upload it with: wandb sync {run_dir / 'wandb'}/offline-run-*"]


def test_a_run_resumed_in_its_own_process_is_a_new_wandb_run(tmp_path: Path, monkeypatch) -> None:
    """W&B writes nothing for an id opened twice in one process: the second fit takes a new id."""
    pytest.importorskip("wandb", reason="wandb is in the test extra: pip install 'gputrain[test]'")
    monkeypatch.setenv("WANDB_MODE", "offline")
    run_dir = tmp_path / "run"
    first = train(run_dir, "log.wandb=offline")["trackers"]["wandb"]
    second = train(run_dir, "log.wandb=offline", "train.epochs=3")["trackers"]["wandb"]
    assert second["status"] == "logged" and second["id"] != first["id"]
    records = wandb_records(Path(second["sync_dir"]) / f"run-{second['id']}.wandb")
    assert [r.history.step.num for r in records if r.HasField("history")] == [12, 14, 15]
