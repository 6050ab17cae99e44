"""The read path for the analysis: runs as a pandas table, metric histories in bulk, the
experiments of a store and a run's artifacts."""

from __future__ import annotations

from pathlib import Path

from .schema import ROLE_MEMBER, TAG_LR, TAG_ROLE, TrackingError, _chunks
from .store import _client, resolve_uri

#: ``DataFrame.attrs`` key of :func:`runs_table`: ``{training run id: {lr tag: member run id}}``
MEMBERS_ATTR = "members"


def runs_table(
    experiments: list[str], uri: str | None = None, filter_string: str = "", finished_only: bool = True
):
    """All job runs of ``experiments`` as a pandas table (MLflow's ``search_runs`` layout).

    Columns ``run_id``, ``experiment_id``, ``status``, ``artifact_uri``, ``start_time``,
    ``end_time`` (UTC datetimes), ``params.<key>``, ``metrics.<key>`` (last value of each
    metric), ``tags.<key>``; newest first.  Sweep parent runs and learning-rate member runs
    are left out (one row per config); the members of the table's training runs are in
    ``df.attrs[MEMBERS_ATTR]``: ``{training run id: {rankexp.lr tag (``f"{lr:g}"``): member
    run id}}`` (with a ``filter_string``, those the filter selects too).

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
    members = dict(df.attrs.get(MEMBERS_ATTR, {}))
    role = f"tags.{TAG_ROLE}"
    if role in df:
        is_member = df[role] == ROLE_MEMBER
        if is_member.any():
            for parent, lr, rid in zip(df.loc[is_member, "tags.mlflow.parentRunId"],
                                       df.loc[is_member, f"tags.{TAG_LR}"],
                                       df.loc[is_member, "run_id"], strict=True):
                members.setdefault(parent, {})[lr] = rid
        df = df[~df[role].isin(["sweep", ROLE_MEMBER])]
    df = df.reset_index(drop=True)
    df.attrs[MEMBERS_ATTR] = members
    return df


def member_runs(uri: str | None, run_ids: list[str], bulk: bool = True) -> dict[str, dict[str, str]]:
    """``{training run id: {rankexp.lr tag: member run id}}`` of the active member runs of
    ``run_ids`` (runs without members are absent): one query per 500 runs on a database store
    (unless not ``bulk``), else one search per run (a tracking server)."""
    client = _client(resolve_uri(uri))
    store = client._tracking_client.store
    out: dict[str, dict[str, str]] = {}
    if bulk and hasattr(store, "engine"):
        for parent, lr, rid in _sql_members(store.engine, list(run_ids)):
            out.setdefault(parent, {})[lr] = rid
        return out
    for run_id in run_ids:
        exp = client.get_run(run_id).info.experiment_id
        for r in client.search_runs([exp], max_results=10_000, filter_string=(
                f"tags.mlflow.parentRunId = '{run_id}' and tags.`{TAG_ROLE}` = '{ROLE_MEMBER}'")):
            out.setdefault(run_id, {})[r.data.tags.get(TAG_LR, "")] = r.info.run_id
    return out


def _sql_members(engine, parents: list[str]) -> list[tuple[str, str, str]]:
    """``(parent, lr tag, member id)`` of the active member runs of ``parents``."""
    from mlflow.store.tracking.dbmodels.models import SqlRun, SqlTag
    from sqlalchemy import and_, select
    from sqlalchemy.orm import aliased

    parent, role, lr = aliased(SqlTag), aliased(SqlTag), aliased(SqlTag)
    rows = []
    with engine.connect() as conn:
        for chunk in _chunks(parents, _BULK_RUNS_SQL):
            query = (select(parent.value, lr.value, SqlRun.run_uuid)
                     .join(parent, and_(parent.run_uuid == SqlRun.run_uuid,
                                        parent.key == "mlflow.parentRunId"))
                     .join(role, and_(role.run_uuid == SqlRun.run_uuid, role.key == TAG_ROLE,
                                      role.value == ROLE_MEMBER))
                     .join(lr, and_(lr.run_uuid == SqlRun.run_uuid, lr.key == TAG_LR))
                     .where(parent.value.in_(chunk), SqlRun.lifecycle_stage == "active"))
            rows += map(tuple, conn.execute(query))
    return rows


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

        tags = pd.DataFrame(long(SqlTag, SqlTag.key, SqlTag.value), columns=["run_id", "key", "value"])
        # member runs: only their tags are read (they hold the config's params, ×members)
        by = tags[tags["key"].isin([TAG_ROLE, TAG_LR, "mlflow.parentRunId"])].pivot(
            index="run_id", columns="key", values="value")
        members: dict[str, dict[str, str]] = {}
        if TAG_ROLE in by:
            mem = by[by[TAG_ROLE] == ROLE_MEMBER]
            for rid, row in mem.iterrows():
                members.setdefault(row.get("mlflow.parentRunId"), {})[row.get(TAG_LR)] = rid
            if len(mem):
                runs = runs[~runs["run_id"].isin(mem.index)].reset_index(drop=True)
                tags = tags[~tags["run_id"].isin(mem.index)]
                if runs.empty:
                    return pd.DataFrame()
        m = SqlLatestMetric
        metrics = pd.DataFrame(long(m, m.key, m.value, m.is_nan),
                               columns=["run_id", "key", "value", "is_nan"])
        params = pd.DataFrame(long(SqlParam, SqlParam.key, SqlParam.value),
                              columns=["run_id", "key", "value"])
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
    df = df.sort_values(["start_time", "run_id"], ascending=[False, True], kind="stable")
    df.attrs[MEMBERS_ATTR] = members
    return df


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
