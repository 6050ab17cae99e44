"""``hydra/sweeper=contour``: a sweep that finds a level set (or a boundary) itself, and its math.

It traces the contour in rounds (Table 4's iso-rank exponents, Table 5's max stable LR): each
round is a batch of ordinary jobs through the configured launcher, checked as a whole first
(:class:`~.sweeper.RankexpSweeper`); the metric of each job is read back from the store by
config hash and each (trace point, level) cell is narrowed until its crossing is bracketed to
``tol``; non-monotone and unbracketed cells are reported, never guessed.  Proposals are a
deterministic function of the values read, so a rerun resumes by config hash.

``hydra.sweeper.params`` / ``grids`` give the trace points; ``hydra.sweeper.contour`` the
``metric``, ``levels``, ``axis`` with ``bracket`` and ``scale`` (``u = log x`` or ``x``; ``tol``
is a width in ``u``), ``start``, ``method`` (``secant``: regula falsi with a PCHIP correction at
``û ± 0.45·tol``, bisecting when a round did not halve the bracket — Brent 1973 ch. 4;
``bisect``), ``boolean`` (target ``metric ≥ level``, NaN counting as not: Table 5's boundary),
``max_rounds``, ``fit_over`` (the ``L`` of ``βα^M ∝ L^s``), ``warm``, ``warm_across`` and
``s_tol`` (conf/hydra/sweeper/contour.yaml).  The parent run holds ``contour/contour.csv``,
``contour/exponents.csv`` (:func:`fit_exponent`) and the metrics ``contour_rounds``,
``contour_cells``, ``contour_converged``.
"""

import difflib
import logging
import math
import sys
import tempfile
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from rankexp import cli, jobdir, naming, tracking
from rankexp.models.families import family_of
from rankexp.probes import PROBES

from .sweeper import RankexpSweeper

log = logging.getLogger(__name__)

#: significant digits of a proposed axis value (its Hydra override, hence its config hash)
DIGITS = 10
#: the secant's two points sit at û ± SECANT_HALF·tol (a final bracket of 0.9·tol)
SECANT_HALF = 0.45
#: the widest bracket (in u) whose interpolants' disagreement counts as its error
LOCAL = 0.5
#: a budgeted secant step under this fraction of the bracket takes no bisection point
SETTLING = 0.25


@dataclass(frozen=True)
class Axis:
    """The axis solved along: config key, bracket ``[lo, hi]``, scale; ValueError if invalid."""

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
        return math.log(x) if self.scale == "log" else float(x)

    def x(self, u: float) -> float:
        """The axis value at ``u``, to :data:`DIGITS` digits (a rerun's same config hash)."""
        return float(f"{math.exp(u) if self.scale == 'log' else u:.{DIGITS}g}")

    def start(self, n: int) -> list[float]:
        """``n ≥ 2`` points evenly spaced in ``u`` from ``lo`` to ``hi`` (the first round)."""
        return [self.x(u) for u in np.linspace(self.u(self.lo), self.u(self.hi), n)]


@dataclass
class Cell:
    """One (trace point, level): ``status`` (converged, open, unbracketed, non_monotone), the
    bracket ``lo``/``hi`` (axis values) with ``f_lo``/``f_hi``, the ``crossing`` estimate,
    ``width`` and ``error`` in ``u``; ``note``: why it is not converged."""

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
    error: float = math.nan
    proposals: list[float] = field(default_factory=list)


def _signs(f: np.ndarray, level: float, boolean: bool) -> np.ndarray:
    """``+1`` above the level, ``−1`` below, ``0`` on it; boolean: ``±1`` (NaN ``−1``)."""
    if boolean:
        return np.where(np.nan_to_num(f, nan=-np.inf) >= level, 1.0, -1.0)
    return np.sign(f - level)


def solve(points: dict[float, float], level: float, axis: Axis, tol: float, *,
          boolean: bool = False, method: str = "secant", previous_width: float = math.inf,
          prior: float | None = None, allowed: float | None = None, expand: bool = False) -> Cell:
    """One cell's state from the points ``{x: f(x)}`` measured so far (NaN: no value)
    and the points to measure next (``proposals``, empty unless ``status == "open"``).

    ``tol`` is the bracket width in ``u`` that ends the search; a boolean target always
    bisects; ``previous_width`` (one round earlier) drives the bisection safeguard.  With
    ``allowed`` (the error in ``u`` the fitted exponent can take, :meth:`Contour.allowed`) a
    bracketed level cell converges once the estimate moved by ≤ ``allowed`` from ``prior``,
    its half-width is ≤ ``allowed``, or (bracket ≤ :data:`LOCAL`) its PCHIP and linear
    estimates agree to it; ``tol`` then ends nothing.  ``expand``: a cell that never crosses
    but whose bracket end on the crossing's side is unmeasured proposes a point outwards.
    """
    xs = np.array(sorted(points), dtype=float)
    f = np.array([points[x] for x in xs], dtype=float)
    if not boolean:  # a run without the metric says nothing about the level
        keep = np.isfinite(f)
        xs, f = xs[keep], f[keep]
    cell = Cell(level, "unbracketed", points=len(xs))
    if len(xs) < 2:
        cell.note = f"{len(xs)} point(s) with a value"
        if boolean and expand and len(xs) == 1:
            _one_end(cell, axis.u(xs[0]), float(_signs(f, level, True)[0]), axis)
        return cell
    u = np.array([axis.u(x) for x in xs])
    s = _signs(f, level, boolean)
    on = np.flatnonzero(s == 0)
    nz = np.flatnonzero(s != 0)
    changes = [i for i, j in zip(nz[:-1], nz[1:], strict=True) if s[i] != s[j]]
    if boolean and len(changes) == 2 and s[changes[0]] < 0:  # fails, holds, fails going up
        cell.note = f"f < level up to {xs[changes[0]]:.4g} too (a floor below the boundary)"
        changes = changes[1:]
    if len(changes) + len(on) == 0:
        cell.note = (f"{'f ≥ level' if s[0] > 0 else 'f < level'} over the bracket"
                     if boolean else f"f in [{np.nanmin(f):.4g}, {np.nanmax(f):.4g}]")
        if expand:
            _expand(cell, u, f, s, axis, tol, boolean)
        return cell
    nxt = {int(a): int(b) for a, b in zip(nz[:-1], nz[1:], strict=True)}
    inside = [k for k in on if changes and changes[0] < k < nxt[changes[0]]]
    at_end = [k for k in on if not changes and k in (0, len(xs) - 1)]
    if len(changes) > 1 or len(on) > 1 or len(on) != len(inside) + len(at_end):
        cell.status = "non_monotone"
        cut = [f"{xs[i]:.4g}…{xs[nxt[i]]:.4g}" for i in changes] + [f"{xs[k]:.4g}" for k in on]
        cell.note = f"meets the level {len(changes) + len(on)} times ({', '.join(cut)})"
        return cell
    if on.size:  # measured exactly on the level: converged there, width 0
        k = int(on[0])
        cell.lo = cell.hi = cell.crossing = xs[k]
        cell.status, cell.f_lo, cell.f_hi, cell.width, cell.error = "converged", f[k], f[k], 0.0, 0.0
        return cell
    i = changes[0]
    j = nxt[i]
    if boolean and s[i] < 0 < s[j]:  # fails below, holds above: a floor, not the boundary
        return _floor(cell, xs, i, j, axis, expand)
    a, b = u[i], u[j]
    cell.lo, cell.hi, cell.f_lo, cell.f_hi, cell.width = xs[i], xs[j], f[i], f[j], b - a
    budget = allowed is not None and not boolean and method == "secant"  # the exponent's rule
    narrow = cell.width <= tol * (1 + 1e-9) and not budget
    linear = a + (f[i] - level) / (f[i] - f[j]) * (b - a)
    uhat = 0.5 * (a + b) if boolean else linear if narrow else _interpolate(u, f, i, j, level)
    cell.crossing = axis.x(uhat)
    cell.error = 0.5 * cell.width
    if narrow:
        cell.status = "converged"
        return cell
    cell.status = "open"
    bisect = boolean or method == "bisect" or cell.width > 0.5 * previous_width
    mid = 0.5 * (a + b)
    if budget:
        step = abs(uhat - prior) if prior is not None else math.inf
        gap = abs(uhat - linear) if cell.width <= LOCAL else math.inf
        if min(step, cell.error, gap) <= allowed:
            cell.status, cell.error = "converged", min(step, cell.error, gap)
            return cell
        bisect = bisect and step > SETTLING * cell.width  # a secant settling inside: no midpoint
        vs = [uhat, mid] if bisect and prior is not None else [uhat]
    else:  # the midpoint, or the secant's two points û ± 0.45·tol
        vs = [mid] if bisect else [uhat - SECANT_HALF * tol, uhat + SECANT_HALF * tol]
    cell.proposals = [axis.x(v) for v in vs if a < v < b] or [axis.x(mid)]
    return cell


def _floor(cell: Cell, xs: np.ndarray, i: int, j: int, axis: Axis, expand: bool) -> Cell:
    """A boolean cell failing up to ``xs[i]``, holding from ``xs[j]`` on: unbracketed (warm:
    open at the bracket's top until it is measured)."""
    cell.note = (f"f < level up to {xs[i]:.4g}, f ≥ level from {xs[j]:.4g} to {xs[-1]:.4g}: "
                 "holds at the top; the crossing is the wrong way (a floor), not the boundary")
    if expand and axis.u(axis.hi) - axis.u(xs[-1]) > 1e-9 * max(1.0, abs(axis.u(xs[-1]))):
        cell.status, cell.proposals = "open", [axis.hi]
    return cell


def _one_end(cell: Cell, u0: float, sign: float, axis: Axis) -> None:
    """A boolean cell measured at one bracket end only: holding at the top or failing at the
    bottom, unbracketed (monotone); otherwise open at the midpoint and the other end."""
    top, bottom = (abs(u0 - axis.u(end)) <= 1e-9 * max(1.0, abs(u0)) for end in (axis.hi, axis.lo))
    if (top and sign > 0) or (bottom and sign < 0):
        cell.note = "f ≥ level at the bracket's top" if top else "f < level at the bracket's bottom"
        return
    cell.status = "open"
    cell.proposals = [axis.x(0.5 * (axis.u(axis.lo) + axis.u(axis.hi))), axis.lo if top else axis.hi]


def _expand(cell: Cell, u: np.ndarray, f: np.ndarray, s: np.ndarray, axis: Axis, tol: float,
            boolean: bool) -> None:
    """An unbracketed cell's step towards its crossing's side (level: by the points' slope;
    boolean: up when every point holds): twice the measured span (≥ ``4·tol``) past the
    outermost point, clipped to the bracket; none once that end is measured."""
    if not boolean and f[-1] == f[0]:  # (a level target's f is finite)
        return
    right = s[0] > 0 if boolean else (f[-1] > f[0]) == (s[0] < 0)
    end = axis.u(axis.hi if right else axis.lo)
    edge = u[-1] if right else u[0]
    if abs(edge - end) <= 1e-12 * max(1.0, abs(end)):
        return
    step = max(2 * (u[-1] - u[0]), 4 * tol)
    nxt = min(edge + step, end) if right else max(edge - step, end)
    cell.status, cell.proposals = "open", [axis.x(nxt)]
    cell.note += f"; stepping {'up' if right else 'down'} to {axis.x(nxt):.4g}"


def _interpolate(u: np.ndarray, f: np.ndarray, i: int, j: int, level: float) -> float:
    """Where the monotone cubic (PCHIP, Fritsch & Carlson 1980) through the bracket's ends
    ``i < j`` and one monotone neighbour each side crosses ``level``."""
    from scipy.interpolate import PchipInterpolator
    from scipy.optimize import brentq

    up = f[j] > f[i]  # (f is finite here: a level target's points without a value are dropped)
    lo = i - 1 if i > 0 and (f[i] > f[i - 1]) == up and f[i] != f[i - 1] else i
    hi = j + 1 if j < len(f) - 1 and (f[j + 1] > f[j]) == up and f[j + 1] != f[j] else j
    if hi - lo < 2:
        return u[i] + (f[i] - level) / (f[i] - f[j]) * (u[j] - u[i])
    curve = PchipInterpolator(u[lo:hi + 1], f[lo:hi + 1])
    return float(brentq(lambda v: float(curve(v)) - level, u[i], u[j]))


@dataclass(frozen=True)
class Fit:
    """``log y = s log L + c``: slope ``s``, its Student-t interval ``[lo, hi]`` (NaN under
    three points), ``n`` points, ``resolution``: the largest change of ``s`` the points'
    uncertainties (``±err`` in log y) can make."""

    s: float
    lo: float
    hi: float
    n: int
    resolution: float


def fit_exponent(L, y, err=None, confidence: float = 0.95) -> Fit:
    """The exponent ``s`` of ``y ∝ L^s`` (Table 4: ``y = βα*^M`` at the crossing, ``L`` depth)
    for positive ``L``, ``y`` of length ``n``; ``err``: half-widths of ``log y`` or None; the
    interval is ``s ± t_{n−2} · SE(s)``.  All NaN under two points."""
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
    q = float(stats.t.ppf(0.5 + confidence / 2, n - 2)) * math.sqrt(float(resid @ resid) / (n - 2) / sxx)
    return Fit(s, s - q, s + q, n, resolution)


# --------------------------------------------------------------------------- a contour sweep
def _stages(group: list[int], boolean: bool = False) -> dict[int, int]:
    """The warm-start stage of each point of a line sorted along ``fit_over``: the ends 0,
    then the middle of every gap (1, 2, …); a boolean line of two: 0 and 1."""
    n = len(group)
    if boolean and n == 2:
        return {group[0]: 0, group[1]: 1}
    stage, spans, k = {group[0]: 0, group[-1]: 0}, [(0, n - 1)], 1
    while spans:
        nxt = []
        for i, j in spans:
            if j - i > 1:
                m = (i + j) // 2
                stage[group[m]] = k
                nxt += [(i, m), (m, j)]
        spans, k = nxt, k + 1
    return stage


@dataclass(frozen=True)
class Spec:
    """``hydra.sweeper.contour``, checked (the defaults: conf/hydra/sweeper/contour.yaml's)."""

    metric: str
    levels: tuple
    axis: Axis
    start: int = 5
    tol: float = 0.02
    method: str = "secant"
    boolean: bool = False
    max_rounds: int = 12
    fit_over: str | None = None
    s_tol: float | None = None
    warm: bool = False
    warm_across: tuple = ()


def parse_spec(node: Any) -> Spec:
    """:class:`Spec` of ``hydra.sweeper.contour``; ValueError (one line) for a bad field."""
    from omegaconf import OmegaConf

    c = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node or {})
    known = {f.name for f in fields(Spec)} | {"bracket", "scale"}
    if unknown := sorted(set(c) - known):
        raise ValueError(f"hydra.sweeper.contour: unknown key(s) {unknown}; known: {sorted(known)}")
    levels, bracket, fo, s_tol = c.get("levels"), c.get("bracket"), c.get("fit_over"), c.get("s_tol")
    levels = [levels] if isinstance(levels, int | float) else levels
    method, warm = c.get("method", "secant"), c.get("warm", False)
    tol, start, rounds = float(c.get("tol", 0.02)), int(c.get("start", 5)), int(c.get("max_rounds", 12))
    across = c.get("warm_across") or []
    across = [across] if isinstance(across, str) else across
    for bad, message in [
            (not c.get("metric") or not c.get("axis"),
             ": give metric (e.g. erank_io) and axis (e.g. alpha)"),
            (not levels or not all(isinstance(v, int | float) for v in levels),
             f".levels: a list of numbers, got {c.get('levels')!r}"),
            (not isinstance(bracket, list) or len(bracket) != 2, f".bracket: [lo, hi], got {bracket!r}"),
            (method not in ("secant", "bisect"), f".method: secant or bisect, got {method!r}"),
            (not (tol > 0 and start >= 2 and rounds >= 1), ": tol > 0, start ≥ 2 and max_rounds ≥ 1, "
             f"got tol={tol}, start={start}, max_rounds={rounds}"),
            (s_tol is not None and not (isinstance(s_tol, int | float) and s_tol > 0 and fo),
             f".s_tol: the exponent's tolerance, a number > 0 with fit_over set, got s_tol={s_tol!r}, "
             f"fit_over={fo!r}"),
            (not isinstance(warm, bool) or (warm and not fo), ".warm: true or false, true only with "
             f"fit_over (the axis it warm-starts along), got warm={warm!r}"),
            (not isinstance(across, list) or not all(isinstance(k, str) for k in across)
             or (across and not warm) or fo in across or c.get("axis") in across,
             ".warm_across: a list of trace axes (not fit_over, not the axis), only with warm: "
             f"true, got {c.get('warm_across')!r}")]:
        if bad:
            raise ValueError(f"hydra.sweeper.contour{message}")
    axis = Axis(str(c["axis"]), float(bracket[0]), float(bracket[1]), str(c.get("scale", "log")))
    return Spec(str(c["metric"]), tuple(float(v) for v in levels), axis, start, tol, method,
                bool(c.get("boolean", False)), rounds, fo, None if s_tol is None else float(s_tol),
                warm, tuple(across))


class Contour:
    """A contour sweep's trace points, values and cells (the sweeper launches, reads back)."""

    def __init__(self, spec: Spec, trace: list[list[str]], swept: list[str]):
        self.spec, self.trace = spec, trace
        self.labels = [{k: v for k, v in (o.lstrip("+~").split("=", 1) for o in job) if k in swept}
                       for job in trace]
        # per trace point {x: metric} and {x: nominal ratio}; per (t, level) cell its bracket
        # width, Cell and last crossing (in u); per t its points when last solved
        self.values, self.ratios = [{} for _ in trace], [{} for _ in trace]
        self.width, self.cells, self.estimate, self.solved, self.rounds = {}, {}, {}, {}, 0
        fo = spec.fit_over
        self.depth = [math.log(float(lab[fo])) if fo in lab else math.nan for lab in self.labels]
        groups: dict[tuple, list[int]] = {}
        for t, lab in enumerate(self.labels):
            groups.setdefault(tuple((k, v) for k, v in lab.items() if k != fo), []).append(t)
        self.groups = [sorted(g, key=lambda t: self.depth[t]) for g in groups.values()]
        self.group = {t: g for g in self.groups for t in g}
        self.stage = {t: k for g in self.groups for t, k in _stages(g, spec.boolean).items()}
        self.donor = self._donors()

    def _donors(self) -> dict[int, int]:
        """``warm_across``: trace point → its donor, the first such line's point at the same
        ``fit_over`` value (lines differing only in the ``warm_across`` axes)."""
        fo, across, first, out = self.spec.fit_over, self.spec.warm_across, {}, {}
        for t, lab in enumerate(self.labels):
            key = tuple((k, v) for k, v in lab.items() if k not in across)  # fit_over kept
            if not across or not set(across) <= set(lab) or fo not in lab:
                continue
            leader = first.setdefault(tuple(p for p in key if p[0] != fo), self.group[t])
            if self.group[t] is not leader:
                out[t] = next((t2 for t2 in leader if self.labels[t2][fo] == lab[fo]), None)
        return {t: d for t, d in out.items() if d is not None}

    def first_round(self) -> list[tuple[int, float]]:
        """Every trace point at ``start`` values spanning the bracket (warm: stage 0 only)."""
        xs = self.spec.axis.start(self.spec.start)
        return [(t, x) for t in range(len(self.trace)) for x in xs
                if not self.spec.warm or (self.stage[t] == 0 and t not in self.donor)]

    def overrides(self, jobs: list[tuple[int, float]]) -> list[list[str]]:
        """Each job's Hydra overrides: its trace point's, then the solved axis."""
        return [[*self.trace[t], f"{self.spec.axis.key}={x!r}"] for t, x in jobs]

    def record(self, jobs: list[tuple[int, float]], read: list[tuple[float, float]]) -> None:
        """Store the (metric, nominal ratio) read back for each job of a round."""
        for (t, x), (v, r) in zip(jobs, read, strict=True):
            self.values[t][x], self.ratios[t][x] = v, r
        self.rounds += 1

    def next_round(self) -> list[tuple[int, float]]:
        """Solve every cell on the values so far; the (trace point, x) jobs they ask for."""
        s, new = self.spec, []
        for t in range(len(self.trace)):
            if not self.values[t] or self.solved.get(t) == len(self.values[t]):
                continue  # not started, or nothing new since its cells were solved
            self.solved[t] = len(self.values[t])
            wanted: list[float] = []
            for level in s.levels:
                key = (t, level)
                cell = solve(self.values[t], level, s.axis, s.tol, boolean=s.boolean, method=s.method,
                             previous_width=self.width.get(key, math.inf), prior=self.estimate.get(key),
                             allowed=self.allowed(t, level), expand=s.warm)
                self.cells[key] = cell
                if math.isfinite(cell.width):
                    self.width[key] = cell.width
                if math.isfinite(cell.crossing):
                    self.estimate[key] = s.axis.u(cell.crossing)
                wanted += [x for x in cell.proposals if x not in self.values[t] and x not in wanted]
            new += [(t, x) for x in sorted(wanted)]
        if s.warm:
            new += self._warm_starts()
        return new

    def _settled(self, t: int) -> bool:
        return bool(self.values[t]) and all(
            (t, lv) in self.cells and self.cells[(t, lv)].status != "open" for lv in self.spec.levels)

    def _warm_starts(self) -> list[tuple[int, float]]:
        """The first points of each unstarted trace point whose earlier stages are settled:
        around each level's :meth:`predict`, else the ``start`` points."""
        s, out = self.spec, []
        for t in range(len(self.trace)):
            g = self.group[t]
            if self.values[t] or any(t2 != t and self.stage[t2] < self.stage[t] and not self._settled(t2)
                                     for t2 in g) or (t in self.donor and not self._settled(self.donor[t])):
                continue
            guess = {lv: self.predict(t, lv) for lv in s.levels}
            if (end := self._end_hint(t, any(p is None for p in guess.values()))) is not None:
                out.append((t, end))
                continue
            if any(p is None for p in guess.values()):
                out += [(t, x) for x in s.axis.start(s.start)]
                continue
            order = sorted(s.levels, key=lambda lv: guess[lv][0])
            us: list[float] = []
            for i, lv in enumerate(order):
                u, delta = guess[lv]
                self.estimate[(t, lv)] = u
                if len(order) == 1 or s.boolean:
                    us += [u - delta, u + delta]
                else:
                    us.append(u - delta if i == 0 else u + delta if i == len(order) - 1 else u)
            lo, hi = s.axis.u(s.axis.lo), s.axis.u(s.axis.hi)
            xs = sorted({s.axis.x(min(max(u, lo), hi)) for u in us})
            out += [(t, x) for x in xs]
        return out

    def _end_hint(self, t: int, unpredicted: bool) -> float | None:
        """A boolean target's bracket end to measure ``t`` at first: the top when its nearest
        settled depth (else, with nothing predicted, its donor) held at the top, the bottom
        when it failed everywhere (:func:`_one_end`); None otherwise."""
        s = self.spec
        if not s.boolean or len(s.levels) != 1:
            return None
        line = sorted((t2 for t2 in self.group[t] if t2 != t and self._settled(t2)),
                      key=lambda t2: abs(self.depth[t2] - self.depth[t]))
        for src in line[:1] + ([self.donor[t]] if unpredicted and t in self.donor else []):
            if self.cells[(src, s.levels[0])].status != "unbracketed":
                continue
            v = self.values[src]
            held = {x: v[x] >= s.levels[0] for x in v}  # (NaN: not held)
            if held.get(s.axis.hi):
                return s.axis.hi
            if not any(held.values()) and s.axis.lo in v:
                return s.axis.lo
        return None

    def predict(self, t: int, level: float) -> tuple[float, float] | None:
        """The crossing of ``level`` at ``t`` (in u), linear in log L between the converged
        neighbours along ``fit_over`` (a donor's first, :meth:`_across`), and the half-width
        to measure around it: twice its gap to the least-squares law (≥ 3 depths), at least
        ``tol`` (boolean: ``tol``/2).  None when no neighbour has converged."""
        s = self.spec
        guess = self._across(t, level) or self._along(t, level)
        if guess is None:
            return None
        return guess[0], 0.499 * s.tol if s.boolean else max(s.tol, 2 * guess[1])

    def _along(self, t: int, level: float) -> tuple[float, float] | None:
        """The crossing linear in log L between the converged neighbours, and its gap to the
        least-squares law (level targets, ≥ 3 depths; else 0).  None when none converged."""
        known = [(self.depth[t2], self.estimate[(t2, level)]) for t2 in self.group[t]
                 if t2 != t and self._converged(t2, level)]
        if not known:
            return None
        x0 = self.depth[t]
        below = sorted((p for p in known if p[0] < x0), reverse=True)
        above = sorted(p for p in known if p[0] > x0)
        pair = [below[0], above[0]] if below and above else sorted(known, key=lambda p: abs(p[0] - x0))[:2]
        if len(pair) == 1 or pair[0][0] == pair[1][0]:
            u = pair[0][1]
        else:
            (xa, ua), (xb, ub) = pair
            u = ua + (ub - ua) * (x0 - xa) / (xb - xa)
        if len(known) < 3 or self.spec.boolean:
            return u, 0.0
        k = np.array(known)
        slope, icpt = np.polyfit(k[:, 0], k[:, 1], 1)
        return u, abs(slope * x0 + icpt - u)

    def _converged(self, t: int, level: float) -> bool:
        """Trace point ``t`` is settled and its ``level`` cell converged."""
        return self._settled(t) and self.cells[(t, level)].status == "converged"

    def _across(self, t: int, level: float) -> tuple[float, float] | None:
        """The donor's crossing plus the two lines' mean offset over the depths converged on
        both, and the offsets' range.  None without a converged donor."""
        d = self.donor.get(t)
        if d is None or not self._converged(d, level):
            return None
        offsets = [self.estimate[(t2, level)] - self.estimate[(self.donor[t2], level)]
                   for t2 in self.group[t] if t2 != t and self._converged(t2, level)
                   and t2 in self.donor and self._converged(self.donor[t2], level)]
        if not offsets:
            return self.estimate[(d, level)], 0.0
        return self.estimate[(d, level)] + float(np.mean(offsets)), float(np.ptp(offsets))

    def allowed(self, t: int, level: float) -> float | None:
        """The error (in u) cell ``(t, level)`` may leave in ``s_tol``: the slope's worst case
        ``Σ_i |w_i| · M · e_i ≤ s_tol`` (``w_i`` the least-squares weights, ``M`` =
        :meth:`_slope`) split evenly over the depths that weigh; ``inf`` at weight 0."""
        s = self.spec
        if s.s_tol is None or not math.isfinite(self.depth[t]):
            return None
        xs = np.array([self.depth[t2] for t2 in self.group[t] if self.cells.get((t2, level)) is None
                       or self.cells[(t2, level)].status not in ("unbracketed", "non_monotone")])
        if xs.size < 2 or np.ptp(xs) == 0:
            return None
        dx = xs - xs.mean()
        n = int((np.abs(dx / float(dx @ dx)) > 1e-12).sum())
        wt = abs((self.depth[t] - xs.mean()) / float(dx @ dx))
        return math.inf if wt <= 1e-12 else s.s_tol / (n * self._slope(t) * wt)

    def _slope(self, t: int) -> float:
        """``|d log(nominal ratio)/du|`` from ``t``'s runs (M for α, 1 for β; 1 without)."""
        pts = [(self.spec.axis.u(x), r) for x, r in self.ratios[t].items() if r > 0]
        if len(pts) < 2:
            return 1.0
        (ua, ra), (ub, rb) = min(pts), max(pts)
        return abs(math.log(rb / ra) / (ub - ua)) if ub != ua and rb != ra else 1.0

    def _ratio(self, t: int, cell) -> tuple[float, float]:
        """βα^M at the crossing (log-linear in u across the bracket) and its error in log;
        NaN and the crossing's error when the axis leaves βα^M alone (a learning rate)."""
        r = self.ratios[t]
        ra, rb = r.get(cell.lo, math.nan), r.get(cell.hi, math.nan)
        if not (ra > 0 and rb > 0) or all(abs(v / ra - 1) < 1e-12 for v in r.values() if v > 0):
            return math.nan, cell.error
        ax = self.spec.axis
        ua, ub = ax.u(cell.lo), ax.u(cell.hi)
        w = 0.0 if ub == ua else (ax.u(cell.crossing) - ua) / (ub - ua)
        slope = 0.0 if ub == ua else abs(math.log(rb / ra)) / (ub - ua)
        return math.exp((1 - w) * math.log(ra) + w * math.log(rb)), slope * cell.error

    def tables(self):
        """``(contour, exponents)`` pandas tables (see the module docstring)."""
        import pandas as pd

        rows = []
        for (t, level), c in sorted(self.cells.items()):  # trace order, levels in order
            ratio, err = self._ratio(t, c) if c.status == "converged" else (math.nan, math.nan)
            rows.append({**self.labels[t], "level": level, "status": c.status, "crossing": c.crossing,
                         "lo": c.lo, "hi": c.hi, "f_lo": c.f_lo, "f_hi": c.f_hi, "width": c.width,
                         "error": c.error, "nominal_ratio": ratio, "log_ratio_err": err, "points": c.points,
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


# --------------------------------------------------------------------------- the sweeper
class ContourSweeper(RankexpSweeper):
    """See the module docstring."""

    def __init__(self, max_batch_size: int | None, params: dict[str, str] | None = None,
                 grids: Any = None, contour: Any = None) -> None:
        RankexpSweeper.__init__(self, max_batch_size=max_batch_size, params=params, grids=grids)
        self.contour = contour

    def sweep(self, arguments: list[str]) -> Any:
        cli.mark_composed()
        # SciPy imported before any job: a signal between two rounds never lands inside its
        # import (a half-imported scipy.stats fails to load again in Hydra's error report)
        import scipy.interpolate  # noqa: F401
        import scipy.optimize  # noqa: F401
        import scipy.stats  # noqa: F401

        try:
            self.spec = parse_spec(self.contour)
        except ValueError as e:
            self._refuse(0, [f"  {e}"])
        return super().sweep(arguments)

    def _prepare(self, plan):
        spec = self.spec
        if spec.axis.key in plan.swept:
            self._refuse(len(plan.jobs), [f"  {spec.axis.key} is the contour's axis "
                                          "(hydra.sweeper.contour.axis): do not sweep it too"])
        self.state = Contour(spec, plan.jobs, plan.swept)
        self.swept = [*plan.swept, spec.axis.key]
        self.jobs, self.dirs, self.names, self.hashes = [], [], [], []
        self.first = self.state.first_round()
        checked = self._check_round(self.state, self.first)
        self._check_metric(checked["settings"])
        return self._open_parent(checked)

    def _check_metric(self, settings: list) -> None:
        """Exit 2 when no job of a measurement logs the contour's metric: not a metric of its
        probes (:attr:`rankexp.probes.catalog.Probe.metrics`), a derived param or a run fact.
        A trained run logs its own (``max_stable_lr``, …): not checked."""
        from rankexp.tasks.measure import RUN_FACTS  # (torch: the jobs import it anyway)

        metric, known = self.spec.metric, set(RUN_FACTS)
        for s in settings:
            logged = [PROBES[p].metrics for p in s.task.probes]
            if s.task.name != "measure" or None in logged:
                return
            derived = family_of(s).derived
            known |= set().union(*logged, derived(s) if derived else ())
        if metric not in known:
            close = difflib.get_close_matches(metric, known, n=1)
            self._refuse(len(self.first), [
                f"  hydra.sweeper.contour.metric={metric} — no job logs it: not a metric of "
                f"task.probes={sorted({p for s in settings for p in s.task.probes})} nor a "
                f"derived param{f'; did you mean {close[0]}?' if close else ''}"])

    def _execute(self, parent, returns: list) -> None:
        """Launch round after round until every cell is settled or ``max_rounds`` ran."""
        state, jobs = self.state, self.first
        while jobs:
            first = len(self.jobs) - len(jobs)
            log.info("contour round %d: %d jobs", state.rounds + 1, len(jobs))
            returns += self._launch(self.jobs[first:], first)
            state.record(jobs, self._read_back(parent, self.hashes[first:]))
            jobs = state.next_round()
            if state.rounds >= state.spec.max_rounds:
                if jobs:
                    log.warning("contour: max_rounds=%d reached with %d cells open",
                                state.spec.max_rounds, sum(c.status == "open" for c in state.cells.values()))
                break
            if jobs:
                self._check_round(state, jobs)
                _extend_sweep(parent, self.dirs, self.names)

    def _finish(self, parent, interrupted: str | None, returns: list) -> str:
        self._report(self.state, parent)
        return super()._finish(parent, interrupted, returns)

    def _check_round(self, state: Contour, jobs: list[tuple[int, float]]) -> dict[str, Any]:
        """Compose and check a round's jobs (numbered after the earlier rounds'); exit 2 on any
        problem, or when the jobs do not log to a store (the contour is read back from it)."""
        overrides = state.overrides(jobs)
        checked = self._check_all(overrides, self.swept, first=len(self.jobs))
        if len(checked.pop("keys")) != len(checked["hashes"]):
            self._refuse(len(jobs), ["  two trace points compose to one config: give each its "
                                     "own values (hydra.sweeper.params / grids)"])
        if not checked["settings"][0].tracking.enabled:
            self._refuse(len(jobs), ["  hydra/sweeper=contour reads each round back from the "
                                     "store: tracking.enabled=false cannot be contoured"])
        names = naming.job_names(overrides, [*state.labels[0], state.spec.axis.key], checked["names"])
        taken = set(self.names)
        self.names += [f"{n}{naming.SEP}#{len(self.jobs) + i}" if n in taken else n
                       for i, n in enumerate(names)]
        self.jobs += overrides
        self.dirs += checked["job_dirs"]
        self.hashes += checked["hashes"]
        return {**checked, "job_dirs": list(self.dirs), "names": list(self.names)}

    def _read_back(self, parent, hashes: list[str]) -> list[tuple[float, float]]:
        """(metric, nominal_ratio) of each config hash's FINISHED run in the store (NaN when
        there is none: the job failed or logged offline); asks for these hashes only."""
        runs = tracking.finished_runs(parent.uri, parent.experiment_id, hashes)

        def value(h: str, key: str) -> float:
            data = runs[h].data if h in runs else None
            v = data and data.metrics.get(key, data.params.get(key))
            return math.nan if v is None else float(v)
        return [(value(h, self.spec.metric), value(h, "nominal_ratio")) for h in hashes]

    def _report(self, state: Contour, parent) -> None:
        """Log the contour, its exponents and unsettled cells; attach them to the parent run."""
        import pandas as pd

        if not state.cells:
            return
        contour, fits = state.tables()
        for _, row in contour[contour["status"] != "converged"].iterrows():
            log.warning("contour cell %s level %g: %s (%s)", " ".join(f"{k}={row[k]}" for k in
                        state.labels[0]), row["level"], row["status"], row["note"])
        with pd.option_context("display.max_columns", None, "display.width", 200):
            log.info("contour after %d rounds, %d runs:\n%s", state.rounds, len(self.jobs),
                     contour.to_string(index=False))
            if not fits.empty:
                log.info("exponents s of y ∝ L^s (y: βα^M at the crossing, or the crossing where "
                         "the axis leaves βα^M alone):\n%s", fits.to_string(index=False))
        try:  # (the parent run exists: a contour refuses a sweep that does not log to a store)
            with tempfile.TemporaryDirectory() as tmp:
                for name, df in {"contour": contour, "exponents": fits}.items():
                    df.to_csv(Path(tmp) / f"{name}.csv", index=False)
                    df.to_json(Path(tmp) / f"{name}.json", orient="records", indent=1)
                parent.client.log_artifacts(parent.run_id, tmp, "contour")
            for k, v in {"contour_rounds": state.rounds, "contour_cells": len(contour),
                         "contour_converged": (contour["status"] == "converged").sum()}.items():
                parent.client.log_metric(parent.run_id, tracking.metric_key(k), float(v))
        except Exception as e:  # noqa: BLE001 — the runs are safe; the table can be redrawn (isorank)
            print(f"warning: could not attach the contour to the sweep run: {e}", file=sys.stderr)


def _extend_sweep(run, job_dirs: list, names: list[str]) -> None:
    """Tell the parent and the jobs of every job so far (a sweep that learns its jobs round by
    round): the plan file (names and job dirs) and the parent's ``jobs_total`` tag."""
    record = jobdir.read_json(run.sweep_dir / jobdir.NAMES_FILE) or {}
    jobdir.write_json(run.sweep_dir / jobdir.NAMES_FILE, {
        "started": record.get("started", time.time()), "names": list(names),
        "job_dirs": [str(Path(d).resolve()) for d in job_dirs]})
    run.job_dirs = list(job_dirs)
    run.client.set_tag(run.run_id, "jobs_total", str(len(job_dirs)))
