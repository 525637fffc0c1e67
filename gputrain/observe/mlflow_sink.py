"""MLflow as a tracker (log.mlflow=URI): one MLflow run per gputrain run, through `MlflowClient`
alone (no `mlflow.start_run`: its process-wide active run would leak from one Trainer to the next).

- params: the resolved config under dotted keys (`optim.lr`), one `log_batch` (MlflowClient sends
  it in chunks of the server's limits: 100 params, 1,000 metrics a request);
- metrics: each row's figures (`train/loss`, `val/accuracy`) at the row's step, batched: the rows
  of one flush (train/metrics.py: about one a second) go in one `log_batch`;
- tags: device, precision, world size, gputrain's version, the run directory; the status at the end;
- at the end: the summary's figures (`summary.wall_s`, ...), and config.toml, model.safetensors,
  report.html (where made) and summary.json as artifacts; the MLflow run FINISHED, KILLED
  (interrupted) or FAILED.

A resumed run continues the MLflow run trackers.json names (same tracking URI): it is marked
RUNNING again, params it lacks are added (a param's value cannot change in MLflow: the first
run's stays), and rows at steps MLflow already holds (written before the kill, after the checkpoint
the run resumed from) are not logged again, so a step's history has one point per step.

An `mlflow server` is asked for its /health once at the start, with a short timeout: an
unreachable server is one warning within seconds, not MLflow's retries with back-off (minutes).
Unless the user set them, MLflow's HTTP retries and timeout are bounded for the same reason
(BOUNDED_HTTP), which applies to this process's MLflow calls; and a folder as the URI sets
MLFLOW_ALLOW_FILE_STORE (MLflow 3 refuses its file store without it).
"""

from __future__ import annotations

import logging
import os
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

from gputrain.observe.tracker_sink import Row, RunFacts, TrackerSink, figures, save_run, saved_run, summary_figures
from gputrain.run.layout import CONFIG, FINAL_WEIGHTS, REPORT

MAX_PARAM_VALUE = 6000
"""Characters of a param's value MLflow keeps (MAX_PARAM_VAL_LENGTH): a longer one is cut, marked."""
MAX_TAG_VALUE = 8000
PROBE_TIMEOUT_S = 5.0
"""How long the start waits for an mlflow server's /health."""
BOUNDED_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
"""MLflow's defaults (7 retries with doubling back-off, 120 s a request) would hold a run's end for
minutes where the server went away mid-run."""
RUN_STATUS = {"completed": "FINISHED", "stopped_early": "FINISHED", "interrupted": "KILLED"}
"""gputrain's status → MLflow's run status; any other (failed) is FAILED."""
_UNSAFE = re.compile(r"[^A-Za-z0-9_\-. /]")
"""What MLflow refuses in a metric's name (a user's metric may be named anything)."""


def _http(uri: str) -> bool:
    return uri.lower().startswith(("http://", "https://"))


def _folder(uri: str) -> bool:
    """Whether `uri` is MLflow's file store: a path or a file: URI (config/tracking.py's shapes)."""
    return "://" not in uri or uri.lower().startswith("file:")


def probe(uri: str) -> None:
    """Raise where the mlflow server at `uri` does not answer its /health within PROBE_TIMEOUT_S."""
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=PROBE_TIMEOUT_S) as answer:
            answer.read(64)
    except OSError as exc:
        reason = getattr(exc, "reason", None) or exc
        raise ConnectionError(f"{uri} is unreachable ({reason})") from None


class MlflowSink(TrackerSink):
    """Args:
    uri: the tracking URI (config/tracking.py accepted it).
    facts: what the run records beside its rows.
    """

    name = "mlflow"

    def __init__(self, uri: str, facts: RunFacts) -> None:
        self.uri = uri
        self._client: Any = None
        self._run_id = ""
        self._logged_to: dict[str, float] = {}
        """The last step MLflow holds for each split (a resumed run's earlier rows): not logged again."""
        super().__init__(facts)

    def start(self) -> None:
        if _folder(self.uri):
            # MLflow 3 refuses its file store unless told: a folder named in log.mlflow says it
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        if _http(self.uri):
            for name, value in BOUNDED_HTTP.items():
                os.environ.setdefault(name, value)
            probe(self.uri)
        # a new database's migrations log at INFO through MLflow's own handler: not gputrain's output
        for name in ("mlflow.store.db.utils", "alembic.runtime.migration"):
            logging.getLogger(name).setLevel(logging.WARNING)
        from mlflow.tracking import MlflowClient

        client = self._client = MlflowClient(tracking_uri=self.uri)
        facts = self.facts
        saved = saved_run(facts.run_dir, self.name) if facts.resume_step is not None else {}
        run = self._continued(saved) if saved.get("tracking_uri") == self.uri else None
        if run is None:
            run = client.create_run(self._experiment(), run_name=facts.run_dir.name, tags=facts.tags())
            save_run(facts.run_dir, self.name, {"tracking_uri": self.uri, "run_id": run.info.run_id})
        self._run_id = run.info.run_id
        self.info = {"tracking_uri": self.uri, "run_id": self._run_id}
        have = run.data.params
        params = [(k, _cut(v, MAX_PARAM_VALUE)) for k, v in facts.params().items() if k not in have]
        from mlflow.entities import Param

        if params:
            client.log_batch(self._run_id, params=[Param(k, v) for k, v in params])

    def _continued(self, saved: dict[str, Any]) -> Any:
        """The MLflow run trackers.json names, RUNNING again, with the last step it holds of each
        split; None where the store no longer has it (a new run is made)."""
        from mlflow.exceptions import MlflowException

        client = self._client
        try:
            run = client.get_run(str(saved.get("run_id")))
        except MlflowException:
            return None
        client.update_run(run.info.run_id, status="RUNNING")
        # one figure of each split tells that split's last step: a row's figures go in one batch
        for split in {key.split("/", 1)[0] for key in run.data.metrics if "/" in key}:
            key = next(k for k in sorted(run.data.metrics) if k.startswith(f"{split}/"))
            history = client.get_metric_history(run.info.run_id, key)
            self._logged_to[split] = max((m.step for m in history), default=-1)
        return run

    def _experiment(self) -> str:
        """MLFLOW_EXPERIMENT_NAME's experiment (made where it does not exist), else MLflow's default."""
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME")
        if not name:
            return "0"
        from mlflow.exceptions import MlflowException

        found = self._client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        try:
            return str(self._client.create_experiment(name))
        except MlflowException:  # another process made it meanwhile
            return str(self._client.get_experiment_by_name(name).experiment_id)

    def log_rows(self, rows: list[Row]) -> None:
        from mlflow.entities import Metric

        metrics: list[Any] = []
        for record, walltime in rows:
            step = record["step"]
            if step <= self._logged_to.get(record.get("split", "train"), -1):
                continue
            stamp = int(walltime * 1000)
            metrics += [Metric(_UNSAFE.sub("_", key), value, stamp, step) for key, value in figures(record)]
        if metrics:
            self._client.log_batch(self._run_id, metrics=metrics)  # sent in chunks of MLflow's limits

    def finish(self, summary: dict[str, Any]) -> None:
        from mlflow.entities import Metric, RunTag

        step = int(summary.get("global_step") or 0)
        stamp = int(time.time() * 1000)
        tags = [RunTag("gputrain.status", str(summary.get("status")))]
        if summary.get("error"):
            tags.append(RunTag("gputrain.error", _cut(str(summary["error"]), MAX_TAG_VALUE)))
        metrics = [Metric(k, v, stamp, step) for k, v in summary_figures(summary).items()]
        self._client.log_batch(self._run_id, metrics=metrics, tags=tags)
        run_dir = self.facts.run_dir
        for name in (CONFIG, FINAL_WEIGHTS, REPORT):
            if (run_dir / name).is_file():
                self._client.log_artifact(self._run_id, str(run_dir / name))

    def store(self, summary_path: Path) -> None:
        if summary_path.is_file():
            self._client.log_artifact(self._run_id, str(summary_path))

    def end(self, status: str) -> None:
        if self._client is not None and self._run_id:
            self._client.set_terminated(self._run_id, RUN_STATUS.get(status, "FAILED"))


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
