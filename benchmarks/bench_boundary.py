"""Runs Table 5's max stable learning rate needs: the boundary sweep against the LR grid (issue 20).

    python -m benchmarks.bench_boundary                # size=cpu: d = 64, 300 steps, 8 cells

Both sweeps run for real through the CLI into one temporary store (``--store``), one torch
thread: ``experiment=fig6_train`` (each cell one run training every rate of ``task.lrs`` as one
batched model: ``len(task.lrs)`` trainings a cell, its half-decade spacing reads each boundary
to ±0.25 decades as the midpoint of the largest stable rate and the next) and
``experiment=tab5_boundary`` (``hydra/sweeper=contour``: one rate a run, bisecting log lr to
half a decade, depths warm-started from their neighbours and each α > the first from the
first's boundary at the same depth, ``warm_across: [alpha]``).  Printed: the trainings each
needed, two ratios — against the grid as run (``task.lrs``: its widest spacing is 0.52
decades, so it reads ±0.26) and against a grid of equal precision (spacing ≤ 0.5 decades over
the same range: 7 rates) — and each cell's two readings (``analysis table5``'s tables, the grid's
read as the same midpoint) with the largest difference in decades.  At ``size=cpu`` (and
full) both have the same cells and threshold; their smoke sizes differ (tab5_boundary's
smoke lowers task.stable_accuracy so that 20 steps can reach it).
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from rankexp.cli import CONF_DIR

REPO = Path(__file__).resolve().parents[1]


def sweep(name: str, size: str, uri: str, out: Path) -> float:
    """``python -m rankexp experiment=<name> size=<size> -m`` into ``uri``; its seconds."""
    t0 = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-m", "rankexp", f"experiment={name}", f"size={size}",
                        f"tracking.uri={uri}", f"hydra.sweep.dir={out / name}", "-m"],
                       cwd=REPO, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{name} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return time.perf_counter() - t0


def lrs(size: str) -> list[float]:
    """fig6_train's ``task.lrs`` at ``size`` (its overlay, else the task's default)."""
    from rankexp.knobs import KNOBS

    c = OmegaConf.load(f"{CONF_DIR}/size/fig6_train/{size}.yaml") if size != "full" else {}
    given = OmegaConf.select(OmegaConf.create(c), "task.lrs")
    return [float(v) for v in (given if given is not None else
                               next(k.default for k in KNOBS if k.key == "task.lrs"))]


#: the boundary sweep's reading in decades: tab5_boundary bisects to half a decade (its tol)
READING = 0.25
#: trainings a cell needs at the least to read its boundary to ±READING: one stable rate and one
#: unstable rate within 2·READING decades of it (nothing one cell's runs say decides another's)
FEWEST_PER_CELL = 2


def equal_precision_rates(lo: float, hi: float, reading: float) -> int:
    """Rates a log-spaced grid over ``[lo, hi]`` needs to read a boundary to ±``reading``
    decades (its midpoints): spacing ≤ ``2·reading`` decades, the ends included."""
    return math.ceil(math.log10(hi / lo) / (2 * reading) - 1e-9) + 1


def grid_midpoints(runs: pd.DataFrame, rates: list[float]) -> pd.Series:
    """Each grid cell's boundary read as the geometric midpoint of its largest stable rate and
    the next rate of the grid (the largest stable rate when it is the grid's top)."""
    from analysis.study.fig6_train import table5

    top = table5(runs)
    nxt = {a: b for a, b in zip(rates, rates[1:], strict=False)}
    return top.drop(columns="max over alpha").stack(future_stack=True).map(
        lambda v: v if math.isnan(v) or v not in nxt else math.sqrt(v * nxt[v]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="cpu", choices=["cpu", "full"])
    p.add_argument("--store", type=Path, default=None, help="folder of the store (default: a new temporary one)")
    args = p.parse_args()
    from analysis.study.fig6_train import table5
    from rankexp.tracking import runs_table

    where = args.store or Path(tempfile.mkdtemp(prefix="bench-boundary-"))
    where.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{where / 'mlflow.db'}"
    rates = lrs(args.size)
    sec = {name: sweep(name, args.size, uri, where) for name in ("fig6_train", "tab5_boundary")}
    grid, bound = (runs_table([n], uri) for n in ("fig6_train", "tab5_boundary"))
    grid = grid.rename(columns=lambda c: c.split(".", 1)[1] if c.startswith(("params.", "metrics.")) else c)
    bound = bound.rename(columns=lambda c: c.split(".", 1)[1] if c.startswith(("params.", "metrics.")) else c)
    for df in (grid, bound):
        for c in ("alpha", "depth", "lr", "max_stable_lr"):
            if c in df:
                df[c] = pd.to_numeric(df[c], errors="coerce")
    cells = len(grid)
    g = grid_midpoints(grid, rates)
    b = table5(bound).drop(columns="max over alpha").stack(future_stack=True)
    both = pd.DataFrame({"grid (midpoint)": g, "boundary": b})
    both["decades apart"] = np.abs(np.log10(both["boundary"] / both["grid (midpoint)"]))
    print(f"size={args.size}: {cells} cells (placement × depth × α), task.lrs = {rates}, store {uri}")
    with pd.option_context("display.width", 200):
        print(both.to_string(float_format=lambda v: f"{v:.3g}"))
    n_grid, n_bound = cells * len(rates), len(bound)
    spacing = float(np.max(np.diff(np.log10(rates))))
    equal = equal_precision_rates(rates[0], rates[-1], READING)
    n_equal = cells * equal
    print(f"grid: {cells} runs × {len(rates)} rates = {n_grid} trainings ({sec['fig6_train']:.0f} s; "
          f"widest spacing {spacing:.2f} decades: ±{spacing / 2:.2f}); boundary: {n_bound} one-rate "
          f"trainings ({sec['tab5_boundary']:.0f} s; ±{READING})")
    print(f"the grid as run trains {n_grid / n_bound:.1f}× as many; a grid at equal precision "
          f"(spacing ≤ {2 * READING:g} decades over the same range: {equal} rates, {n_equal} "
          f"trainings) {n_equal / n_bound:.1f}× (target ≥ 4×); largest difference "
          f"{both['decades apart'].max():.2f} decades (each reading ±{READING})")
    # any boundary sweep: a cell's reading to ±READING needs a stable and an unstable rate at
    # most 2·READING decades apart, two trainings of that cell's own network
    floor = FEWEST_PER_CELL * cells
    print(f"the fewest any boundary sweep can train for this precision: {FEWEST_PER_CELL} a cell = "
          f"{floor}, so at most {n_grid / floor:.1f}× the grid as run and {n_equal / floor:.1f}× "
          f"the equal-precision grid (this sweep: {n_bound / floor:.2f}× that floor)")


if __name__ == "__main__":
    main()
