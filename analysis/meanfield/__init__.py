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


def worst(rows: pd.DataFrame, label: Callable[[pd.Series], str], unit: str = "",
          k: float = 3.0) -> Measured:
    """The row (``measured``, ``theory``, ``se``, ``bias``) of largest |measured − theory| /
    (k se + bias), as :class:`Measured`; NotRun without rows or seed spread."""
    if rows.empty:
        raise NotRun("the runs hold none of the rows this claim reads")
    allowance = k * rows["se"].astype(float) + rows["bias"].astype(float)
    if allowance.isna().any():
        raise NotRun("these runs have one seed each, so the seed spread the tolerance needs is unknown")
    gap = (rows["measured"] - rows["theory"]).abs()
    dev = pd.Series(np.where(allowance > 0, gap / allowance.where(allowance > 0, 1.0),
                             np.where(gap > 0, np.inf, 0.0)), index=rows.index)
    r = rows.loc[dev.idxmax()]
    return Measured(float(dev.max()), math.nan,
                    f"worst: {label(r)}: {r['measured']:.4g}{unit} vs theory {r['theory']:.4g}{unit} "
                    f"(allowance ±{k * r['se'] + r['bias']:.2g} = {k:.3g} s.e. + bias "
                    f"{r['bias']:.2g}); "
                    f"{len(rows)} row(s)")


#: a worst-of-many-rows claim on a positive quantity x (1 − c_l, q_l) whose seeds scatter as a
#: log-normal random walk in depth (:func:`log_walk`); Bonferroni over the rows at 1 %
FAMILY = Check("≤ 1 (|log E x − log theory| ≤ t·s.e. + bias; t: Bonferroni over the rows at "
               "1 %; s.e. from the seeds' log-normal random walk)", lambda v: v <= 1.0)


def log_walk(x: np.ndarray, expected: np.ndarray, memory: float = 1.0) -> dict[str, np.ndarray]:
    """Error model of a positive per-seed series ``x`` ``(seeds, L+1)`` (layer 0 = the input)
    against its expectation ``expected`` ``(L+1,)``: y_l = log(x_l/expected_l) is a random walk
    in l, Var y_l = σ² l, σ² pooled over the seeds' steps across blocks of max(L/8, ``memory``)
    layers (``memory``: how long a step stays correlated; df = (seeds − 1)·blocks);
    log E x_l − log expected_l = ȳ_l + σ² l / 2 (log-normal). Per layer ≥ 1: ``layer``,
    ``log_ratio`` (that estimate), ``se`` (of it) and ``df``."""
    k, steps = x.shape[0], x.shape[1] - 1
    if k < 2:
        raise NotRun("these runs have one seed each, so the seed spread the tolerance needs is "
                     "unknown")
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.log(x / expected)
    if not np.isfinite(y).all():
        raise NotRun("a seed's series reaches 0 or is not finite (a dead network)")
    b = min(steps, math.ceil(max(steps / 8, memory)))
    ends = np.arange(0, steps + 1, b)
    s2 = float(np.var(np.diff(y[:, ends], axis=1), axis=0, ddof=1).mean()) / b
    df = (k - 1) * (len(ends) - 1)
    layer = np.arange(1, steps + 1)
    v = s2 * layer
    return {"layer": layer, "log_ratio": y[:, 1:].mean(0) + v / 2,
            "se": np.sqrt(v / k + v**2 / (2 * df)), "df": np.full(steps, df)}


def family(rows: pd.DataFrame, label: Callable[[pd.Series], str]) -> Measured:
    """:func:`worst` of :func:`log_walk` rows (and ``bias``) against 0 at the Bonferroni quantile
    of Student's t: the claim's false-alarm rate over all its rows is ≤ 1 %."""
    from scipy.stats import t as student

    k = float(student.ppf(1 - 0.01 / (2 * max(len(rows), 1)), rows["df"].min()))
    return worst(rows.assign(measured=rows["log_ratio"], theory=0.0), label, k=k)


def seed_array(runs: Runs, run_id: str, key: str) -> np.ndarray:
    """The run's per-seed series ``key`` ``(seeds, L+1)`` (its ``arrays.npz``); NotRun without."""
    a = runs.arrays(run_id)
    if a is None or key not in a or np.ndim(a[key]) != 2:
        raise NotRun(f"the runs lack the per-seed series {key} (arrays.npz)")
    return a[key]


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
