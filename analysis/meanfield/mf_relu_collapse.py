"""Critical ReLU: polynomial correlation collapse: the command ``mf_relu_collapse``, the claims and
the registry entry."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from rankexp import theory

from ..core import style
from ..core.claims import Measured, Runs
from ..core.runner import out_dir
from ..core.select import load, series
from ..core.style import plain_log_ticks, save
from . import FAMILY, claim, entry, family, log_walk, newest, seed_array, standard_error, worst

C0 = "task.options.correlation.c0"


def relu_collapse_table(df: pd.DataFrame, uri: str | None) -> pd.DataFrame:
    """Long table per (c_0, l): measured 1 − c_l (seed mean, std), the exact critical ReLU map
    iterated from c_0 (:func:`rankexp.theory.relu_correlation_iterates`) and 9π²/(2l²)."""
    rows = []
    for _, r in newest(df, [C0, "width", "depth"]).iterrows():
        steps, c = series(uri, r["run_id"], "mf_c")
        _, sd = series(uri, r["run_id"], "mf_c_std") if r.get("seeds", 1) > 1 else (steps, 0 * c)
        exact = theory.relu_correlation_iterates(float(r[C0]), int(steps.max()))[steps]
        rows.append(pd.DataFrame({"c0": r[C0], "width": r["width"], "layer": steps,
                                  "gap": 1 - c, "gap_std": sd, "gap_exact": 1 - exact,
                                  "gap_asymptote": theory.relu_correlation_gap(np.maximum(steps, 1))}))
    t = pd.concat(rows, ignore_index=True)
    t["ratio_exact"] = t["gap_exact"] / t["gap_asymptote"]
    t["ratio_measured"] = t["gap"] / t["gap_asymptote"]
    return t[t["layer"] >= 1]


def relu_rows(t: pd.DataFrame, seeds: int) -> pd.DataFrame:
    """:func:`~analysis.meanfield.figures.relu_collapse_table` with the s.e. of 1 − c_l."""
    return t.assign(se=standard_error(t["gap_std"], np.full(len(t), seeds)))


def _relu(runs: Runs) -> pd.DataFrame:
    df = runs("mf_relu_collapse")
    return relu_rows(relu_collapse_table(df, runs.uri), int(df["seeds"].min()))


def _relu_main(args: argparse.Namespace) -> list[Path]:
    df = load(args, [C0, "mf_c"])
    t = relu_collapse_table(df, args.uri)
    fig, axes = style.panels(2, width=style.TWO_COLUMN, aspect=0.7)
    for i, ((c0, width), g) in enumerate(t.groupby(["c0", "width"])):
        col = f"C{i}"
        lab = rf"$c_0$ = {c0:g}" + (f", $n$ = {width:g}" if t["width"].nunique() > 1 else "")
        axes[0].plot(g["layer"], g["gap"], "o", ms=2.5, color=col, label=f"measured, {lab}")
        axes[0].fill_between(g["layer"], np.clip(g["gap"] - g["gap_std"], 1e-12, None),
                             g["gap"] + g["gap_std"], color=col, alpha=0.15, lw=0)
        axes[0].plot(g["layer"], g["gap_exact"], "-", color=col, lw=1)
        axes[1].plot(g["layer"], g["ratio_exact"], "-", color=col, label=f"exact map, {lab}")
        axes[1].plot(g["layer"], g["ratio_measured"], "o", ms=3, color=col, alpha=0.6)
    lay = np.sort(t["layer"].unique())
    axes[0].plot(lay, theory.relu_correlation_gap(lay), "k--", lw=1.2, label=r"$9\pi^2/(2\ell^2)$")
    axes[0].set(xscale="log", yscale="log", xlabel=r"layer $\ell$", ylabel=r"$1-c_\ell$")
    axes[0].set_title(r"critical ReLU ($\sigma_w^2=2$): lines = exact map $f$ iterated from $c_0$",
                      fontsize=9)
    axes[0].legend(fontsize=7)
    axes[1].axhline(1, color="k", lw=0.8)
    axes[1].set(xscale="log", xlabel=r"layer $\ell$", ylabel=r"$(1-c_\ell)\,/\,(9\pi^2/2\ell^2)$")
    axes[1].set_title("ratio to the asymptote (→ 1; markers: measured)", fontsize=9)
    axes[1].legend(fontsize=7)
    for ax in axes:
        plain_log_ticks(ax, "x")
    fig.suptitle("Polynomial collapse of the correlation in critical ReLU networks")
    style.caption(fig, df, args.experiment, ["bands: ±1 s.d. over seeds"])
    return save(fig, out_dir(args), "mf_relu_collapse", t)


def relu_walk(c0: float, width: float, c: np.ndarray) -> pd.DataFrame:
    """Per layer ≥ 1: :func:`~analysis.meanfield.log_walk` of the seeds' 1 − c_l ``(seeds, L+1)``
    against the exact map iterated from c_0."""
    exact = theory.relu_correlation_iterates(c0, c.shape[1] - 1)
    return pd.DataFrame(log_walk(1 - c, 1 - exact)).assign(c0=c0, width=width)


def _relu_seeds(runs: Runs) -> pd.DataFrame:
    df = newest(runs("mf_relu_collapse"), [C0, "width", "depth"])
    return pd.concat([relu_walk(float(r[C0]), float(r["width"]),
                                seed_array(runs, r["run_id"], "mf_c"))
                      for _, r in df.iterrows()], ignore_index=True)


def relu_exact_map(t: pd.DataFrame) -> Measured:
    """log E(1 − c_l) vs log(1 − f^l(c_0)), the exact critical-ReLU map, every run and layer
    (:func:`~analysis.meanfield.family`); bias 2/n (the O(1/n) finite-width term: the map is
    the n → ∞ law)."""
    return family(t.assign(bias=2 / t["width"]), lambda r: f"c_0 = {r['c0']:g}, l = {r['layer']:g}")


def relu_asymptote(t: pd.DataFrame) -> Measured:
    """(1 − c_L)/(9π²/(2L²)) at the last layer vs 1; bias = the exact map's own distance from
    the asymptote at that layer, |(1 − f^L(c_0))/(9π²/(2L²)) − 1| (the next order of the
    expansion: 0.11–0.21 at L = 200)."""
    last = t[t["layer"] == t.groupby("c0")["layer"].transform("max")]
    rows = last.assign(measured=last["ratio_measured"], theory=1.0,
                       se=last["se"] / last["gap_asymptote"], bias=(last["ratio_exact"] - 1).abs())
    return worst(rows, lambda r: f"c_0 = {r['c0']:g}, l = {r['layer']:g}")


MF_RELU_COLLAPSE = (
    claim("mf_relu_collapse.exact_map", "Critical ReLU (σ_w² = 2): c_l follows the map f(c) = "
           "(√(1−c²) + (π − arccos c)c)/π iterated from c_0", "the chapter (critical ReLU)",
           "f^l(c_0)", _relu_seeds, relu_exact_map, FAMILY),
    claim("mf_relu_collapse.asymptote", "Critical ReLU: 1 − c_l ≈ 9π²/(2l²) (polynomial, not "
           "exponential, collapse)", "the chapter (critical ReLU)", "ratio 1",
           _relu, relu_asymptote))

COMMANDS, EXPERIMENTS = entry(
    "mf_relu_collapse", "Critical ReLU: polynomial correlation collapse",
    "the chapter (critical ReLU)", MF_RELU_COLLAPSE, _relu_main,
    "critical ReLU 1 − c_l vs l against the exact map and 9π²/(2l²)")
