"""Runs for a figure or a claim: load them, check their columns, select by params, read series.

Every figure command and every claim selects through these helpers, and every one of them
raises the same error, :class:`SelectionError` (a :class:`KeyError`), with a message that says
what is missing and how to get it: ``python -m analysis`` prints it and exits with status 2;
the claims table reads it as *not run* (:data:`analysis.core.claims.NotRun` is this class).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from .runs import PARAMS_ATTR, cached_series, load_runs

log = logging.getLogger("analysis")

PLACEMENT = "norm.placement"
PLACEMENT_ORDER = ["pre", "post", "output", "peri", "none"]
OP_ORDER = ["rmsnorm", "detached", "meansub", "layernorm"]

#: config keys that define a network (and its measurement); runs compared on one axis
#: should agree on the ones that are not axes of the figure
CONFIG_KEYS = (PLACEMENT, "norm.op", "depth", "width", "expansion", "matrices", "activation",
               "skip_every", "alpha", "beta", "beta_scaling", "seeds", "seed", "dtype")
#: params that are functions of others (βα^M, β/√L…) or that only tell repeated runs of one
#: config apart (the seed offset): never a reason to keep two runs out of one cell
DERIVED_PARAMS = ("beta_eff", "nominal_ratio", "depth_factor", "seed", "size")
#: metrics only task=train runs log (a hint when a selection lacks them)
_TRAIN_METRICS = ("best_", "max_stable", "final_")


class SelectionError(KeyError):
    """The runs lack what a figure or claim selects (an experiment, a param value, a column,
    a series); the message says what and how to get it."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def load(args: argparse.Namespace, columns: Iterable[str] = (), *,
         experiments: list[str] | None = None, probe: str | None = None,
         where: list[str] | None = None) -> pd.DataFrame:
    """Finished runs of ``experiments`` (default ``args.experiment``; ``--uri``, ``--filter``,
    ``--where``) that have every one of ``columns``.

    Raises:
        SelectionError: no run (matching the filters), or a column they lack (naming ``probe``).
        rankexp.tracking.TrackingError: the store cannot be read, or has no such experiment."""
    experiments = experiments or args.experiment
    df = load_runs(experiments, args.uri, filter_string=args.filter)
    if df.empty:
        where = f" matching --filter {args.filter!r}" if args.filter else ""
        raise SelectionError(
            f"experiment(s) {experiments} hold no finished runs{where}; run the sweep first "
            f"(python -m rankexp experiment={experiments[0]} -m)")
    df = select(df, getattr(args, "where", []) or [] if where is None else where, experiments)
    require(df, list(columns), experiments, probe)
    return df


def select(df: pd.DataFrame, where: list[str], experiments: list[str]) -> pd.DataFrame:
    """Rows whose params match every ``KEY=VALUE`` of ``where``; SelectionError for a malformed
    item, an unknown key, or no run left (listing the values present)."""
    for item in where:
        key, sep, value = item.partition("=")
        if not sep:
            raise SelectionError(f"--where wants KEY=VALUE, got {item!r}")
        require(df, [key], experiments)
        col = df[key]
        if pd.api.types.is_numeric_dtype(col):
            try:
                mask = np.isclose(col.astype(float), float(value), rtol=1e-9, atol=0)
            except ValueError:
                raise SelectionError(f"--where {item!r}: {key} is numeric, {value!r} is not") from None
        else:
            mask = col.astype(str) == value
        if not mask.any():
            raise SelectionError(
                f"--where {item!r}: no run of {experiments} has {key} = {value}; "
                f"values present: {sorted(col.dropna().unique().tolist(), key=str)}")
        df = df[mask]
    return df.reset_index(drop=True)


def only(df: pd.DataFrame, **where) -> pd.DataFrame:
    """Rows whose params equal every ``key=value`` (``norm_placement`` → ``norm.placement``,
    ``a__b`` → ``a.b``; numbers to 1e-9); SelectionError for a missing param or no row left."""
    for k, v in where.items():
        col = k.replace("__", ".").replace("norm_placement", PLACEMENT).replace("norm_op", "norm.op")
        if col not in df:
            raise SelectionError(f"runs have no param {col}")
        if isinstance(v, float | int) and not isinstance(v, bool):
            mask = np.isclose(pd.to_numeric(df[col], errors="coerce"), v, rtol=1e-9, atol=1e-12)
        else:
            mask = df[col].astype(str) == str(v)
        df = df[mask]
        if df.empty:
            raise SelectionError(f"no run with {col} = {v}")
    return df.reset_index(drop=True)


def require(df: pd.DataFrame, columns: Sequence[str], experiments: Sequence[str] | None = None,
            probe: str | None = None) -> None:
    """Raises SelectionError naming the experiment, the columns its runs lack and where they
    come from (``probe``; a task=train metric)."""
    missing = [c for c in columns if c not in df]
    if not missing:
        return
    if probe:
        hint = f"were they run with task.probes=[{probe}]?"
    elif any(str(c).startswith(_TRAIN_METRICS) for c in missing):
        hint = "are these task=train runs?"
    else:
        hint = "was the probe that logs them in task.probes?"
    of = f" of experiment(s) {list(experiments)}" if experiments else ""
    raise SelectionError(
        f"runs{of} have no column(s) {missing} ({hint}); "
        f"available: {', '.join(sorted(map(str, df.columns)))}")


def need(df: pd.DataFrame, *columns: str) -> None:
    """:func:`require` for a claim: the runs have every one of ``columns``."""
    missing = [c for c in columns if c not in df]
    if missing:
        raise SelectionError(f"runs have no {', '.join(missing)} (was the probe that logs it run?)")


def series(uri: str | None, run_id: str, key: str) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` of one run's series ``key``, read in bulk for the store's last load
    (:func:`analysis.core.runs.cached_series`); SelectionError if the run never logged it."""
    got = cached_series(uri, run_id, key)
    if got is None or got[0].size == 0:
        raise SelectionError(
            f"run {run_id} has no series {key!r} (was the probe that logs it in task.probes?)")
    return got


def ordered(values, order: list[str]) -> list:
    """Distinct ``values`` in the given ``order``, unknown ones last (sorted as text)."""
    values = list(dict.fromkeys(values))
    return sorted(values, key=lambda v: (order.index(v) if v in order else 99, str(v)))


def varying(df: pd.DataFrame, keys: Iterable[str]) -> list[str]:
    """The ``keys`` (present in ``df``) that take more than one value."""
    return [k for k in keys if k in df and df[k].astype(str).nunique() > 1]


def warn_mixed(df: pd.DataFrame, axes: Iterable[str], experiments: Sequence[str],
               keys: Iterable[str] = CONFIG_KEYS) -> dict[str, list]:
    """Warn about the ``keys`` (not ``axes``) whose value differs between runs a figure averages;
    returns ``{key: sorted distinct values}``."""
    axes = set(axes)
    mixed = {}
    for k in keys:
        if k in df and k not in axes:
            values = sorted(df[k].dropna().unique().tolist(), key=str)
            if len(values) > 1:
                mixed[k] = values
    if mixed:
        log.warning(
            "experiment(s) %s: runs differ in %s, which this figure does not separate; they "
            "are averaged (select with --where KEY=VALUE or --filter \"params.`KEY` = 'VALUE'\")",
            list(experiments), ", ".join(f"{k} ∈ {v}" for k, v in mixed.items()))
    return mixed


def mixed_cells(df: pd.DataFrame, cells: Sequence[str]) -> dict[str, list]:
    """``{param: sorted values}`` of params (the table's param columns, else :data:`CONFIG_KEYS`)
    that differ between runs of one cell of ``cells``."""
    params = df.attrs.get(PARAMS_ATTR) or [k for k in CONFIG_KEYS if k in df]
    others = [k for k in params if k in df and k not in set(cells) and k not in DERIVED_PARAMS]
    if not others or df.empty:
        return {}
    text = df[others].astype(str)
    counts = text.groupby([df[c].astype(str) for c in cells], dropna=False).nunique()
    bad = [k for k in others if (counts[k] > 1).any()]
    return {k: sorted(df[k].dropna().unique().tolist(), key=str) for k in bad}


def refuse_mixed(df: pd.DataFrame, cells: Sequence[str], command: str) -> None:
    """SelectionError (exit 2) naming every param whose value differs within a cell."""
    mixed = mixed_cells(df, cells)
    if mixed:
        first = next(iter(mixed))
        raise SelectionError(
            f"{command}: runs in one cell differ in "
            + "; ".join(f"{k} ∈ {v}" for k, v in mixed.items())
            + f" — they would be averaged. Select some with --filter \"params.`{first}` = "
            f"'{mixed[first][0]}'\", or make the param an axis (--panel {first})")


# --------------------------------------------------------------------------- seed spread
def pooled(df: pd.DataFrame, metric: str, keys: list[str]) -> pd.DataFrame:
    """Mean and seed standard deviation of ``metric`` per cell of ``keys``, over every seed of
    every run of the cell (a ``task=train`` run is one seed).

    With run means ``m_i``, stds ``s_i`` (``<metric>_std``; 0 where not logged) and ``n_i``
    seeds: ``N = Σ n_i``, ``mean = Σ n_i m_i / N``,
    ``std² = (Σ (n_i − 1) s_i² + n_i (m_i − mean)²) / (N − 1)`` (NaN for N = 1).
    Returns ``mean``, ``std``, ``seeds`` (N), ``runs`` indexed by ``keys``; SelectionError for a
    missing column."""
    missing = [c for c in [metric, *keys] if c not in df]
    if missing:
        raise SelectionError(f"runs have no column(s) {missing}")
    s = df[f"{metric}_std"].astype(float).fillna(0.0) if f"{metric}_std" in df else 0.0
    n = df["seeds"].astype(float) if "seeds" in df else pd.Series(1.0, index=df.index)
    if "task.name" in df:  # a train run is one seed
        n = n.where(df["task.name"].astype(str) != "train", 1.0)
    d = pd.DataFrame({"m": df[metric].astype(float), "s": s, "n": n.fillna(1.0)})
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
