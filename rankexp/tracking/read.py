"""The read path of the analysis: runs as a pandas table, metric histories in bulk, the
experiments of a store, a run's artifacts."""

from __future__ import annotations

from pathlib import Path

from .core import ROLE_MEMBER, TAG_LR, TAG_ROLE, TrackingError, _client, redact, resolve_uri

__all__ = ["MEMBERS_ATTR", "runs_table", "member_runs", "experiment_names", "metric_history",
           "metric_histories", "download_artifact"]

#: ``DataFrame.attrs`` key of :func:`runs_table`: ``{training run id: {lr tag: member run id}}``
MEMBERS_ATTR = "members"
_BULK_RUNS_SQL = 500  # runs per SQL query: well under SQLite's bound-variable limit


def runs_table(experiments: list[str], uri: str | None = None, filter_string: str = "",
               finished_only: bool = True):
    """The job runs of ``experiments`` (``mlflow.search_runs``' layout: ``run_id``, ``status``,
    ``start_time``, ``end_time``, ``params.<k>``, ``metrics.<k>`` (last value), ``tags.<k>``;
    newest first), sweep parents and learning-rate member runs left out: the members of the
    table's training runs are in ``df.attrs[MEMBERS_ATTR]`` (``{run id: {f"{lr:g}": member
    run id}}``).

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
        raise TrackingError(f"no experiment named {experiments} in {redact(uri)}; it has: {known}")
    clauses = [c for c in (filter_string, "attributes.status = 'FINISHED'" if finished_only else "") if c]
    mlflow.set_tracking_uri(uri)
    df = mlflow.search_runs(experiment_ids=ids, filter_string=" and ".join(clauses),
                            output_format="pandas", max_results=100_000)
    if df.empty:
        return pd.DataFrame()
    members: dict[str, dict[str, str]] = {}
    role = f"tags.{TAG_ROLE}"
    if role in df:
        is_member = df[role] == ROLE_MEMBER
        for parent, lr, rid in zip(df.loc[is_member, "tags.mlflow.parentRunId"],
                                   df.loc[is_member, f"tags.{TAG_LR}"], df.loc[is_member, "run_id"],
                                   strict=True):
            members.setdefault(parent, {})[lr] = rid
        df = df[~df[role].isin(["sweep", ROLE_MEMBER])]
    df = df.reset_index(drop=True)
    df.attrs[MEMBERS_ATTR] = members
    return df


def member_runs(uri: str | None, run_ids: list[str], bulk: bool = True) -> dict[str, dict[str, str]]:
    """``{training run id: {rankexp.lr tag: member run id}}`` of the active member runs of
    ``run_ids`` (runs without members are absent): one search per experiment (``bulk``), or
    one per run."""
    client = _client(resolve_uri(uri))
    wanted, out = set(run_ids), {}
    role = f"tags.`{TAG_ROLE}` = '{ROLE_MEMBER}'"
    if bulk:
        queries = [(e, role) for e in {client.get_run(r).info.experiment_id for r in wanted}]
    else:
        queries = [(client.get_run(r).info.experiment_id, f"{role} and tags.mlflow.parentRunId = '{r}'")
                   for r in run_ids]
    for exp, filt in queries:
        for m in client.search_runs([exp], filter_string=filt, max_results=100_000):
            parent = m.data.tags.get("mlflow.parentRunId")
            if parent in wanted:
                out.setdefault(parent, {})[m.data.tags.get(TAG_LR, "")] = m.info.run_id
    return out


def experiment_names(uri: str | None = None) -> list[str]:
    """Names of the store's experiments that hold at least one run, oldest first.

    Raises:
        TrackingError: the store cannot be read.
    """
    from mlflow.exceptions import MlflowException

    client = _client(resolve_uri(uri))
    try:
        return [e.name for e in sorted(client.search_experiments(), key=lambda e: int(e.experiment_id))
                if client.search_runs([e.experiment_id], max_results=1)]
    except MlflowException as e:
        raise TrackingError(f"cannot list the experiments of {redact(resolve_uri(uri))}: {e}") from None


def metric_history(uri: str | None, run_id: str, key: str):
    """``(steps, values)`` of one metric series of one run, sorted by step."""
    import numpy as np

    hist = sorted(_client(resolve_uri(uri)).get_metric_history(run_id, key), key=lambda m: m.step)
    return np.array([m.step for m in hist]), np.array([m.value for m in hist])


def metric_histories(uri: str | None, run_ids: list[str], keys: list[str]):
    """``{(run_id, key): (steps, values)}`` for every run and key that logged points, each
    sorted by step (then time).  On a database store one SQL query per 500 runs (MLflow's
    ``metrics`` table model); elsewhere one ``get_metric_history`` per run and key."""
    import numpy as np

    client = _client(resolve_uri(uri))
    store = client._tracking_client.store  # the SQL store behind the client, if it is one
    run_ids, keys = list(dict.fromkeys(run_ids)), list(dict.fromkeys(keys))
    points: dict[tuple[str, str], list[tuple[int, int, float]]] = {}
    if hasattr(store, "engine"):
        from mlflow.store.tracking.dbmodels.models import SqlMetric as M
        from sqlalchemy import select

        with store.engine.connect() as conn:
            for i in range(0, len(run_ids), _BULK_RUNS_SQL):
                query = select(M.run_uuid, M.key, M.step, M.timestamp, M.value, M.is_nan).where(
                    M.key.in_(keys), M.run_uuid.in_(run_ids[i:i + _BULK_RUNS_SQL]))
                for run_id, key, step, ts, value, nan in conn.execute(query):
                    points.setdefault((run_id, key), []).append(
                        (int(step), int(ts), float("nan") if nan else float(value)))
    else:
        for run_id in run_ids:
            for key in keys:
                pts = [(m.step, m.timestamp, m.value) for m in client.get_metric_history(run_id, key)]
                if pts:
                    points[(run_id, key)] = pts
    out = {}
    for k, pts in points.items():
        pts.sort(key=lambda p: (p[0], p[1]))
        out[k] = (np.array([p[0] for p in pts], dtype=np.int64), np.array([p[2] for p in pts], dtype=np.float64))
    return out


def download_artifact(uri: str | None, run_id: str, path: str, dst: str | None = None) -> Path:
    """Local path of the artifact ``path`` (e.g. ``arrays.npz``) of run ``run_id``, downloaded
    into the folder ``dst`` (default: a new temporary folder).

    Raises:
        TrackingError: the run has no such artifact (e.g. ``tracking.log_arrays=false``).
    """
    from mlflow.exceptions import MlflowException

    try:
        local = Path(_client(resolve_uri(uri)).download_artifacts(run_id, path, dst))
    except (MlflowException, OSError) as e:
        raise TrackingError(f"run {run_id} has no artifact {path!r} ({e})") from None
    if not local.exists():
        raise TrackingError(f"run {run_id} has no artifact {path!r}")
    return local
