"""``hydra/sweeper=contour``: a sweep that finds a level set (or a boundary) itself.

A grid spends most of its runs far from the contour it is there to locate (Table 4's iso-rank
exponents from fig5's α × L grid; Table 5's max stable LR from a fixed LR grid).  This sweeper
traces the contour directly (science.md §6 ``tab4_contour``):

* ``hydra.sweeper.params`` / ``grids`` are the **trace points** (``depth=12,…,384``, ``norm``,
  ``expansion`` …): the union of grids of :class:`~.sweeper.RankexpSweeper`, minus the solved
  axis;
* ``hydra.sweeper.contour`` says what to solve: ``metric`` (a logged metric, or a derived
  param such as ``depth_factor``), ``levels`` (``[0.4, 0.5, 0.6]``), the ``axis`` (any numeric
  config key: ``alpha``, ``beta``, ``lr``) with its ``bracket`` and ``scale`` (log/linear),
  ``start`` points of the first round, the ``tol``\\ erance (bracket width in ``log x`` on a log
  axis), ``method`` (``secant``: safeguarded; ``bisect``), ``boolean`` (the target is
  ``metric ≥ level`` or not — a missing value is *not*; Table 5's boundary), ``max_rounds`` and
  ``fit_over`` (the trace axis of the power law ``βα^M ∝ L^s``, ``depth``).

It runs rounds.  Each round is one batch of ordinary jobs through the configured launcher
(basic, joblib, Slurm): each job is a normal run (config hash, resume, the sweep's parent
run).  After a round the metric of every job is read back from the store by config hash and
each (trace point, level) cell is narrowed (:func:`rankexp.levelset.solve`) until its crossing
is bracketed to ``tol``; non-monotone and unbracketed cells are reported, never guessed.  The
first round (every trace point at ``start`` values spanning the bracket, its ends included) is
checked as a whole before anything starts, like any rankexp sweep (exit 2, nothing created);
each later round's jobs are composed and checked the same way before they run.

Resume: the proposals are a deterministic function of the values read back, so a rerun of an
interrupted contour sweep proposes the same jobs, round by round, and the existing
resume-by-config-hash skips every finished one — only the missing work runs.

The parent run holds the contour (``contour/contour.csv`` and ``.json``: one row per cell) and
the fitted exponents (``contour/exponents.csv``/``.json``: ``s`` of ``βα*^M ∝ L^s`` per level
and fixed trace values, its 95 % interval and the contour's own resolution,
:func:`rankexp.levelset.fit_exponent`), and the metrics ``contour_rounds``,
``contour_cells``, ``contour_converged``.
"""

import logging
import math
import signal
import sys
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from .sweeper import RankexpSweeper

log = logging.getLogger(__name__)


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
    from rankexp.levelset import Axis

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
        from rankexp.levelset import solve

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

        from rankexp.levelset import fit_exponent

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


class ContourSweeper(RankexpSweeper):
    """See the module docstring."""

    def __init__(self, max_batch_size: int | None, params: dict[str, str] | None = None,
                 grids: Any = None, contour: Any = None) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params, grids=grids)
        self.contour = contour

    def sweep(self, arguments: list[str]) -> Any:
        from rankexp import cli, interrupt

        cli.mark_composed()
        try:
            spec = parse_spec(self.contour)
        except ValueError as e:
            self._refuse(0, [f"  {e}"])
        plan = self._plan(arguments)
        if spec.axis.key in plan.swept:
            self._refuse(len(plan.jobs), [f"  {spec.axis.key} is the contour's axis "
                                          "(hydra.sweeper.contour.axis): do not sweep it too"])
        state, self.spec = Contour(spec, plan.jobs, plan.swept), spec
        self.swept = set(plan.swept) | {spec.axis.key}
        self.jobs, self.dirs, self.names, self.hashes = [], [], [], []
        jobs = state.first_round()
        with interrupt.installed():
            try:
                checked = self._check_round(state, jobs)
                parent = self._open_parent(checked)
            except interrupt.JobInterrupted as e:
                raise SystemExit(128 + signal.Signals[e.signal_name].value) from None
            interrupted, returns = None, []
            try:
                self._rounds(state, jobs, parent, returns)
            except interrupt.JobInterrupted as e:
                interrupted = e.signal_name
            except KeyboardInterrupt:
                interrupted = "SIGINT"
            finally:
                with interrupt.deferred():
                    self._report(state, parent)
                    status = self._close(parent, self.dirs, interrupted, returns, self.jobs, self.swept)
        if interrupted:
            raise SystemExit(128 + signal.Signals[interrupted].value)
        if status != "FINISHED":
            raise SystemExit(1)
        return returns

    def _check_round(self, state: Contour, jobs: list[tuple[int, float]]) -> dict[str, Any]:
        """Compose and check a round's jobs (numbered after the earlier rounds'); exit 2 on any
        problem, or when the jobs do not log to a store (the contour is read back from it)."""
        from rankexp import naming

        overrides = state.overrides(jobs)
        checked = self._check_all(overrides, self.swept, first=len(self.jobs))
        if not checked["settings"][0].tracking.enabled:
            self._refuse(len(jobs), ["  hydra/sweeper=contour reads each round back from the "
                                     "store: tracking.enabled=false cannot be contoured"])
        names = naming.job_names(overrides, [*state.labels[0], state.spec.axis.key], checked["names"])
        taken = set(self.names)
        names = [f"{n}{naming.SEP}#{len(self.jobs) + i}" if n in taken else n
                 for i, n in enumerate(names)]
        self.jobs += overrides
        self.dirs += checked["job_dirs"]
        self.names += names
        self.hashes += checked["hashes"]
        self.uri = checked["settings"][0].tracking.uri
        self.resume = checked["settings"][0].tracking.resume and not checked["settings"][0].tracking.force
        return {**checked, "job_dirs": list(self.dirs), "names": list(self.names)}

    def _rounds(self, state: Contour, jobs: list[tuple[int, float]], parent, returns: list) -> None:
        """Launch round after round until every cell is settled or ``max_rounds`` ran."""
        from rankexp import tracking

        while jobs:
            first = len(self.jobs) - len(jobs)
            log.info("contour round %d: %d jobs", state.rounds + 1, len(jobs))
            self.overrides = [self.jobs[first:]] if self.max_batch_size is None else \
                list(self.split_overrides_to_chunks(self.jobs[first:], self.max_batch_size))
            self.batch_index = 0
            returns += self._launch_all(first)
            state.record(jobs, self._read_back(parent, self.hashes[first:]))
            jobs = state.next_round()
            if state.rounds >= state.spec.max_rounds:
                if jobs:
                    log.warning("contour: max_rounds=%d reached with %d cells open",
                                state.spec.max_rounds, sum(c.status == "open" for c in state.cells.values()))
                break
            if jobs:
                self._check_round(state, jobs)
                tracking.extend_sweep(parent, self.dirs, self.names, self.hashes, self.resume)

    def _read_back(self, parent, hashes: list[str]) -> list[tuple[float, float]]:
        """(metric, nominal_ratio) of each config hash's FINISHED run in the store (NaN when
        there is none: the job failed or logged offline)."""
        from rankexp import tracking

        spec = self.spec
        df = tracking.runs_table([parent.experiment], parent.uri)
        out = {}
        if not df.empty and "tags.config_hash" in df:
            col = next((c for c in (f"metrics.{spec.metric}", f"params.{spec.metric}") if c in df), None)
            ratio = df["params.nominal_ratio"] if "params.nominal_ratio" in df else None
            for i, h in enumerate(df["tags.config_hash"]):
                if h in out:
                    continue
                v = float(df[col].iloc[i]) if col is not None and df[col].iloc[i] is not None else math.nan
                r = float(ratio.iloc[i]) if ratio is not None and ratio.iloc[i] is not None else math.nan
                out[h] = (v, r)
        return [out.get(h, (math.nan, math.nan)) for h in hashes]

    def _report(self, state: Contour, parent) -> None:
        """Log the contour and its exponents (and the unsettled cells) and attach them to the
        parent run."""
        from rankexp import tracking

        if not state.cells:
            return
        contour, fits = state.tables()
        bad = contour[contour["status"] != "converged"]
        for _, row in bad.iterrows():
            log.warning("contour cell %s level %g: %s (%s)", " ".join(f"{k}={row[k]}" for k in
                        state.labels[0]), row["level"], row["status"], row["note"])
        with_pd_options(lambda: log.info("contour after %d rounds, %d runs:\n%s", state.rounds,
                                         len(self.jobs), contour.to_string(index=False)))
        if not fits.empty:
            with_pd_options(lambda: log.info("exponents s of βα^M ∝ L^s:\n%s", fits.to_string(index=False)))
        if parent is None or parent.run_id is None:
            return
        try:
            tracking.log_tables(parent, {"contour": contour, "exponents": fits}, {
                "contour_rounds": state.rounds, "contour_cells": len(contour),
                "contour_converged": int((contour["status"] == "converged").sum())})
        except Exception as e:  # noqa: BLE001 — the runs are safe; the table can be redrawn (isorank)
            print(f"warning: could not attach the contour to the sweep run: {e}", file=sys.stderr)


def with_pd_options(fn) -> None:
    """Run ``fn`` with pandas printing every column, wide."""
    import pandas as pd

    with pd.option_context("display.max_columns", None, "display.width", 200):
        fn()
