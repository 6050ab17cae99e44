"""The study's quantitative claims, each checked against whatever runs a store holds.

Every entry of :data:`CLAIMS` is one :class:`Claim`: the study's statement, where it says
so, its value, a stated tolerance, and a ``measure`` function that computes the measured
value (± seed spread) from the loaded runs.  :func:`evaluate` turns each into a verdict —
``holds``, ``does not hold`` or ``not run`` (the store lacks the runs, params or metrics
the claim needs; the note says which) — and ``python -m analysis report`` tabulates them.

Adding a claim (a new experiment: mean-field lab, degradation, GPT-2, figures 10–15) needs
no change to the report:

1. write ``def _my_claim(runs: Runs) -> Measured`` — read runs with ``runs("fig12")``
   (finished runs of that MLflow experiment, one row per run; raises :class:`NotRun` when it
   has none), select with ``only(df, key=value)``, per-layer series with
   ``runs.series(run_id, key)``, per-seed values with ``runs.per_seed(df, key)``; raise
   :class:`NotRun` with a reason when the runs that would decide it are missing;
2. register it: ``register(Claim("fig12.cos_init", "fig12", "…statement…", "science.md §4
   fig12", "≈ 1/d", near(0.0, 0.01), _my_claim))`` in a module of your experiment (the
   study's own are in :mod:`analysis.study_claims`) and add that module's name to
   :data:`PLUGINS`; :func:`claims` imports them.

``measure`` returns :class:`Measured`: ``value`` computed from the seed means and
``spread`` = one standard deviation over seeds (from each run's logged ``<metric>_std``,
pooled by :func:`analysis.seeds.pooled`; or, for a statistic fitted across runs such as a
slope, the standard deviation of that statistic recomputed seed by seed from the per-seed
arrays in each run's ``arrays.npz`` — :func:`seedwise`).  NaN where no spread exists.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from rankexp.tracking import TrackingError, download_artifact

from .common import PLACEMENT, series
from .runs import load_runs
from .seeds import pooled

log = logging.getLogger("analysis")

HOLDS, FAILS, NOT_RUN, ERROR = "holds", "does not hold", "not run", "error"
#: modules whose import registers claims: the study's, then later experiments' (add yours)
PLUGINS: list[str] = ["analysis.study_claims"]


class NotRun(Exception):
    """The store lacks what a claim needs (the message says what)."""


@dataclass(frozen=True)
class Measured:
    """A measured value, its seed spread (1 s.d.; NaN if none) and a short note."""

    value: float
    spread: float = math.nan
    note: str = ""


@dataclass(frozen=True)
class Check:
    """A tolerance stated as text with the test that decides it."""

    text: str
    passes: Callable[[float], bool]


def near(target: float, tol: float) -> Check:
    """``|value − target| ≤ tol``."""
    return Check(f"±{tol:g}", lambda v: abs(v - target) <= tol)


def at_most(bound: float) -> Check:
    return Check(f"≤ {bound:g}", lambda v: v <= bound)


def at_least(bound: float) -> Check:
    return Check(f"≥ {bound:g}", lambda v: v >= bound)


def below(bound: float) -> Check:
    return Check(f"< {bound:g}", lambda v: v < bound)


def above(bound: float) -> Check:
    return Check(f"> {bound:g}", lambda v: v > bound)


@dataclass(frozen=True)
class Claim:
    """One quantitative claim of the study.

    Attributes:
        id: unique, ``<experiment>.<name>``.
        experiment: the MLflow experiment (and report section) it is judged on.
        statement: the claim in the study's words.
        source: where the study makes it (``science.md §3 fig5``, ``Table 4``).
        study: the study's value as text.
        check: the stated tolerance (:func:`near`, :func:`at_most`, …).
        measure: loaded runs → :class:`Measured`; raises :class:`NotRun`.
    """

    id: str
    experiment: str
    statement: str
    source: str
    study: str
    check: Check
    measure: Callable[[Runs], Measured] = field(repr=False)


@dataclass
class Verdict:
    claim: Claim
    verdict: str
    measured: Measured | None = None
    note: str = ""

    def row(self) -> dict:
        m = self.measured
        return {
            "id": self.claim.id,
            "experiment": self.claim.experiment,
            "claim": self.claim.statement,
            "source": self.claim.source,
            "study": self.claim.study,
            "measured": format_measured(m) if m else "—",
            "value": m.value if m else math.nan,
            "spread": m.spread if m else math.nan,
            "tolerance": self.claim.check.text,
            "verdict": self.verdict,
            "note": self.note or (m.note if m else ""),
        }


def format_measured(m: Measured) -> str:
    def f(v: float) -> str:
        if math.isinf(v):
            return "−∞" if v < 0 else "∞"
        return f"{v:.3g}"

    if math.isnan(m.value):
        return "—"
    return f(m.value) if math.isnan(m.spread) else f"{f(m.value)} ± {m.spread:.2g}"


# --------------------------------------------------------------------------- loaded runs
class Runs:
    """Finished runs of a store, loaded once per experiment (:func:`analysis.runs.load_runs`),
    their series and per-seed arrays."""

    def __init__(self, uri: str | None):
        self.uri = uri
        self._frames: dict[str, pd.DataFrame] = {}
        self._arrays: dict[str, dict | None] = {}
        self._tmp = tempfile.TemporaryDirectory(prefix="rankexp-claims-")
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per run

    def __call__(self, experiment: str) -> pd.DataFrame:
        """Finished runs of ``experiment``. Raises NotRun if it has none."""
        if experiment not in self._frames:
            try:
                self._frames[experiment] = load_runs(experiment, self.uri)
            except TrackingError:
                self._frames[experiment] = pd.DataFrame()
        df = self._frames[experiment]
        if df.empty:
            raise NotRun(f"no finished runs of experiment {experiment}")
        return df

    def loaded(self) -> dict[str, pd.DataFrame]:
        """The experiments loaded so far that hold runs: ``{name: runs}``."""
        return {k: v for k, v in self._frames.items() if len(v)}

    def series(self, run_id: str, key: str) -> tuple[np.ndarray, np.ndarray]:
        return series(self.uri, run_id, key)

    def arrays(self, run_id: str) -> dict | None:
        """The run's ``arrays.npz`` as a dict (None if it logged none)."""
        if run_id not in self._arrays:
            dst = Path(self._tmp.name) / run_id
            dst.mkdir(exist_ok=True)
            try:
                with np.load(download_artifact(self.uri, run_id, "arrays.npz", str(dst))) as z:
                    self._arrays[run_id] = {k: z[k] for k in z.files}
            except (TrackingError, OSError, ValueError):
                self._arrays[run_id] = None
        return self._arrays[run_id]

    def per_seed(self, df: pd.DataFrame, key: str) -> np.ndarray | None:
        """``(runs, seeds)`` per-seed values of the scalar ``key`` (rows as ``df``), or None
        when a run has no such array or the runs' seed counts differ."""
        rows = []
        for rid in df["run_id"]:
            a = self.arrays(rid)
            if a is None or key not in a or np.ndim(a[key]) != 1:
                return None
            rows.append(a[key])
        if not rows or len({r.size for r in rows}) != 1:
            return None
        return np.stack(rows)

    def close(self) -> None:
        self._tmp.cleanup()


def only(df: pd.DataFrame, **where) -> pd.DataFrame:
    """Rows whose params equal every ``key=value`` (``norm_placement`` → ``norm.placement``;
    floats compared to 1e-9). Raises NotRun when none is left."""
    for k, v in where.items():
        col = k.replace("__", ".").replace("norm_placement", PLACEMENT).replace("norm_op", "norm.op")
        if col not in df:
            raise NotRun(f"runs have no param {col}")
        if isinstance(v, float | int) and not isinstance(v, bool):
            mask = np.isclose(pd.to_numeric(df[col], errors="coerce"), v, rtol=1e-9, atol=1e-12)
        else:
            mask = df[col].astype(str) == str(v)
        df = df[mask]
        if df.empty:
            raise NotRun(f"no run with {col} = {v}")
    return df.reset_index(drop=True)


def need(df: pd.DataFrame, *columns: str) -> None:
    missing = [c for c in columns if c not in df]
    if missing:
        raise NotRun(f"runs have no {', '.join(missing)} (was the probe that logs it run?)")


def seed_std(df: pd.DataFrame, metric: str) -> float:
    """1 s.d. over every seed of ``df``'s runs of ``metric`` (:func:`analysis.seeds.pooled`)."""
    return float(pooled(df, metric, []).iloc[0]["std"]) if len(df) else math.nan


def seedwise(runs: Runs, df: pd.DataFrame, metrics: list[str], statistic) -> float:
    """Standard deviation over seeds of ``statistic(frame)``, ``frame`` = ``df`` with each of
    ``metrics`` replaced by seed i's value (from the runs' ``arrays.npz``); NaN when the
    arrays are missing or there is one seed."""
    per = {m: runs.per_seed(df, m) for m in metrics}
    if any(v is None for v in per.values()):
        return math.nan
    n = min(v.shape[1] for v in per.values())
    values = []
    for i in range(n):
        frame = df.copy()
        for m, v in per.items():
            frame[m] = v[:, i]
        try:
            values.append(float(statistic(frame)))
        except (NotRun, ValueError, KeyError, IndexError):
            return math.nan
    values = [v for v in values if np.isfinite(v)]
    return float(np.std(values, ddof=1)) if len(values) > 1 else math.nan


# --------------------------------------------------------------------------- registry
CLAIMS: list[Claim] = []


def register(claim: Claim) -> Claim:
    """Add ``claim`` to :data:`CLAIMS`. Raises ValueError on a duplicate id."""
    if any(c.id == claim.id for c in CLAIMS):
        raise ValueError(f"claim {claim.id!r} is registered twice")
    CLAIMS.append(claim)
    return claim


def claims() -> list[Claim]:
    """Every registered claim, :data:`PLUGINS` imported first."""
    for name in PLUGINS:
        importlib.import_module(name)
    return list(CLAIMS)


def evaluate(runs: Runs, selected: list[Claim] | None = None) -> list[Verdict]:
    """A :class:`Verdict` per claim: NotRun → ``not run``; any other exception → ``error``
    (logged with its traceback, so a bug in one claim shows instead of hiding the others)."""
    out = []
    for c in selected if selected is not None else claims():
        try:
            m = c.measure(runs)
        except NotRun as e:
            out.append(Verdict(c, NOT_RUN, note=str(e)))
            continue
        except Exception as e:  # noqa: BLE001 — reported in the table, traceback in the log
            log.error("claim %s failed:\n%s", c.id, traceback.format_exc())
            out.append(Verdict(c, ERROR, note=f"{type(e).__name__}: {e}"))
            continue
        if not np.isfinite(m.value) and not np.isinf(m.value):
            out.append(Verdict(c, NOT_RUN, m, note=m.note or "no value could be measured"))
            continue
        out.append(Verdict(c, HOLDS if c.check.passes(m.value) else FAILS, m))
    return out


def table(verdicts: list[Verdict]) -> pd.DataFrame:
    """One row per verdict: id, experiment, claim, source, study, measured (text), value,
    spread, tolerance, verdict, note."""
    return pd.DataFrame([v.row() for v in verdicts])
