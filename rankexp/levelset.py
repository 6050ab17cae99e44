"""Level sets and boundaries of a monotone metric along one axis, by bracketing (no store, no
Hydra: numpy, pandas for the tables).

The math of ``hydra/sweeper=contour`` (:mod:`hydra_plugins.rankexp_plugins.contour`) and of the
iso-rank exponent fits of Table 4 (:mod:`analysis.study.isorank`): given the values ``f(x)``
measured so far at one trace point (one depth, placement, m/d …) and a level ``r*``, find the
bracket ``[x_a, x_b]`` of consecutive measured points where ``f − r*`` changes sign, say
whether the crossing is known to the tolerance, and if not which ``x`` to measure next.

* Coordinates: ``u = log x`` on a log axis (α, β, a learning rate), ``u = x`` on a linear one;
  the tolerance is a bracket width in ``u`` (natural-log units on a log axis).
* A **level** target (``erank_io = r*``) uses the values: the next points are a safeguarded
  secant step — regula falsi inside the bracket, measured at ``û ± 0.45·tol`` so that one round
  ends the search when the secant is right — falling back to bisection whenever the bracket
  did not at least halve in the last round (so it halves at least every second round, Brent's
  safeguard; Brent 1973, *Algorithms for Minimization without Derivatives*, ch. 4).  The
  converged crossing is the linear interpolation of ``f`` in ``u`` across the final bracket.
* A **boolean** target (a run diverged / did not reach 0.4 accuracy: Table 5's max stable LR)
  is ``f ≥ r*`` or not, a missing value (NaN: diverged) counting as not; the next point is
  the bracket's midpoint (bisection) and the boundary the midpoint of the final bracket.
* A cell whose measured values cross the level more than once is **non-monotone**, one whose
  values never cross it in the bracket **unbracketed**; both are reported, never guessed.

The exponent ``s`` of ``βα^M ∝ L^s`` (science.md §4 tab4, §6 ``tab4_contour``) is the
least-squares slope of ``log(βα*^M)`` on ``log L`` with its Student-t interval
(:func:`fit_exponent`).  :class:`Contour` is a contour sweep's bookkeeping (its trace points,
values, cells and tables); the sweeper launches its rounds and reads them back, a benchmark or
test drives it in-process (:meth:`Contour.run_in_process`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: significant digits of a proposed axis value (its Hydra override, hence its config hash)
DIGITS = 10
#: the secant's two points sit at û ± SECANT_HALF·tol (a final bracket of 0.9·tol)
SECANT_HALF = 0.45
STATUSES = ("converged", "open", "unbracketed", "non_monotone")


@dataclass(frozen=True)
class Axis:
    """The axis solved along: config key, bracket ``[lo, hi]`` and scale (``log``/``linear``).

    Raises:
        ValueError: ``lo ≥ hi``, a non-positive bound on a log axis, or an unknown scale.
    """

    key: str
    lo: float
    hi: float
    scale: str = "log"

    def __post_init__(self) -> None:
        if self.scale not in ("log", "linear"):
            raise ValueError(f"contour axis {self.key}: scale must be log or linear, got {self.scale!r}")
        if not self.lo < self.hi:
            raise ValueError(f"contour axis {self.key}: bracket [{self.lo}, {self.hi}] needs lo < hi")
        if self.scale == "log" and self.lo <= 0:
            raise ValueError(f"contour axis {self.key}: a log axis needs lo > 0, got {self.lo}")

    def u(self, x: float) -> float:
        """The solving coordinate of ``x``: ``log x`` (log axis) or ``x``."""
        return math.log(x) if self.scale == "log" else float(x)

    def x(self, u: float) -> float:
        """The axis value at coordinate ``u``, rounded to :data:`DIGITS` significant digits
        (so that a rerun proposes the very same override, hence config hash)."""
        return float(f"{math.exp(u) if self.scale == 'log' else u:.{DIGITS}g}")

    def start(self, n: int) -> list[float]:
        """``n ≥ 2`` points evenly spaced in ``u`` from ``lo`` to ``hi`` (the first round)."""
        if n < 2:
            raise ValueError(f"contour: at least 2 starting points (the bracket's ends), got {n}")
        return [self.x(u) for u in np.linspace(self.u(self.lo), self.u(self.hi), n)]


@dataclass
class Cell:
    """One (trace point, level): where the metric crosses the level.

    ``status`` ∈ :data:`STATUSES`; ``lo``/``hi`` the bracket (axis values, NaN if none),
    ``f_lo``/``f_hi`` the metric there, ``crossing`` the estimate (NaN unless converged or
    open with a bracket), ``width`` the bracket width in ``u``, ``note`` why a cell is not
    converged."""

    level: float
    status: str
    lo: float = math.nan
    hi: float = math.nan
    f_lo: float = math.nan
    f_hi: float = math.nan
    crossing: float = math.nan
    width: float = math.nan
    points: int = 0
    note: str = ""
    proposals: list[float] = field(default_factory=list)


def _signs(f: np.ndarray, level: float, boolean: bool) -> np.ndarray:
    """``+1`` above the level, ``−1`` below, ``0`` on it (level mode); boolean: ``+1`` when
    ``f ≥ level`` (a NaN — diverged — is ``−1``)."""
    if boolean:
        return np.where(np.nan_to_num(f, nan=-np.inf) >= level, 1.0, -1.0)
    return np.sign(f - level)


def solve(points: dict[float, float], level: float, axis: Axis, tol: float, *,
          boolean: bool = False, method: str = "secant", previous_width: float = math.inf) -> Cell:
    """The state of one cell from the points measured so far, and the points to measure next.

    Args:
        points: ``{x: f(x)}`` measured at one trace point (NaN: the run has no value).
        level: the level ``r*`` (boolean: the threshold of ``f ≥ r*``).
        axis: the solved axis; ``tol``: the bracket width (in ``u``) that ends the search.
        method: ``secant`` (safeguarded, see the module docstring) or ``bisect``; a boolean
            target always bisects.
        previous_width: this cell's bracket width one round earlier (the safeguard).

    Returns:
        The :class:`Cell`; ``proposals`` (axis values) is empty unless ``status == "open"``.
    """
    xs = np.array(sorted(points), dtype=float)
    f = np.array([points[x] for x in xs], dtype=float)
    if not boolean:  # a run without the metric says nothing about the level
        keep = np.isfinite(f)
        xs, f = xs[keep], f[keep]
    cell = Cell(level, "unbracketed", points=len(xs))
    if len(xs) < 2:
        cell.note = f"{len(xs)} point(s) with a value"
        return cell
    u = np.array([axis.u(x) for x in xs])
    s = _signs(f, level, boolean)
    on = np.flatnonzero(s == 0)
    nz = np.flatnonzero(s != 0)
    changes = [i for i, j in zip(nz[:-1], nz[1:], strict=True) if s[i] != s[j]]
    if len(changes) + len(on) == 0:
        cell.note = (f"{'f ≥ level' if s[0] > 0 else 'f < level'} over the bracket"
                     if boolean else f"f in [{np.nanmin(f):.4g}, {np.nanmax(f):.4g}]")
        return cell
    nxt = {int(a): int(b) for a, b in zip(nz[:-1], nz[1:], strict=True)}
    inside = [k for k in on if changes and changes[0] < k < nxt[changes[0]]]
    at_end = [k for k in on if not changes and k in (0, len(xs) - 1)]
    if len(changes) > 1 or len(on) > 1 or len(on) != len(inside) + len(at_end):
        cell.status = "non_monotone"
        cut = [f"{xs[i]:.4g}…{xs[nxt[i]]:.4g}" for i in changes] + [f"{xs[k]:.4g}" for k in on]
        cell.note = f"meets the level {len(changes) + len(on)} times ({', '.join(cut)})"
        return cell
    if on.size:  # measured exactly on the level
        i = int(on[0])
        cell.status, cell.lo = "converged", xs[i]
        cell.hi, cell.crossing, cell.f_lo, cell.f_hi, cell.width = xs[i], xs[i], f[i], f[i], 0.0
        return cell
    i = changes[0]
    j = nxt[i]
    a, b = u[i], u[j]
    cell.lo, cell.hi, cell.f_lo, cell.f_hi, cell.width = xs[i], xs[j], f[i], f[j], b - a
    if boolean:
        uhat = 0.5 * (a + b)
    elif cell.width <= tol * (1 + 1e-9):  # the final estimate: linear across the bracket
        uhat = a + (f[i] - level) / (f[i] - f[j]) * (b - a)
    else:
        uhat = _interpolate(u, f, i, j, level)
    cell.crossing = axis.x(uhat)
    if cell.width <= tol * (1 + 1e-9):
        cell.status = "converged"
        return cell
    cell.status = "open"
    cell.proposals = _next(a, b, uhat, tol, boolean or method == "bisect"
                           or cell.width > 0.5 * previous_width, axis)
    return cell


def _interpolate(u: np.ndarray, f: np.ndarray, i: int, j: int, level: float) -> float:
    """Where the monotone cubic (PCHIP, Fritsch & Carlson 1980) through the bracket's ends
    ``i < j`` and their neighbours on the same monotone stretch crosses ``level`` (the
    secant step, with curvature: regula falsi stalls on a curve like ``e^u``)."""
    from scipy.interpolate import PchipInterpolator
    from scipy.optimize import brentq

    up = f[j] > f[i]
    lo, hi = i, j
    while lo > 0 and np.isfinite(f[lo - 1]) and (f[lo] > f[lo - 1]) == up and f[lo] != f[lo - 1]:
        lo -= 1
    while hi < len(f) - 1 and np.isfinite(f[hi + 1]) and (f[hi + 1] > f[hi]) == up \
            and f[hi + 1] != f[hi]:
        hi += 1
    lo, hi = max(lo, i - 1), min(hi, j + 1)  # one neighbour each side: a local estimate
    if hi - lo < 2:
        return u[i] + (f[i] - level) / (f[i] - f[j]) * (u[j] - u[i])
    curve = PchipInterpolator(u[lo:hi + 1], f[lo:hi + 1])
    return float(brentq(lambda v: float(curve(v)) - level, u[i], u[j]))


def _next(a: float, b: float, uhat: float, tol: float, bisect: bool, axis: Axis) -> list[float]:
    """The next axis values inside ``(a, b)``: the midpoint, or ``û ± 0.45·tol`` (clipped to
    the bracket's inside; one point when the other would fall outside)."""
    if bisect:
        return [axis.x(0.5 * (a + b))]
    h = SECANT_HALF * tol
    return [axis.x(v) for v in (uhat - h, uhat + h) if a < v < b] or [axis.x(0.5 * (a + b))]


@dataclass(frozen=True)
class Fit:
    """``log y = s log L + c`` by least squares: slope ``s``, its 95 % Student-t interval
    ``[lo, hi]`` (NaN with fewer than three points), ``n`` points, and ``resolution``: the
    largest change of ``s`` the points' own uncertainties (``±err`` in log y) can make."""

    s: float
    lo: float
    hi: float
    n: int
    resolution: float


def fit_exponent(L, y, err=None, confidence: float = 0.95) -> Fit:
    """The exponent ``s`` of ``y ∝ L^s`` (Table 4: ``y = βα*^M`` at the crossing, ``L`` depth).

    Args:
        L, y: positive arrays of equal length ``n``.
        err: half-widths of ``log y`` (the crossings' resolution), or None.
        confidence: of the interval ``s ± t_{n−2} · SE(s)``.

    Returns:
        :class:`Fit`; all NaN with fewer than two points.
    """
    from scipy import stats

    lx, ly = np.log(np.asarray(L, dtype=float)), np.log(np.asarray(y, dtype=float))
    n = int(lx.size)
    if n < 2 or np.ptp(lx) == 0:
        return Fit(math.nan, math.nan, math.nan, n, math.nan)
    dx = lx - lx.mean()
    sxx = float(dx @ dx)
    s = float(dx @ (ly - ly.mean()) / sxx)
    resolution = float(np.abs(dx / sxx) @ np.asarray(err, dtype=float)) if err is not None else math.nan
    if n < 3:
        return Fit(s, math.nan, math.nan, n, resolution)
    resid = ly - ly.mean() - s * dx
    se = math.sqrt(float(resid @ resid) / (n - 2) / sxx)
    q = float(stats.t.ppf(0.5 + confidence / 2, n - 2)) * se
    return Fit(s, s - q, s + q, n, resolution)


# --------------------------------------------------------------------------- a contour sweep
@dataclass(frozen=True)
class Spec:
    """``hydra.sweeper.contour``, checked (see the module docstring)."""

    metric: str
    levels: tuple
    axis: Any  # rankexp.levelset.Axis
    start: int
    tol: float
    method: str
    boolean: bool
    max_rounds: int
    fit_over: str | None


def parse_spec(node: Any) -> Spec:
    """:class:`Spec` of ``hydra.sweeper.contour``.

    Raises:
        ValueError: a missing or malformed field (one line naming it).
    """
    from omegaconf import OmegaConf

    c = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node or {})
    known = {"metric", "levels", "axis", "bracket", "scale", "start", "tol", "method", "boolean",
             "max_rounds", "fit_over"}
    if unknown := sorted(set(c) - known):
        raise ValueError(f"hydra.sweeper.contour: unknown key(s) {unknown}; known: {sorted(known)}")
    if not c.get("metric") or not c.get("axis"):
        raise ValueError("hydra.sweeper.contour: give metric (e.g. erank_io) and axis (e.g. alpha)")
    levels = c.get("levels")
    levels = [levels] if isinstance(levels, int | float) else levels
    if not levels or not all(isinstance(v, int | float) for v in levels):
        raise ValueError(f"hydra.sweeper.contour.levels: a list of numbers, got {c.get('levels')!r}")
    bracket = c.get("bracket")
    if not isinstance(bracket, list) or len(bracket) != 2:
        raise ValueError(f"hydra.sweeper.contour.bracket: [lo, hi], got {bracket!r}")
    method = c.get("method", "secant")
    if method not in ("secant", "bisect"):
        raise ValueError(f"hydra.sweeper.contour.method: secant or bisect, got {method!r}")
    tol, start, rounds = float(c.get("tol", 0.02)), int(c.get("start", 5)), int(c.get("max_rounds", 12))
    if not (tol > 0 and start >= 2 and rounds >= 1):
        raise ValueError("hydra.sweeper.contour: tol > 0, start ≥ 2 and max_rounds ≥ 1, got "
                         f"tol={tol}, start={start}, max_rounds={rounds}")
    axis = Axis(str(c["axis"]), float(bracket[0]), float(bracket[1]), str(c.get("scale", "log")))
    return Spec(str(c["metric"]), tuple(float(v) for v in levels), axis, start, tol, method,
                bool(c.get("boolean", False)), rounds, c.get("fit_over"))


class Contour:
    """The state of a contour sweep: trace points, measured values, cells (pure bookkeeping;
    the sweeper launches and reads back)."""

    def __init__(self, spec: Spec, trace: list[list[str]], swept: list[str]):
        self.spec, self.trace = spec, trace
        self.labels = [{k: v for k, v in (o.lstrip("+~").split("=", 1) for o in job) if k in swept}
                       for job in trace]
        self.values: list[dict[float, float]] = [{} for _ in trace]
        self.ratios: list[dict[float, float]] = [{} for _ in trace]
        self.width: dict[tuple[int, float], float] = {}
        self.cells: dict[tuple[int, float], Any] = {}
        self.rounds = 0

    def first_round(self) -> list[tuple[int, float]]:
        """Every trace point at ``start`` values spanning the bracket."""
        xs = self.spec.axis.start(self.spec.start)
        return [(t, x) for t in range(len(self.trace)) for x in xs]

    def overrides(self, jobs: list[tuple[int, float]]) -> list[list[str]]:
        """Each job's Hydra overrides: its trace point's, then the solved axis."""
        return [[*self.trace[t], f"{self.spec.axis.key}={x!r}"] for t, x in jobs]

    def record(self, jobs: list[tuple[int, float]], read: list[tuple[float, float]]) -> None:
        """Store the (metric, nominal ratio) read back for each job of a round."""
        for (t, x), (v, r) in zip(jobs, read, strict=True):
            self.values[t][x], self.ratios[t][x] = v, r
        self.rounds += 1

    def next_round(self) -> list[tuple[int, float]]:
        """Solve every cell on the values so far; the new (trace point, x) jobs they ask for."""
        s, new = self.spec, []
        for t in range(len(self.trace)):
            wanted: list[float] = []
            for level in s.levels:
                cell = solve(self.values[t], level, s.axis, s.tol, boolean=s.boolean, method=s.method,
                             previous_width=self.width.get((t, level), math.inf))
                self.cells[(t, level)] = cell
                if math.isfinite(cell.width):
                    self.width[(t, level)] = cell.width
                wanted += [x for x in cell.proposals if x not in self.values[t] and x not in wanted]
            new += [(t, x) for x in sorted(wanted)]
        return new

    def run_in_process(self, evaluate) -> int:
        """The sweeper's rounds with ``evaluate(t, x) -> (metric, nominal ratio)`` in place of
        jobs (benchmarks, tests); returns the number of evaluations."""
        jobs, n = self.first_round(), 0
        while jobs:
            self.record(jobs, [evaluate(t, x) for t, x in jobs])
            n += len(jobs)
            jobs = self.next_round()
            if self.rounds >= self.spec.max_rounds:
                break
        return n

    def _ratio(self, t: int, cell) -> tuple[float, float]:
        """βα^M at the crossing (log-linear in u between the bracket's runs: exact when the
        axis is α or β on a log axis) and its half-width in log."""
        r = self.ratios[t]
        ra, rb = r.get(cell.lo, math.nan), r.get(cell.hi, math.nan)
        if not (ra > 0 and rb > 0):
            return math.nan, math.nan
        ax = self.spec.axis
        ua, ub = ax.u(cell.lo), ax.u(cell.hi)
        w = 0.0 if ub == ua else (ax.u(cell.crossing) - ua) / (ub - ua)
        return math.exp((1 - w) * math.log(ra) + w * math.log(rb)), abs(math.log(rb / ra)) / 2

    def tables(self):
        """``(contour, exponents)`` pandas tables (see the module docstring)."""
        import pandas as pd

        rows = []
        for (t, level), c in self.cells.items():
            ratio, err = self._ratio(t, c) if c.status == "converged" else (math.nan, math.nan)
            rows.append({**self.labels[t], "level": level, "status": c.status, "crossing": c.crossing,
                         "lo": c.lo, "hi": c.hi, "f_lo": c.f_lo, "f_hi": c.f_hi, "width": c.width,
                         "nominal_ratio": ratio, "log_ratio_err": err, "points": c.points,
                         "note": c.note})
        contour = pd.DataFrame(rows)
        fit_over = self.spec.fit_over
        if contour.empty or not fit_over or fit_over not in contour:
            return contour, pd.DataFrame()
        keys = [k for k in self.labels[0] if k != fit_over]
        fits = []
        for values, g in contour.groupby([*keys, "level"], sort=False):
            values = values if isinstance(values, tuple) else (values,)
            ok = g[g["status"] == "converged"]
            y = ok["nominal_ratio"].where(ok["nominal_ratio"].notna(), ok["crossing"])
            err = ok["log_ratio_err"].fillna(0.0)
            f = fit_exponent(ok[fit_over].astype(float), y, err)
            fits.append({**dict(zip([*keys, "level"], values, strict=True)), "s": f.s, "s_lo": f.lo,
                         "s_hi": f.hi, "resolution": f.resolution, "points": f.n,
                         "cells": len(g), f"{fit_over}_min": ok[fit_over].astype(float).min(),
                         f"{fit_over}_max": ok[fit_over].astype(float).max()})
        return contour, pd.DataFrame(fits)
