"""Seed spread from each run's own per-seed statistics, not the spread over runs.

A ``task=measure`` run batches ``seeds`` independent draws (weights and input) and logs
``<metric>`` (their mean) and ``<metric>_std`` (their standard deviation, ddof 1;
:meth:`rankexp.result.Measurement.add_seed_stat`).  A figure cell may hold several runs (a
rerun with another ``seed`` offset); its spread is that of **all seeds of all its runs**,
pooled exactly from the runs' means, stds and seed counts — the same number as the std of
the per-seed values in the runs' ``arrays.npz``, without reading them.  A ``task=train`` run
is one seed: its cell's spread is the std over its runs (one per seed offset).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .select import SelectionError


def seed_counts(df: pd.DataFrame) -> pd.Series:
    """Seeds per run: the ``seeds`` param of measure runs, 1 for train runs (or no param)."""
    n = df["seeds"].astype(float) if "seeds" in df else pd.Series(1.0, index=df.index)
    if "task.name" in df:
        n = n.where(df["task.name"].astype(str) != "train", 1.0)
    return n.fillna(1.0)


def pooled(df: pd.DataFrame, metric: str, keys: list[str]) -> pd.DataFrame:
    """Mean and seed standard deviation of ``metric`` per cell of ``keys``, over every seed.

    With run means ``m_i``, stds ``s_i`` (``<metric>_std``; 0 where not logged) and ``n_i``
    seeds (:func:`seed_counts`): ``N = Σ n_i``, ``mean = Σ n_i m_i / N``,
    ``std² = (Σ (n_i − 1) s_i² + n_i (m_i − mean)²) / (N − 1)`` (NaN for N = 1).

    Returns:
        Indexed by ``keys``: ``mean``, ``std``, ``seeds`` (N), ``runs``.

    Raises:
        SelectionError: ``metric`` or a key is not a column of ``df``.
    """
    missing = [c for c in [metric, *keys] if c not in df]
    if missing:
        raise SelectionError(f"runs have no column(s) {missing}")
    d = pd.DataFrame({
                         "m": df[metric].astype(float),
                         "s": df[f"{metric}_std"].astype(float).fillna(0.0)
                         if f"{metric}_std" in df
                         else 0.0,
                         "n": seed_counts(df),
                     })
    d[keys] = df[keys]
    d = d[np.isfinite(d["m"])]

    def one(g: pd.DataFrame) -> pd.Series:
        n, m, s = g["n"].to_numpy(), g["m"].to_numpy(), g["s"].to_numpy()
        total = n.sum()
        mean = float((n * m).sum() / total)
        ss = ((n - 1) * s**2 + n * (m - mean) ** 2).sum()
        std = float(np.sqrt(ss / (total - 1))) if total > 1 else np.nan
        return pd.Series({"mean": mean, "std": std, "seeds": int(total), "runs": len(g)})

    if not keys:
        return one(d).to_frame().T
    return d.groupby(keys, sort=True).apply(one, include_groups=False)
