"""The shared run loader: MLflow runs → one tidy pandas table."""

from __future__ import annotations

import pandas as pd

from rankexp.tracking import runs_table


def _numeric(s: pd.Series) -> pd.Series:
    converted = pd.to_numeric(s, errors="coerce")
    return converted if converted.notna().sum() == s.notna().sum() else s


def load_runs(
    experiments: str | list[str],
    uri: str | None = None,
    *,
    filter_string: str = "",
    finished_only: bool = True,
) -> pd.DataFrame:
    """One row per finished job run of ``experiments``.

    Column names drop MLflow's prefixes: params keep their dotted config keys
    (``depth``, ``alpha``, ``norm.placement``, ``nominal_ratio``…; numeric where
    every value parses), metrics are prefixed ``m:`` only if a param has the same
    name, tags keep ``tags.``.  ``run_id`` and ``status`` are kept.

    Args:
        experiments: MLflow experiment name(s).
        uri: tracking URI (default: ``$MLFLOW_TRACKING_URI`` or ``./mlflow.db``).
        filter_string: an MLflow search filter, e.g. ``"params.width = '256'"``.
        finished_only: leave out FAILED / RUNNING runs.

    Raises:
        rankexp.tracking.TrackingError: unknown experiment.
    """
    if isinstance(experiments, str):
        experiments = [experiments]
    raw = runs_table(experiments, uri, filter_string, finished_only)
    if raw.empty:
        return raw
    out = pd.DataFrame({"run_id": raw["run_id"], "status": raw["status"]})
    params = {c[len("params."):]: _numeric(raw[c]) for c in raw if c.startswith("params.")}
    metrics = {c[len("metrics."):]: raw[c] for c in raw if c.startswith("metrics.")}
    tags = {c: raw[c] for c in raw if c.startswith("tags.")}
    cols = dict(params)
    for k, v in metrics.items():
        cols[f"m:{k}" if k in params else k] = v
    cols.update(tags)
    return pd.concat([out, pd.DataFrame(cols)], axis=1)
