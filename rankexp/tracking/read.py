"""The analysis' read path: runs as a table, metric histories in bulk, experiments, artifacts."""

from __future__ import annotations

from pathlib import Path

from .core import ROLE_MEMBER, TAG_LR, TAG_ROLE, TrackingError, _client, redact, resolve_uri

__all__ = ["MEMBERS_ATTR", "runs_table", "member_runs", "experiment_names", "metric_histories",
           "download_artifact"]

#: ``DataFrame.attrs`` key of :func:`runs_table`: ``{training run id: {lr tag: member run id}}``
MEMBERS_ATTR = "members"


def runs_table(experiments: list[str], uri: str | None = None, filter_string: str = "",
               finished_only: bool = True):
    """The job runs of ``experiments`` in ``mlflow.search_runs``' layout (``run_id``, ``status``,
    ``params.<k>``, ``metrics.<k>`` (last value), ``tags.<k>``, …; newest first), without sweep
    parents and member runs: those are in ``df.attrs[MEMBERS_ATTR]`` (``{run id: {f"{lr:g}":
    member run id}}``).  TrackingError if none of the experiments exists."""
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
        for _, m in df[df[role] == ROLE_MEMBER].iterrows():
            members.setdefault(m["tags.mlflow.parentRunId"], {})[m[f"tags.{TAG_LR}"]] = m["run_id"]
        df = df[~df[role].isin(["sweep", ROLE_MEMBER])]
    df = df.reset_index(drop=True)
    df.attrs[MEMBERS_ATTR] = members
    return df


def member_runs(uri: str | None, run_ids: list[str]) -> dict[str, dict[str, str]]:
    """``{training run id: {rankexp.lr tag: member run id}}`` of the active member runs of
    ``run_ids`` (runs without members are absent), one search per experiment."""
    client = _client(resolve_uri(uri))
    wanted, out = set(run_ids), {}
    for exp in {client.get_run(r).info.experiment_id for r in wanted}:
        for m in client.search_runs([exp], filter_string=f"tags.`{TAG_ROLE}` = '{ROLE_MEMBER}'",
                                    max_results=50_000):
            parent = m.data.tags.get("mlflow.parentRunId")
            if parent in wanted:
                out.setdefault(parent, {})[m.data.tags.get(TAG_LR, "")] = m.info.run_id
    return out


def experiment_names(uri: str | None = None) -> list[str]:
    """Names of the store's experiments that hold a run, oldest first (TrackingError if the
    store cannot be read)."""
    from mlflow.exceptions import MlflowException
    client = _client(resolve_uri(uri))
    try:
        return [e.name for e in sorted(client.search_experiments(), key=lambda e: int(e.experiment_id))
                if client.search_runs([e.experiment_id], max_results=1)]
    except MlflowException as e:
        raise TrackingError(f"cannot list the experiments of {redact(resolve_uri(uri))}: {e}") from None


def metric_histories(uri: str | None, run_ids: list[str], keys: list[str]):
    """``{(run_id, key): (steps, values)}`` for every run and key that logged points, each
    sorted by step (then time); asked in parallel (MLflow's ``get_metric_history``)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    client = _client(resolve_uri(uri))
    pairs = [(r, k) for r in dict.fromkeys(run_ids) for k in dict.fromkeys(keys)]
    with ThreadPoolExecutor(8) as pool:
        got = pool.map(lambda rk: sorted((m.step, m.timestamp, m.value)
                                         for m in client.get_metric_history(*rk)), pairs)
        return {rk: (np.array([p[0] for p in pts], dtype=np.int64),
                     np.array([p[2] for p in pts], dtype=np.float64))
                for rk, pts in zip(pairs, got, strict=True) if pts}


def download_artifact(uri: str | None, run_id: str, path: str, dst: str | None = None) -> Path:
    """Local path of run ``run_id``'s artifact ``path`` (e.g. ``arrays.npz``), downloaded into
    the folder ``dst`` (default: a new temporary one); TrackingError if it has none."""
    from mlflow.exceptions import MlflowException
    try:
        local = Path(_client(resolve_uri(uri)).download_artifacts(run_id, path, dst))
    except (MlflowException, OSError) as e:
        raise TrackingError(f"run {run_id} has no artifact {path!r} ({e})") from None
    if not local.exists():
        raise TrackingError(f"run {run_id} has no artifact {path!r}")
    return local
