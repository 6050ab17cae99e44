"""The study's quantitative claims, each checked against whatever runs a store holds.

A :class:`Claim` is a statement, its source, its value, a stated tolerance (:func:`near`,
:func:`at_most`, …) and ``measure(runs)`` → :class:`Measured` (value ± one s.d. over seeds,
pooled by :func:`analysis.core.select.pooled` or recomputed seed by seed, :func:`seedwise`).
:func:`evaluate` gives each a verdict: holds (value ± spread inside the tolerance),
inconclusive (it straddles an edge), does not hold, the source's printed value differs (it holds
against the theory while :attr:`Claim.printed` does not), not judged at this size (runs smaller
than :attr:`Claim.size`: grey, never red) or not run (:data:`NotRun` raised; :attr:`Verdict.why`
says ``size``, ``data`` or ``runs``)."""

from __future__ import annotations

import logging
import math
import os
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from rankexp.tracking import TrackingError, download_artifact

from .runs import load_runs
from .select import SelectionError, pooled, series

log = logging.getLogger("analysis")

HOLDS, FAILS, NOT_RUN, ERROR = "holds", "does not hold", "not run", "error"
#: measured below the size its tolerance is valid for (:attr:`Claim.size`): shown grey, never red
NOT_JUDGED = "not judged at this size"
#: the seed interval value ± spread straddles the tolerance's edge
INCONCLUSIVE = "inconclusive"
#: the measurement holds against the theory; the value the source prints does not
PRINTED = "the source's printed value differs"
#: every verdict, in the report's order
VERDICTS = (HOLDS, PRINTED, INCONCLUSIVE, FAILS, NOT_JUDGED, NOT_RUN, ERROR)
#: an experiment's sizes, smallest first (``conf/size/``)
SIZES = ("smoke", "cpu", "full")
#: the store lacks what a claim needs: the selection error (:mod:`analysis.core.select`)
NotRun = SelectionError


@dataclass(frozen=True)
class Measured:
    """A measured value, its seed spread (1 s.d.; NaN if none) and a short note."""

    value: float
    spread: float = math.nan
    note: str = ""


@dataclass(frozen=True)
class Check:
    """A tolerance as text, the test deciding it and ``region`` = ``(lo, hi)`` of passing values
    (a seed interval holding it whole is *inconclusive*); ``width``: the width d₀ it is stated
    at for a quantity ∝ 1/d (:func:`per_width`), 0 for none."""

    text: str
    passes: Callable[[float], bool]
    region: tuple[float, float] | None = None
    width: float = 0.0

    def verdict(self, value: float, spread: float = math.nan, d: float = math.nan) -> str:
        """HOLDS when ``value ± spread`` lies inside the tolerance (no spread: ``value`` passes),
        FAILS outside, INCONCLUSIVE when it straddles an edge; with :attr:`width`, judged at
        width ``d`` (value and spread × d/d₀)."""
        if self.width:
            value, spread = value * d / self.width, spread * d / self.width
        if not np.isfinite(spread) or spread <= 0:
            return HOLDS if self.passes(value) else FAILS
        lo, hi = value - spread, value + spread
        ends = [self.passes(lo), self.passes(value), self.passes(hi)]
        if all(ends):
            return HOLDS
        if any(ends):
            return INCONCLUSIVE
        inside = self.region is not None and lo <= self.region[1] and hi >= self.region[0]
        return INCONCLUSIVE if inside else FAILS


def near(target: float, tol: float) -> Check:
    """``|value − target| ≤ tol``."""
    return Check(f"±{tol:g}", lambda v: abs(v - target) <= tol, (target - tol, target + tol))


def at_most(bound: float) -> Check:
    return Check(f"≤ {bound:g}", lambda v: v <= bound, (-math.inf, bound))


def at_least(bound: float) -> Check:
    return Check(f"≥ {bound:g}", lambda v: v >= bound, (bound, math.inf))


def between(lo: float, hi: float) -> Check:
    """``lo ≤ value ≤ hi`` (a range the source states, ``0.01–0.02``)."""
    return Check(f"{lo:g} … {hi:g}", lambda v: lo <= v <= hi, (lo, hi))


def below(bound: float) -> Check:
    return Check(f"< {bound:g}", lambda v: v < bound, (-math.inf, bound))


def above(bound: float) -> Check:
    return Check(f"> {bound:g}", lambda v: v > bound, (bound, math.inf))


def per_width(check: Check, d0: int) -> Check:
    """``check`` stated at width ``d0`` for a quantity ∝ 1/d (a finite-width gap), judged at the
    runs' own width d: :func:`at_most(b) <at_most>` reads ≤ b·d0/d."""
    return replace(check, text=f"{check.text} × {d0}/d", width=d0)


def sentence(text: str) -> str:
    """``text`` as a sentence: a capital first letter and a final full stop."""
    text = " ".join(str(text).split())
    text = text[:1].upper() + text[1:]
    return text if not text or text[-1] in ".!?" else text + "."


@dataclass(frozen=True)
class Claim:
    """One quantitative claim.

    Attributes:
        id: unique, ``<figure>.<name>``.
        statement: the claim in the source's words.
        source: where it is made (``the study §3 fig5``, ``He et al. 2016 Table 6``).
        study: the source's value as text.
        check: the stated tolerance (:func:`near`, :func:`at_most`, …).
        measure: loaded runs → :class:`Measured`; raises :data:`NotRun`.
        size: the smallest size whose grids hold what ``measure`` reads (``smoke``/``cpu``/``full``).
        printed: the source's printed value where it differs from the theory ``check`` targets
            (NaN: none); holding while ``printed`` fails ``check`` is :data:`PRINTED`.
        needs: what no grid of this checkout makes (``"pretrained GPT-2 checkpoints"``), or "".
        experiment, requires: the experiment it is judged on and what this machine lacks of its
            needs (filled in by :meth:`analysis.core.registry.Experiment.bound_claims`)."""

    id: str
    statement: str
    source: str
    study: str
    check: Check
    measure: Callable[[Runs], Measured] = field(repr=False)
    size: str = "smoke"
    printed: float = math.nan
    needs: str = ""
    experiment: str = ""
    requires: str = ""

    def __post_init__(self):
        if self.size not in SIZES:
            raise ValueError(f"claim {self.id}: size {self.size!r} is not one of {SIZES}")


@dataclass
class Verdict:
    """A claim's verdict; ``why`` says why it is *not run* (``size``, ``data`` or ``runs``)."""

    claim: Claim
    verdict: str
    measured: Measured | None = None
    note: str = ""
    why: str = ""
    #: the size of the runs it was measured on (:meth:`Runs.size`), "" without runs
    size: str = ""
    #: the widths d and depths L of those runs, as text (``16``, ``{4, 8}``), "" without runs
    d: str = ""
    L: str = ""

    def row(self) -> dict:
        m = self.measured
        return {"id": self.claim.id, "experiment": self.claim.experiment,
                "claim": self.claim.statement, "source": self.claim.source,
                "study": self.claim.study, "measured": format_measured(m) if m else "—",
                "value": m.value if m else math.nan, "spread": m.spread if m else math.nan,
                "tolerance": self.claim.check.text, "verdict": self.verdict,
                "size": self.size or "—", "valid_from": self.claim.size, "d": self.d or "—",
                "L": self.L or "—", "why": self.why, "note": self.note or (m.note if m else "")}


def format_measured(m: Measured) -> str:
    def f(v: float) -> str:
        return ("−∞" if v < 0 else "∞") if math.isinf(v) else f"{v:.3g}"

    if math.isnan(m.value):
        return "—"
    return f(m.value) if math.isnan(m.spread) else f"{f(m.value)} ± {m.spread:.2g}"


# --------------------------------------------------------------------------- loaded runs
class Runs:
    """Finished runs of a store, loaded once per experiment (:func:`analysis.core.runs.load_runs`),
    their series and per-seed arrays."""

    def __init__(self, uri: str | None):
        self.uri = uri
        self._frames: dict[str, pd.DataFrame] = {}
        self._arrays: dict[str, dict | None] = {}
        self._tmp = tempfile.TemporaryDirectory(prefix="rankexp-claims-")
        self.cache: dict = {}  # what claims derive once per store (e.g. degradation's tables)
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

    def size(self, experiment: str) -> str | None:
        """The largest size (:data:`SIZES`) among the experiment's runs; None without runs."""
        try:
            df = self(experiment)
        except NotRun:
            return None
        sizes = set(df["size"].dropna().astype(str)) if "size" in df else {"full"}
        known = [s for s in SIZES if s in sizes]
        return known[-1] if known else "full"

    def values(self, experiment: str, key: str) -> str:
        """The values of param ``key`` among the experiment's runs as text (``16``,
        ``{4, 8}``); "" without runs or without the param."""
        try:
            df = self(experiment)
        except NotRun:
            return ""
        vals = sorted(pd.to_numeric(df[key], errors="coerce").dropna().unique()) if key in df \
            else []
        text = [f"{v:g}" for v in vals]
        return "" if not text else text[0] if len(text) == 1 else "{" + ", ".join(text) + "}"

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


def seed_std(df: pd.DataFrame, metric: str) -> float:
    """1 s.d. over every seed of ``df``'s runs of ``metric`` (:func:`analysis.core.select.pooled`)."""
    return float(pooled(df, metric, []).iloc[0]["std"]) if len(df) else math.nan


def seedwise(runs: Runs, df: pd.DataFrame, metrics: list[str], statistic) -> float:
    """S.d. over seeds of ``statistic(frame)``, ``frame`` = ``df`` with ``metrics`` set to seed i's
    values (the runs' ``arrays.npz``); NaN without arrays or with one seed."""
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


# --------------------------------------------------------------------------- verdicts
def why_not(claim: Claim, runs: Runs) -> tuple[str, str]:
    """``(why, sentence)`` a claim is not run: ``data``, ``size`` or ``runs`` (empty sentence)."""
    if claim.needs or claim.requires:
        return "data", f"It needs {claim.needs or claim.requires}, which this machine lacks."
    size = runs.size(claim.experiment)
    if size is not None and SIZES.index(size) < SIZES.index(claim.size):
        return "size", f"It needs size={claim.size} runs; the store has size={size}."
    return "runs", ""


def _judged(c: Claim, runs: Runs, m: Measured) -> Verdict:
    """The verdict of a measured claim: :data:`NOT_JUDGED` below :attr:`Claim.size`, else
    :meth:`Check.verdict` of its seed interval."""
    size = runs.size(c.experiment) or ""
    where = {"size": size, "d": runs.values(c.experiment, "width"), "L": runs.values(c.experiment, "depth")}
    if size and SIZES.index(size) < SIZES.index(c.size):
        note = (f"Measured at size={size}; its tolerance is valid from size={c.size} on. "
                + sentence(m.note)).strip()
        return Verdict(c, NOT_JUDGED, m, note=note, why="size", **where)
    d = pd.to_numeric(where["d"], errors="coerce")
    if c.check.width and not d > 0:
        note = f"its tolerance scales as 1/d and the runs have several widths, d = {where['d']}"
        return Verdict(c, NOT_JUDGED, m, note=sentence(note), why="size", **where)
    verdict = c.check.verdict(m.value, m.spread, d)
    note = m.note
    if c.check.width:
        note = sentence(f"tolerance at d = {d:g}: {c.check.text.replace('/d', f'/{d:g}')}"
                        + (f"; {m.note}" if m.note else ""))
    if verdict == HOLDS and np.isfinite(c.printed) and not c.check.passes(c.printed):
        verdict, note = PRINTED, sentence(
            f"the source prints {c.printed:g}; rankexp's {format_measured(m)} agrees with "
            f"{c.study}" + (f"; {m.note}" if m.note else ""))
    if verdict == INCONCLUSIVE:
        note = sentence(f"the seed interval {format_measured(m)} straddles the tolerance {c.check.text}"
                        + (f"; {m.note}" if m.note else ""))
    return Verdict(c, verdict, m, note=note, **where)


def evaluate(runs: Runs, selected: list[Claim]) -> list[Verdict]:
    """A :class:`Verdict` per claim: not run (with :func:`why_not`), not judged below the claim's
    size, the seed interval's verdict, or ``error`` (traceback logged) for any other exception."""
    out = []
    for c in selected:
        m = None
        try:
            m = c.measure(runs)
            reason = (m.note or "no value could be measured") if np.isnan(m.value) else ""
        except NotRun as e:
            reason = str(e)
        except Exception as e:  # noqa: BLE001 — reported in the table, traceback in the log
            log.error("claim %s failed:\n%s", c.id, traceback.format_exc())
            out.append(Verdict(c, ERROR, note=f"{type(e).__name__}: {e}"))
            continue
        if m is not None and not reason:
            out.append(_judged(c, runs, m))
            continue
        why, what = why_not(c, runs)
        note = " ".join(filter(None, [what, sentence(reason)]))
        out.append(Verdict(c, NOT_RUN, m, note=note, why=why))
    return out


def table(verdicts: list[Verdict]) -> pd.DataFrame:
    """One row per verdict (:meth:`Verdict.row`)."""
    return pd.DataFrame([v.row() for v in verdicts])
