"""The only module that talks to MLflow (design.md §5).

Schema of one run (one Hydra job):

* experiment: ``tracking.experiment`` (an experiment config sets it; default ``rankexp``);
* run name: short and readable, e.g. ``post·α1·β1·L48·d256``;
* params: the resolved config flattened with dots, plus ``nominal_ratio`` (βα^M)
  and ``depth_factor`` (βα^M√L);
* tags: ``config_hash`` (resume key), ``git_commit``, ``overrides``, ``sweep_id``,
  ``device``, ``task``; ``mlflow.parentRunId`` groups a multirun under one parent;
* metrics: scalars at step 0; series with ``step = layer`` (or path order / train step);
* artifacts: ``config.yaml``, ``result.json``, ``arrays.npz`` from the job directory.

The default store is an embedded SQLite file; a fresh store is created under an
exclusive file lock so parallel first writers cannot race on schema migration or
experiment creation (platform.md).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import logging
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)

PARENT_FILE = "mlflow_parent.json"
STATUS_FILE = "status.json"
MAX_METRICS, MAX_PARAMS, MAX_TAGS = 1000, 100, 100  # log_batch limits (platform.md)
PARAM_VALUE_LIMIT = 6000


class TrackingError(RuntimeError):
    """The tracking store cannot be used as configured (message says why and what to do)."""


# --------------------------------------------------------------------------- store
def resolve_uri(uri: str | None, base_dir: str | os.PathLike | None = None) -> str:
    """The tracking URI to use.

    Order: ``uri`` (config) → ``$MLFLOW_TRACKING_URI`` → ``sqlite:///<base_dir>/mlflow.db``
    (``base_dir`` defaults to the current directory).

    Raises:
        TrackingError: a file-store URI (``file:`` or a bare path), which MLflow 3
            deprecates and refuses without ``MLFLOW_ALLOW_FILE_STORE``; rankexp
            never silently falls back to it.
    """
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or None
    if uri is None:
        base = Path(base_dir or os.getcwd()).resolve()
        stale = base / "mlruns"
        if any(stale.glob("*/meta.yaml")):
            log.warning(
                "%s holds an old MLflow file store; it is ignored (rankexp uses %s). "
                "Import it with `mlflow migrate-filestore` if you need those runs.",
                stale,
                base / "mlflow.db",
            )
        return f"sqlite:///{base / 'mlflow.db'}"
    scheme = uri.split(":", 1)[0].lower() if ":" in uri else ""
    if scheme in ("", "file") or (len(scheme) == 1 and uri[1:3] in (":\\", ":/")):
        raise TrackingError(
            f"tracking URI {uri!r} is MLflow's file store, which MLflow 3 has deprecated "
            "(it raises unless MLFLOW_ALLOW_FILE_STORE=true). Use an SQLite file "
            "(tracking.uri=sqlite:////abs/path/mlflow.db, the default is ./mlflow.db) or a "
            "server (tracking.uri=http://127.0.0.1:5000, see launchers/README.md)."
        )
    return uri


def _sqlite_path(uri: str) -> Path | None:
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///") :])
    return None


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """Exclusive lock next to an SQLite store (no-op for servers, which serialize themselves)."""
    db = _sqlite_path(uri)
    if db is None:
        yield
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(str(db) + ".lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def prepare_experiment(uri: str, name: str) -> str:
    """Create the store's schema and the experiment ``name`` if missing; return its id.

    Safe under concurrency: SQLite stores are initialized under a file lock, and a
    lost creation race against a server is resolved by reading the winner's id.
    """
    from mlflow.exceptions import MlflowException

    with _store_lock(uri):
        client = _client(uri)
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            if exp.lifecycle_stage == "deleted":
                client.restore_experiment(exp.experiment_id)
            return exp.experiment_id
        db = _sqlite_path(uri)
        location = (db.parent / "mlartifacts" / name).as_uri() if db else None
        try:
            return client.create_experiment(name, artifact_location=location)
        except MlflowException:
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id


# --------------------------------------------------------------------------- helpers
_GIT: dict[str, str] = {}


def git_commit(repo: Path | None = None) -> str:
    """``HEAD`` of the repository holding rankexp (``+dirty`` if modified), or ``unknown``."""
    if "commit" not in _GIT:
        repo = repo or Path(__file__).resolve().parent.parent
        try:
            sha = subprocess.run(
                ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
            ).stdout.strip()
            dirty = subprocess.run(
                ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.strip()
            _GIT["commit"] = (sha + ("+dirty" if dirty else "")) if sha else "unknown"
        except (OSError, subprocess.SubprocessError):
            _GIT["commit"] = "unknown"
    return _GIT["commit"]


def _chunks(items: list, n: int) -> Iterator[list]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


def _param_value(v: Any) -> str:
    s = json.dumps(v) if isinstance(v, (list, dict)) else str(v)
    return s[:PARAM_VALUE_LIMIT]


def find_finished(uri: str, experiment_id: str, config_hash: str) -> str | None:
    """Id of a FINISHED run with tag ``config_hash`` in the experiment, or ``None``."""
    runs = _client(uri).search_runs(
        [experiment_id],
        filter_string=f"tags.config_hash = '{config_hash}' and attributes.status = 'FINISHED'",
        max_results=1,
    )
    return runs[0].info.run_id if runs else None


# --------------------------------------------------------------------------- one run
class RunLogger:
    """Log one job's config and result to MLflow, marking it FAILED if the job raises.

    Use as a context manager::

        with RunLogger(uri, exp_id, run_name, params, tags) as run:
            run.log_result(measurement)
    """

    def __init__(
        self,
        uri: str,
        experiment_id: str,
        run_name: str,
        params: dict[str, Any],
        tags: dict[str, str],
    ):
        self.uri, self.experiment_id, self.run_name = uri, experiment_id, run_name
        self.params, self.tags = params, dict(tags)
        self.client = _client(uri)
        self.run_id: str | None = None

    def __enter__(self) -> RunLogger:
        from mlflow.entities import Param

        run = self.client.create_run(self.experiment_id, run_name=self.run_name, tags=self.tags)
        self.run_id = run.info.run_id
        params = [Param(k, _param_value(v)) for k, v in sorted(self.params.items())]
        for chunk in _chunks(params, MAX_PARAMS):
            self.client.log_batch(self.run_id, params=chunk)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.run_id is None:
            return False
        if exc_type is None:
            status = "FINISHED"
        elif issubclass(exc_type, KeyboardInterrupt):
            status = "KILLED"
        else:
            status = "FAILED"
            with contextlib.suppress(Exception):
                self.client.set_tag(self.run_id, "error", f"{exc_type.__name__}: {exc}"[:5000])
        self.client.set_terminated(self.run_id, status)
        return False

    def log_metrics(
        self, scalars: dict[str, float], series: dict[str, tuple[Any, Any]] | None = None
    ) -> int:
        """Log scalars (step 0) and series (``step`` = layer / order / train step) in batches.

        Returns the number of metric points sent.
        """
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        points = [Metric(k, float(v), now, 0) for k, v in scalars.items()]
        for name, (steps, values) in (series or {}).items():
            points += [Metric(name, float(v), now, int(s)) for s, v in zip(steps, values, strict=True)]
        for chunk in _chunks(points, MAX_METRICS):
            self.client.log_batch(self.run_id, metrics=chunk)
        return len(points)

    def log_artifacts(self, files: list[Path]) -> None:
        for f in files:
            if f.exists():
                self.client.log_artifact(self.run_id, str(f))

    def set_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])


# --------------------------------------------------------------------------- multiruns
def write_status(job_dir: Path, status: str, **extra: Any) -> None:
    """Record a job's outcome (FINISHED / SKIPPED / FAILED) in its job directory."""
    (job_dir / STATUS_FILE).write_text(json.dumps({"status": status, **extra}))


def read_parent(sweep_dir: Path) -> dict[str, str] | None:
    """The parent-run record a :class:`SweepCallback` left in the sweep directory."""
    f = sweep_dir / PARENT_FILE
    return json.loads(f.read_text()) if f.exists() else None


class SweepCallback(Callback):
    """Hydra callback: set up tracking once per multirun, before any job starts.

    ``on_multirun_start`` (launching process): creates the store schema and the
    experiment, opens a parent run that groups the sweep's jobs in the MLflow UI,
    and records it in ``<sweep dir>/mlflow_parent.json`` for the jobs.  At the end
    (or at exit, when Hydra aborts because a job failed) it counts job outcomes,
    logs them on the parent, closes it (FAILED if any job failed) and prints a summary.
    """

    def __init__(self) -> None:
        self._state: dict[str, Any] | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        tcfg = config.tracking
        if not tcfg.enabled:
            return
        uri = resolve_uri(tcfg.uri)
        exp_id = prepare_experiment(uri, tcfg.experiment)
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        client = _client(uri)
        overrides = " ".join(config.hydra.overrides.task)
        parent = client.create_run(
            exp_id,
            run_name=f"sweep·{sweep_dir.name}",
            tags={"sweep_id": str(sweep_dir), "rankexp.role": "sweep", "overrides": overrides,
                  "git_commit": git_commit()},
        )
        record = {"uri": uri, "experiment_id": exp_id, "run_id": parent.info.run_id,
                  "sweep_id": str(sweep_dir)}
        (sweep_dir / PARENT_FILE).write_text(json.dumps(record))
        self._state = {**record, "sweep_dir": sweep_dir, "t0": time.time()}
        log.info("MLflow: %s, experiment %r (id %s), sweep run %s", uri, tcfg.experiment, exp_id,
                 parent.info.run_id)
        atexit.register(self._finish, aborted=True)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._finish()

    def _finish(self, aborted: bool = False) -> None:
        """Close the parent run. ``aborted``: called at exit, not by ``on_multirun_end`` (Hydra
        raised: a job failed, Ctrl-C, a launcher error), so some jobs may never have run;
        without a failed job the parent is then KILLED, never FINISHED."""
        state, self._state = self._state, None
        if state is None:
            return
        counts = {"FINISHED": 0, "SKIPPED": 0, "FAILED": 0}
        for f in Path(state["sweep_dir"]).glob(f"*/{STATUS_FILE}"):
            status = json.loads(f.read_text()).get("status", "FAILED")
            counts[status] = counts.get(status, 0) + 1
        client = _client(state["uri"])
        # a job killed from outside never wrote its status: its run is still RUNNING
        stuck = client.search_runs(
            [state["experiment_id"]],
            filter_string=f"tags.mlflow.parentRunId = '{state['run_id']}' and attributes.status = 'RUNNING'",
        )
        for r in stuck:
            client.set_tag(r.info.run_id, "error", "job ended without reporting (killed or timed out)")
            client.set_terminated(r.info.run_id, "FAILED")
            counts["FAILED"] += 1
        now = int(time.time() * 1000)
        from mlflow.entities import Metric

        client.log_batch(
            state["run_id"],
            metrics=[Metric(f"jobs_{k.lower()}", v, now, 0) for k, v in counts.items()]
            + [Metric("sweep_seconds", time.time() - state["t0"], now, 0)],
        )
        status = "FAILED" if counts["FAILED"] else "KILLED" if aborted else "FINISHED"
        if status == "KILLED":
            client.set_tag(state["run_id"], "error", "sweep ended early (interrupted, or the "
                           "launcher failed): rerun the same command to resume")
        client.set_terminated(state["run_id"], status)
        log.info(
            "sweep %s: %d finished, %d skipped (already FINISHED), %d failed%s",
            state["sweep_id"], counts["FINISHED"], counts["SKIPPED"], counts["FAILED"],
            "; ended early, not every job ran" if status == "KILLED" else "",
        )


# --------------------------------------------------------------------------- reading back
def runs_table(
    experiments: list[str], uri: str | None = None, filter_string: str = "", finished_only: bool = True
):
    """All job runs of ``experiments`` as a pandas table (MLflow's ``search_runs`` layout).

    Columns ``run_id``, ``experiment_id``, ``status``, ``artifact_uri``, ``start_time``,
    ``end_time`` (UTC datetimes), ``params.<key>``, ``metrics.<key>`` (last value of each
    metric), ``tags.<key>``; newest first.  Sweep parent runs are left out.

    On a database store without ``filter_string`` the table is read with four SQL queries
    (runs, params, tags, latest metrics; MLflow's own table models), several times faster
    than ``mlflow.search_runs``, which builds an object per run, param and tag; with a
    filter, or on a tracking server, ``mlflow.search_runs`` reads it.

    Raises:
        TrackingError: none of the experiments exists in the store.
    """
    import mlflow
    import pandas as pd

    uri = resolve_uri(uri)
    client = _client(uri)
    ids = [e.experiment_id for n in experiments if (e := client.get_experiment_by_name(n))]
    if not ids:
        known = [e.name for e in client.search_experiments()]
        raise TrackingError(f"no experiment named {experiments} in {uri}; it has: {known}")
    store = client._tracking_client.store
    if not filter_string and hasattr(store, "engine"):
        df = _sql_runs_table(store.engine, ids, finished_only)
    else:
        clauses = [c for c in (filter_string, "attributes.status = 'FINISHED'" if finished_only
                               else "") if c]
        mlflow.set_tracking_uri(uri)
        df = mlflow.search_runs(experiment_ids=ids, filter_string=" and ".join(clauses),
                                output_format="pandas", max_results=100_000)
    if df.empty:
        return pd.DataFrame()
    if "tags.rankexp.role" in df:
        df = df[df["tags.rankexp.role"] != "sweep"]
    return df.reset_index(drop=True)


def _sql_runs_table(engine, experiment_ids: list[str], finished_only: bool):
    """``runs_table`` of active runs straight from the store's tables (see there)."""
    import pandas as pd
    from mlflow.store.tracking.dbmodels.models import SqlLatestMetric, SqlParam, SqlRun, SqlTag
    from sqlalchemy import select

    r = SqlRun
    query = select(r.run_uuid, r.experiment_id, r.status, r.artifact_uri, r.start_time,
                   r.end_time).where(r.experiment_id.in_([int(e) for e in experiment_ids]),
                                     r.lifecycle_stage == "active")
    if finished_only:
        query = query.where(r.status == "FINISHED")
    with engine.connect() as conn:
        # (plain tuples: pandas probes each SQLAlchemy Row for ``_fields``, ~20 µs a row)
        runs = pd.DataFrame(list(map(tuple, conn.execute(query))), columns=[
            "run_id", "experiment_id", "status", "artifact_uri", "start_time", "end_time"])
        if runs.empty:
            return pd.DataFrame()

        def long(model, *cols) -> list:
            rows = []
            for chunk in _chunks(list(runs["run_id"]), _BULK_RUNS_SQL):
                rows += map(tuple, conn.execute(select(model.run_uuid, *cols).where(
                    model.run_uuid.in_(chunk))))
            return rows

        m = SqlLatestMetric
        metrics = pd.DataFrame(long(m, m.key, m.value, m.is_nan),
                               columns=["run_id", "key", "value", "is_nan"])
        params = pd.DataFrame(long(SqlParam, SqlParam.key, SqlParam.value),
                              columns=["run_id", "key", "value"])
        tags = pd.DataFrame(long(SqlTag, SqlTag.key, SqlTag.value), columns=["run_id", "key", "value"])
    metrics["value"] = metrics["value"].astype("float64").where(~metrics["is_nan"].astype(bool))
    runs["experiment_id"] = runs["experiment_id"].astype(str)
    for col in ("start_time", "end_time"):
        runs[col] = pd.to_datetime(runs[col], unit="ms", utc=True)
    wide = [runs.set_index("run_id")]
    for prefix, long_table in (("metrics.", metrics), ("params.", params), ("tags.", tags)):
        if not long_table.empty:
            w = long_table.pivot(index="run_id", columns="key", values="value")
            wide.append(w.add_prefix(prefix))
    df = pd.concat(wide, axis=1).reindex(runs["run_id"])
    df = df.rename_axis("run_id").reset_index()
    return df.sort_values(["start_time", "run_id"], ascending=[False, True], kind="stable")


def experiment_names(uri: str | None = None) -> list[str]:
    """Names of the store's experiments that hold at least one run, oldest first.

    Raises:
        TrackingError: the store cannot be read.
    """
    from mlflow.exceptions import MlflowException

    client = _client(resolve_uri(uri))
    try:
        exps = client.search_experiments()
        return [
            e.name
            for e in sorted(exps, key=lambda e: int(e.experiment_id))
            if client.search_runs([e.experiment_id], max_results=1)
        ]
    except MlflowException as e:
        raise TrackingError(f"cannot list the experiments of {resolve_uri(uri)}: {e}") from None


def metric_history(uri: str | None, run_id: str, key: str):
    """``(steps, values)`` of one metric series of one run, sorted by step."""
    import numpy as np

    hist = sorted(_client(resolve_uri(uri)).get_metric_history(run_id, key), key=lambda m: m.step)
    return np.array([m.step for m in hist]), np.array([m.value for m in hist])


#: runs per bulk request: well under SQLite's bound-variable limit; the server's REST limit
_BULK_RUNS_SQL, _BULK_RUNS_REST, _BULK_REST_MAX_POINTS = 500, 100, 25_000


def metric_histories(uri: str | None, run_ids: list[str], keys: list[str]):
    """``{(run_id, key): (steps, values)}`` for every run and key that logged points, in bulk.

    On a database store one SQL query per 500 runs reads every key at once (MLflow's own
    ``metrics`` table model, SQLAlchemy Core rows: no ORM object per point); on a tracking
    server one request per key and 100 runs (its ``get-history-bulk`` endpoint, which the
    MLflow UI's charts use); one ``get_metric_history`` per run and key only on stores with
    neither. Each series is sorted by step (then time) like :func:`metric_history`; a
    (run, key) that logged nothing is absent.
    """
    import numpy as np

    client = _client(resolve_uri(uri))
    store = client._tracking_client.store  # the store behind the client (SQL or REST)
    run_ids, keys = list(dict.fromkeys(run_ids)), list(dict.fromkeys(keys))
    points: dict[tuple[str, str], list[tuple[int, int, float]]] = {}
    if hasattr(store, "engine"):
        points = _sql_history_bulk(store.engine, run_ids, keys)
    elif hasattr(store, "get_host_creds"):
        for key in keys:
            for chunk in _chunks(run_ids, _BULK_RUNS_REST):
                for run_id, pts in _rest_history_bulk(store, client, chunk, key).items():
                    points[(run_id, key)] = pts
    else:
        for run_id in run_ids:
            for key in keys:
                pts = [(m.step, m.timestamp, m.value) for m in client.get_metric_history(run_id, key)]
                if pts:
                    points[(run_id, key)] = pts
    out = {}
    for k, pts in points.items():
        pts.sort(key=lambda p: (p[0], p[1]))
        out[k] = (np.array([p[0] for p in pts], dtype=np.int64),
                  np.array([p[2] for p in pts], dtype=np.float64))
    return out


def _sql_history_bulk(engine, run_ids: list[str], keys: list[str]) -> dict[tuple[str, str], list]:
    from mlflow.store.tracking.dbmodels.models import SqlMetric
    from sqlalchemy import select

    m = SqlMetric
    points: dict[tuple[str, str], list] = {}
    with engine.connect() as conn:
        for chunk in _chunks(run_ids, _BULK_RUNS_SQL):
            query = select(m.run_uuid, m.key, m.step, m.timestamp, m.value, m.is_nan).where(
                m.key.in_(keys), m.run_uuid.in_(chunk))
            for run_id, key, step, ts, value, is_nan in conn.execute(query):
                points.setdefault((run_id, key), []).append(
                    (int(step), int(ts), float("nan") if is_nan else float(value)))
    return points


def _rest_history_bulk(store, client, run_ids: list[str], key: str) -> dict[str, list]:
    """One ``get-history-bulk`` request; a chunk whose answer may be cut at the server's
    point limit is read run by run instead."""
    from mlflow.utils.rest_utils import http_request

    resp = http_request(store.get_host_creds(), "/ajax-api/2.0/mlflow/metrics/get-history-bulk",
                        "GET", params={"run_id": run_ids, "metric_key": key,
                                       "max_results": _BULK_REST_MAX_POINTS})
    if resp.status_code != 200:
        raise TrackingError(f"{store.get_host_creds().host}: get-history-bulk answered "
                            f"{resp.status_code}: {resp.text[:300]}")
    metrics = resp.json().get("metrics", [])
    out: dict[str, list] = {}
    if len(metrics) >= _BULK_REST_MAX_POINTS:  # possibly truncated
        for run_id in run_ids:
            pts = [(m.step, m.timestamp, m.value) for m in client.get_metric_history(run_id, key)]
            if pts:
                out[run_id] = pts
        return out
    for m in metrics:
        out.setdefault(m["run_id"], []).append(
            (int(m.get("step", 0)), int(m.get("timestamp", 0)), float(m["value"])))
    return out


def download_artifact(uri: str | None, run_id: str, path: str, dst: str | None = None) -> Path:
    """Local path of the artifact ``path`` (e.g. ``arrays.npz``) of run ``run_id``.

    Downloaded into the existing folder ``dst`` (default: a new temporary folder).

    Raises:
        TrackingError: the run has no such artifact (e.g. logged with ``tracking.log_arrays=false``).
    """
    from mlflow.exceptions import MlflowException

    try:
        local = Path(_client(resolve_uri(uri)).download_artifacts(run_id, path, dst))
    except (MlflowException, OSError) as e:
        raise TrackingError(f"run {run_id} has no artifact {path!r} ({e})") from None
    if not local.exists():
        raise TrackingError(f"run {run_id} has no artifact {path!r}")
    return local
