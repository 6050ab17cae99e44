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
  ``metric ≥ level`` or not — a missing value is *not*; Table 5's boundary), ``max_rounds``,
  ``fit_over`` (the trace axis of the power law ``βα^M ∝ L^s``, ``depth``), ``warm`` (only
  the ends of each ``fit_over`` line start from ``start`` points; each other depth is measured
  around the crossings its settled neighbours' power law predicts, stepping outwards when
  they miss), ``warm_across`` (trace axes such as ``expansion`` whose later values start each
  depth around the first value's crossing there, shifted by the lines' mean offset:
  :meth:`rankexp.levelset.Contour.predict`) and ``s_tol`` (the exponent's tolerance: each cell
  stops once its secant step, or the gap between its cubic and linear interpolants, is within
  the share of ``s_tol`` its weight in the fit allows, :meth:`rankexp.levelset.Contour.allowed`).

It runs rounds.  Each round is one batch of ordinary jobs through the configured launcher
(basic, joblib, Slurm): each job is a normal run (config hash, resume, the sweep's parent
run).  After a round the metric of every job is read back from the store by config hash and
each (trace point, level) cell is narrowed (:func:`rankexp.levelset.solve`; the bookkeeping:
:class:`rankexp.levelset.Contour`) until its crossing
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
from typing import Any

from rankexp.levelset import Contour, parse_spec

from .sweeper import RankexpSweeper

log = logging.getLogger(__name__)


class ContourSweeper(RankexpSweeper):
    """See the module docstring."""

    def __init__(self, max_batch_size: int | None, params: dict[str, str] | None = None,
                 grids: Any = None, contour: Any = None) -> None:
        RankexpSweeper.__init__(self, max_batch_size=max_batch_size, params=params, grids=grids)
        self.contour = contour

    def sweep(self, arguments: list[str]) -> Any:
        from rankexp import cli, interrupt

        cli.mark_composed()
        # the rounds' steps and the exponent's interval (rankexp.levelset) use SciPy: imported
        # here, before any job, so a signal between two rounds never lands inside its import
        # (a half-imported scipy.stats then fails to load again in Hydra's error report: exit 1)
        import scipy.interpolate  # noqa: F401
        import scipy.optimize  # noqa: F401
        import scipy.stats  # noqa: F401

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
        if len(checked.pop("keys")) != len(checked["hashes"]):
            self._refuse(len(jobs), ["  two trace points compose to one config: give each its "
                                     "own values (hydra.sweeper.params / grids)"])
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
            with_pd_options(lambda: log.info("exponents s of y ∝ L^s (y: βα^M at the crossing, or the "
                                             "crossing where the axis leaves βα^M alone):\n%s", fits.to_string(index=False)))
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
