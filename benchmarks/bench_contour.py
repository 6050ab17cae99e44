"""Runs a grid and a contour sweep need for Table 4's iso-rank exponents (issue 20).

    python -m benchmarks.bench_contour                 # size=cpu: d = 64, 2 seeds, L = 12…192
    python -m benchmarks.bench_contour --size smoke    # d = 16, 1 seed, L = 4, 8 (seconds)

Both read the same experiment's model and trace points (``conf/experiment/tab4_contour.yaml`` at
``--size``: placements, m/d, depths, levels, the α bracket), and the metric of each (α, L, norm,
m/d) is the job's own measurement — ``erank_io`` of :func:`rankexp.tasks.measure.run_probes` on
the experiment's network and seeds — computed once per distinct config in this process (one
torch thread) and counted as one run, as a sweep counts its jobs.

* **Reference**: the contour sweep's algorithm (:class:`hydra_plugins.rankexp_plugins.contour.Contour`, the rounds
  ``hydra/sweeper=contour`` runs) bracketing every crossing to ``--ref-tol`` from every
  depth's start points (no warm start, no exponent budget).
* **Contour**: the experiment's own sweep (warm starts along depth and across m/d —
  ``warm_across`` —, each cell stopped at the error the exponent can take, its
  ``hydra.sweeper.contour.s_tol``): its runs and whether every exponent s (each placement ×
  m/d × r*) is within ``--within`` (0.01) of the reference; the ratio is judged on it.  Also
  the budgets ``--s-tols`` and plain bracketing to the widths ``--tols`` (the sweeper before
  warm starts and budgets).
* **Grid**: the α log-grid over the bracket with ``n`` points (``--grids``; 9 is fig5's √2
  grid) × the depths, s from ``analysis isorank``'s own grid method
  (:func:`analysis.study.isorank.isorank_table`); its count is the smallest ``n`` from which
  every larger ``n`` listed is within ``--within`` (the error is not monotone in ``n``: a
  lucky size is no precision one can choose).

Printed: runs, the largest |s − s_ref| at each setting, and the ratio grid runs / contour runs
at the same precision (target ≥ 4).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from omegaconf import OmegaConf

from hydra_plugins.rankexp_plugins.contour import Contour, parse_spec
from rankexp.cli import CONF_DIR
from rankexp.models.mlp import ResidualMLP
from rankexp.tasks.measure import run_probes


def experiment(size: str) -> dict:
    """tab4_contour's model, trace axes and contour at ``size`` (its YAML and size overlay)."""
    base = OmegaConf.load(f"{CONF_DIR}/experiment/tab4_contour.yaml")
    if size != "full":
        base = OmegaConf.merge(base, OmegaConf.load(f"{CONF_DIR}/size/tab4_contour/{size}.yaml"))
    c = OmegaConf.to_container(base, resolve=False)
    params = c["hydra"]["sweeper"]["params"]
    axes = {k: [v.strip() for v in str(params[k]).split(",")] for k in ("norm", "expansion", "depth")}
    return {"width": c["width"], "seeds": c["seeds"], "axes": axes,
            "contour": c["hydra"]["sweeper"]["contour"]}


class Runs:
    """``erank_io`` of one config, measured once (a run) and remembered — in this process, and
    with ``path`` in a JSON file too (a rerun measures only configs it has not seen; the
    counts are the same: each method counts the distinct configs its sweep runs)."""

    def __init__(self, width: int, seeds: int, path: Path | None = None):
        self.width, self.seeds, self.cache, self.seconds, self.path = width, seeds, {}, 0.0, path
        self.disk = json.loads(path.read_text()) if path and path.exists() else {}

    def __call__(self, norm: str, expansion: float, depth: int, alpha: float) -> float:
        key = (norm, expansion, depth, alpha)
        name = f"d{self.width} s{self.seeds} {norm} {expansion:g} {depth} {alpha!r}"
        if key not in self.cache and name in self.disk:
            self.cache[key] = self.disk[name]
        if key not in self.cache:
            t0 = time.perf_counter()
            model = ResidualMLP(self.width, depth, expansion=expansion, placement=norm, alpha=alpha,
                                seeds=list(range(self.seeds)))
            self.cache[key] = self.disk[name] = float(run_probes(model, ["io_jacobian"]).scalars["erank_io"])
            self.seconds += time.perf_counter() - t0
            if self.path and len(self.disk) % 50 == 0:
                self.save()
        return self.cache[key]

    def save(self) -> None:
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.disk))


def contour_exponents(exp: dict, runs: Runs, tol: float | None, s_tol: float | None = None
                      ) -> tuple[pd.Series, int]:
    """s per (norm, expansion, level) and the runs of the contour sweep's rounds: the
    experiment's own (warm starts, the exponent's tolerance ``s_tol``), or with ``tol`` a plain
    bracketing to that width from every depth's ``start`` points (the reference)."""
    c = {**exp["contour"], "max_rounds": 40}
    c = {**c, "s_tol": s_tol} if tol is None else {**c, "tol": tol, "s_tol": None, "warm": False, "warm_across": []}
    spec = parse_spec(c)
    trace = list(itertools.product(*exp["axes"].values()))
    state = Contour(spec, [[f"{k}={v}" for k, v in zip(exp["axes"], t, strict=True)] for t in trace],
                    list(exp["axes"]))

    def evaluate(t: int, x: float) -> tuple[float, float]:
        norm, e, L = trace[t]
        return runs(norm, float(e), int(L), x), x**2  # βα^M, β = 1, M = 2

    n = state.run_in_process(evaluate)
    contour, fits = state.tables()
    bad = contour[contour["status"] != "converged"]
    for _, row in bad.iterrows():
        print(f"    tol={tol} s_tol={s_tol}: {row['norm']} m/d={row['expansion']} L={row['depth']} "
              f"r*={row['level']:g}: {row['status']} ({row['note']})", flush=True)
    return fits.set_index(["norm", "expansion", "level"])["s"], n


def grid_exponents(exp: dict, runs: Runs, n: int) -> tuple[pd.Series, int]:
    """s per (norm, expansion, level) from an ``n``-point α log-grid (isorank's grid method)."""
    from analysis.study.fig5 import isorank_table

    lo, hi = exp["contour"]["bracket"]
    alphas = [float(f"{a:.10g}") for a in np.geomspace(lo, hi, n)]
    rows = [{"norm": norm, "expansion": e, "depth": int(L), "alpha": a, "beta_eff": 1.0, "matrices": 2,
             "erank_io": runs(norm, float(e), int(L), a)}
            for norm, e, L in itertools.product(*exp["axes"].values()) for a in alphas]
    slopes, _ = isorank_table(pd.DataFrame(rows), "erank_io", list(exp["contour"]["levels"]),
                              ["norm", "expansion"])
    return slopes["slope_ratio"], len(rows)


def first_within(results: list[tuple[str, pd.Series, int]], ref: pd.Series, within: float):
    """Print each setting's runs and worst |s − s_ref|; the runs of the first setting from which
    on every one is within ``within`` (a grid's error is not monotone in its size: one lucky
    size that lands near the crossings is no precision a user can choose)."""
    best, oks = None, []
    for label, s, n in results:
        err = (s.reindex(ref.index) - ref).abs()
        worst = float(err.max()) if err.notna().all() else float("inf")
        oks.append((worst <= within, n))
        key = err.idxmax() if err.notna().any() else "?"
        print(f"  {label:<16} {n:>5} runs   max |s − s_ref| = {worst:.4f} at {key}{'  ✓' if oks[-1][0] else ''}",
              flush=True)
    for k in range(len(oks)):
        if all(ok for ok, _ in oks[k:]):
            best = oks[k][1]
            break
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="cpu", choices=["smoke", "cpu", "full"])
    p.add_argument("--s-tols", default="0.04,0.02,0.005",
                   help="also these exponent tolerances (hydra.sweeper.contour.s_tol) beside the "
                   "experiment's own, which the ratio is judged on")
    p.add_argument("--tols", default="0.4,0.1", help="also plain bracketing to these widths, "
                   "no warm start (the sweeper before s_tol/warm)")
    p.add_argument("--cache", type=Path, default=Path(".cache/bench-contour.json"),
                   help="measurements kept between runs ('' for none)")
    p.add_argument("--ref-tol", type=float, default=0.002)
    p.add_argument("--grids", default="5,9,10,11,12,13,14,15,16,17,33,65",
                   help="α grid sizes; the grid's count is the smallest from which every larger one is within")
    p.add_argument("--within", type=float, default=0.01)
    p.add_argument("--norm", default=None, help="only these placements (comma-separated)")
    args = p.parse_args()
    torch.set_num_threads(1)
    exp = experiment(args.size)
    if args.norm:
        exp["axes"]["norm"] = args.norm.split(",")
    runs = Runs(exp["width"], exp["seeds"], args.cache if str(args.cache) else None)
    t0 = time.perf_counter()
    ref, n_ref = contour_exponents(exp, runs, args.ref_tol)
    print(f"tab4_contour size={args.size}: d={exp['width']}, {exp['seeds']} seeds, axes {exp['axes']}, "
          f"levels {exp['contour']['levels']}, α ∈ {exp['contour']['bracket']}")
    print(f"reference: contour at tol={args.ref_tol} ({n_ref} runs); s_ref =")
    print(ref.unstack("level").round(4).to_string(), flush=True)
    # one measurement per distinct config, shared; each method counts the runs its sweep has
    own = float(exp["contour"]["s_tol"])
    cont = [(f"contour s_tol={own:g}", *contour_exponents(exp, runs, None, own))]
    more = [(f"contour s_tol={t}", *contour_exponents(exp, runs, None, float(t)))
            for t in args.s_tols.split(",") if t and float(t) != own]
    plain = [(f"bracket tol={t}", *contour_exponents(exp, runs, float(t))) for t in args.tols.split(",") if t]
    grid = [(f"grid n={n}", *grid_exponents(exp, runs, int(n))) for n in args.grids.split(",")]
    print(f"runs to reach every s within ±{args.within} of s_ref:")
    c = first_within(cont, ref, args.within)
    first_within(more, ref, args.within)
    first_within(plain, ref, args.within)
    g = first_within(grid, ref, args.within)
    runs.save()
    most = max(n for _, _, n in grid)
    ratio = (f"{g / c:.1f}×" if c and g else
             f"> {most / c:.1f}× (no grid up to {most} runs gets there)" if c else
             "n/a (the contour never got there: a smaller s_tol)")
    print(f"contour (the experiment's s_tol={own:g}) {c} runs, grid {g} runs (within from that "
          f"size on): the grid needs {ratio} the runs of the contour "
          f"(target ≥ 4×); {len(runs.cache)} distinct configs measured in "
          f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
