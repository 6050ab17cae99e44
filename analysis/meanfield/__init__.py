"""The mean-field chapter (the chapter, 215.1–215.9): what its experiments share."""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable

import numpy as np
import pandas as pd

from rankexp.tracking import download_artifact

from ..core.claims import Check, Claim, Measured, NotRun, Runs
from ..core.registry import Experiment, Needs
from ..core.runner import Command

#: what a claim reads: an experiment's runs, a function of the runs, or (experiment, rows)
Table = str | Callable[[Runs], pd.DataFrame] | tuple[str, Callable[[pd.DataFrame], pd.DataFrame]]


def newest(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """One run per combination of ``keys``: the newest (a rerun supersedes)."""
    if "start_time" in df:
        df = df.sort_values("start_time", ascending=False)
    return df.drop_duplicates(keys).reset_index(drop=True)


def edges(centers) -> np.ndarray:
    """Cell edges around sorted ``centers`` (midpoints; end cells mirrored)."""
    c = np.asarray(centers, dtype=float)
    if c.size == 1:
        return np.array([c[0] - 0.5, c[0] + 0.5]) if c[0] else np.array([-0.5, 0.5])
    mid = 0.5 * (c[1:] + c[:-1])
    return np.concatenate([[c[0] - (mid[0] - c[0])], mid, [c[-1] + (c[-1] - mid[-1])]])


def arrays(uri: str | None, run_id: str) -> dict[str, np.ndarray]:
    """The run's ``arrays.npz`` artifact as a dict of arrays."""
    with tempfile.TemporaryDirectory() as tmp:
        with np.load(download_artifact(uri, run_id, "arrays.npz", tmp)) as z:
            return {k: z[k] for k in z.files}


def values_text(df: pd.DataFrame, key: str) -> str:
    if key not in df:
        return "?"
    vals = sorted(df[key].dropna().unique().tolist())
    fmt = [f"{v:g}" if isinstance(v, float) else str(v) for v in vals]
    return fmt[0] if len(fmt) == 1 else "{" + ", ".join(fmt) + "}"


#: a deviation in units of its allowance (3 s.e. + the stated bias) holds at ≤ 1
WITHIN = Check("≤ 1 (|Δ| ≤ 3 s.e. + bias)", lambda v: v <= 1.0)


def standard_error(std, seeds):
    """Standard error of a seed mean: s.d. / √seeds (NaN with one seed)."""
    seeds = np.asarray(seeds, dtype=float)
    return np.where(seeds > 1, np.asarray(std, dtype=float) / np.sqrt(np.maximum(seeds, 1)), np.nan)


def worst(rows: pd.DataFrame, label: Callable[[pd.Series], str], unit: str = "") -> Measured:
    """The row (``measured``, ``theory``, ``se``, ``bias``) of largest |measured − theory| /
    (3 se + bias), as :class:`Measured`; NotRun without rows or seed spread."""
    if rows.empty:
        raise NotRun("the runs hold none of the rows this claim reads")
    allowance = 3 * rows["se"].astype(float) + rows["bias"].astype(float)
    if allowance.isna().any():
        raise NotRun("these runs have one seed each, so the seed spread the tolerance needs is unknown")
    gap = (rows["measured"] - rows["theory"]).abs()
    dev = pd.Series(np.where(allowance > 0, gap / allowance.where(allowance > 0, 1.0),
                             np.where(gap > 0, np.inf, 0.0)), index=rows.index)
    r = rows.loc[dev.idxmax()]
    return Measured(float(dev.max()), math.nan,
                    f"worst: {label(r)}: {r['measured']:.4g}{unit} vs theory {r['theory']:.4g}{unit} "
                    f"(allowance ±{3 * r['se'] + r['bias']:.2g} = 3 s.e. + bias {r['bias']:.2g}); "
                    f"{len(rows)} row(s)")


#: claim id → (the table it reads, a pure function of that table → Measured)
FUNCTIONS: dict[str, tuple[Table, Callable[[pd.DataFrame], Measured]]] = {}


def claim(cid: str, statement: str, source: str, study: str, table: Table,
          fn: Callable[[pd.DataFrame], Measured], check: Check = WITHIN,
          size: str = "cpu") -> Claim:
    """A chapter claim: ``fn`` of ``table(runs)``, of an experiment's runs (``table`` its name)
    or of ``rows(runs(experiment))`` (``table = (experiment, rows)``), built once per store
    (``Runs.cache``); a column the runs lack is *not run*."""
    FUNCTIONS[cid] = (table, fn)

    def measure(runs: Runs) -> Measured:
        if table not in runs.cache:
            try:
                runs.cache[table] = (runs(table) if isinstance(table, str) else
                                     table[1](runs(table[0])) if isinstance(table, tuple) else
                                     table(runs))
            except KeyError as e:
                raise NotRun(f"the runs lack the column {e}") from e
        return fn(runs.cache[table])

    return Claim(cid, statement, source, study, check, measure, size=size)


def entry(eid: str, title: str, source: str, claims: tuple[Claim, ...], main, help_: str, *,
          arguments=None, needs: Needs | None = None) -> tuple[dict[str, Command], tuple]:
    """``(COMMANDS, EXPERIMENTS)`` of a chapter experiment: the command ``eid`` (``main``,
    ``help_``, ``--where``, ``arguments``) and the registry entry drawn by ``eid -e eid``."""
    return ({eid: Command(main, help_, eid, True, arguments)},
            (Experiment(eid, title, source, analyses=(f"{eid} -e {eid}",), claims=claims,
                        needs=needs or Needs()),))
