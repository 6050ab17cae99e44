"""Residual ReLU networks: variance and correlation: the command ``mf_residual``, the claims and
the registry entry."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd

from rankexp import theory

from ..core import style
from ..core.claims import Measured, NotRun, Runs
from ..core.runner import out_dir
from ..core.select import load, series
from ..core.style import save
from . import FAMILY, claim, entry, family, log_walk, newest, seed_array, standard_error, worst


def residual_table(df: pd.DataFrame, uri: str | None, se: bool = False) -> pd.DataFrame:
    """Long table per (β scaling, L, l): measured q_l, c_l; (1+β²)^l q_0; the residual map; the
    ODE limit at t = l/L with τ = β²L; with ``se``: also n, q_0 and the s.e. of q_l and c_l."""
    rows = []
    for _, r in newest(df, ["beta_scaling", "depth", "width"]).iterrows():
        depth, beta = int(r["depth"]), float(r["beta_eff"])
        steps, q = series(uri, r["run_id"], "mf_q")
        _, c = series(uri, r["run_id"], "mf_c")
        c0, tau = float(c[0]), beta**2 * depth
        row = {"beta_scaling": r["beta_scaling"], "depth": depth, "beta": beta, "layer": steps,
               "t": steps / depth, "q": q, "q_theory": q[0] * (1 + beta**2) ** steps,
               "q_ode": q[0] * np.exp(tau * steps / depth), "c": c,
               "c_map": theory.residual_relu_correlation(c0, depth, beta)[steps],
               "c_ode": theory.residual_relu_correlation_ode(c0, steps / depth, tau)}
        if se:
            seeds = int(r["seeds"])
            row |= {"width": float(r["width"]), "q0": float(q[0])}
            for k, v in (("q", q), ("c", c)):
                std = series(uri, r["run_id"], f"mf_{k}_std")[1] if seeds > 1 else np.nan * v
                row[f"{k}_se"] = standard_error(std, seeds)
        rows.append(pd.DataFrame(row))
    return pd.concat(rows, ignore_index=True)


def _residual(runs: Runs) -> pd.DataFrame:
    return residual_table(runs("mf_residual"), runs.uri, se=True)


def residual_walk(scaling: str, depth: int, beta: float, width: float, q: np.ndarray,
                  c: np.ndarray) -> pd.DataFrame:
    """Per layer ≥ 1: :func:`~analysis.meanfield.log_walk` of the seeds' q_l against
    q_0 (1 + β²)^l (``q_*``; a step's factor stays correlated over ~1/β² layers: the share of
    q in relu(h) relaxes at rate β²) and of their 1 − c_l against the residual map (``gap_*``)."""
    steps = np.arange(depth + 1)
    qw = log_walk(q / q[:, :1], (1 + beta**2) ** steps, memory=4 / beta**2)
    cw = log_walk(1 - c, 1 - theory.residual_relu_correlation(float(c[0, 0]), depth, beta))
    cols = {f"{p}_{k}": v for p, w in (("q", qw), ("gap", cw)) for k, v in w.items()
            if k != "layer"}
    return pd.DataFrame({"layer": qw["layer"], **cols}).assign(
        beta_scaling=scaling, depth=depth, beta=beta, width=width)


def _residual_seeds(runs: Runs) -> pd.DataFrame:
    df = newest(runs("mf_residual"), ["beta_scaling", "depth", "width"])
    return pd.concat([residual_walk(r["beta_scaling"], int(r["depth"]), float(r["beta_eff"]),
                                    float(r["width"]), seed_array(runs, r["run_id"], "mf_q"),
                                    seed_array(runs, r["run_id"], "mf_c"))
                      for _, r in df.iterrows()], ignore_index=True)


def _residual_main(args: argparse.Namespace) -> list[Path]:
    df = load(args, ["beta_scaling", "beta_eff", "mf_q", "mf_c"])
    t = residual_table(df, args.uri)
    fig, axes = style.panels(3, aspect=0.95)
    for k, ((scaling, depth), g) in enumerate(t.groupby(["beta_scaling", "depth"])):
        col = f"C{k}"
        lab = rf"$\beta$ = {'1' if scaling == 'const' else '1/√L'}, $L$ = {depth}"
        axes[0].semilogy(g["layer"], g["q"], "o", ms=2.5, color=col, label=lab)
        axes[0].semilogy(g["layer"], g["q_theory"], "-", color=col, lw=0.8)
        if scaling == "inv_sqrt_depth":
            axes[1].plot(g["t"], g["q"], "o", ms=2.5, color=col, label=lab)
        axes[2].plot(g["t"], g["c"], "o", ms=2.5, color=col, label=lab)
        axes[2].plot(g["t"], g["c_map"], "-", color=col, lw=0.8)
    tt = np.linspace(0, 1, 200)
    q0 = float(t["q"].iloc[0]) if len(t) else 1.0
    axes[1].plot(tt, q0 * np.exp(tt), "k--", lw=1, label=r"ODE limit $q_0 e^{t}$")
    inv = t[t["beta_scaling"] == "inv_sqrt_depth"]
    if len(inv):
        c0 = float(inv["c"].iloc[0])
        axes[2].plot(tt, theory.residual_relu_correlation_ode(c0, tt, 1.0), "k--", lw=1.2,
                     label=r"ODE $\dot c = f(c)-c$ ($\beta^2 L$ = 1)")
    for ax, x, y, title in zip(
            axes, (r"layer $\ell$", r"$t = \ell/L$", r"$t = \ell/L$"),
            (r"stream variance $q_\ell$", r"$q_\ell$", r"correlation $c_\ell$"),
            (r"lines: $q_0(1+\beta^2)^\ell$", r"$\beta = 1/\sqrt{L}$: $(1+1/L)^{tL} \to e^{t}$",
             r"lines: residual map $c \mapsto (c + \beta^2 f(c))/(1+\beta^2)$"), strict=True):
        ax.set(xlabel=x, ylabel=y)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(r"Residual ReLU networks: variance $(1+\beta^2)^L$ and the depth limit $\beta^2 L = O(1)$")
    style.caption(fig, df, args.experiment, ["ReLU, $\\sigma_w^2$ = 2, $c_0$ = 0.5"])
    return save(fig, out_dir(args), "mf_residual", t)


def _run(r) -> str:
    return f"β = {'1' if r['beta_scaling'] == 'const' else '1/√L'}, L = {r['depth']:g}, l = {r['layer']:g}"


def _walk(t: pd.DataFrame, prefix: str) -> pd.DataFrame:
    return t.rename(columns={f"{prefix}_{k}": k for k in ("log_ratio", "se", "df")})


def residual_variance(t: pd.DataFrame) -> Measured:
    """log E(q_L/q_0) vs L log(1 + β²) (every run, last layer; :func:`~analysis.meanfield.family`:
    the product of L factors is log-normal, not normal); bias 2β²L/n: the law is the n → ∞
    one, and at width n the factors 1 + 2β² ⟨relu(h)²⟩/q_l are correlated across layers."""
    last = _walk(t[t["layer"] == t["depth"]], "q")
    return family(last.assign(bias=2 * last["beta"] ** 2 * last["depth"] / last["width"]), _run)


def _deepest_inv(t: pd.DataFrame) -> pd.DataFrame:
    """The last layer of the deepest β = 1/√L run."""
    inv = t[(t["beta_scaling"] == "inv_sqrt_depth") & (t["layer"] == t["depth"])]
    if inv.empty:
        raise NotRun("no β = 1/√L runs")
    return inv[inv["depth"] == inv["depth"].max()]


def residual_variance_e(t: pd.DataFrame) -> Measured:
    """β = 1/√L, deepest L: q_L/q_0 → e; bias |(1 + 1/L)^L − e| (≈ e/(2L), the finite-L term)."""
    deep = _deepest_inv(t)
    rows = deep.assign(measured=deep["q"] / deep["q0"], theory=math.e, se=deep["q_se"] / deep["q0"],
                       bias=((1 + deep["beta"] ** 2) ** deep["layer"] - math.e).abs())
    return worst(rows, _run)


def residual_correlation(t: pd.DataFrame) -> Measured:
    """log E(1 − c_l) vs log(1 − c_l) of the residual map c ↦ (c + β² f(c))/(1 + β²), every run
    and layer (:func:`~analysis.meanfield.family`); bias 2/n (the cosine of two n-vectors is
    biased at O(1/n))."""
    return family(_walk(t, "gap").assign(bias=2 / t["width"]), _run)


def residual_ode(t: pd.DataFrame) -> Measured:
    """β = 1/√L, deepest L, l = L: c_L vs the ODE dc/dt = β²L (f(c) − c) at t = 1; bias = the
    map's own distance from the ODE there (O(1/L)) + 1/n."""
    deep = _deepest_inv(t)
    rows = deep.assign(measured=deep["c"], theory=deep["c_ode"], se=deep["c_se"],
                       bias=(deep["c_map"] - deep["c_ode"]).abs() + 1 / deep["width"])
    return worst(rows, _run)


MF_RESIDUAL = (
    claim("mf_residual.variance", "Residual ReLU nets: the stream variance grows like "
           "(1 + β²)^L", "the chapter (residual networks)", "(1 + β²)^L",
           _residual_seeds, residual_variance, FAMILY),
    claim("mf_residual.variance_e", "With β = 1/√L the depth limit is well defined: the "
           "variance ratio → e", "the chapter (residual networks)", "e",
           _residual, residual_variance_e),
    claim("mf_residual.correlation", "The correlation trajectory follows the residual map "
           "c ↦ (c + β² f(c))/(1 + β²)", "the chapter (residual networks)", "residual map",
           _residual_seeds, residual_correlation, FAMILY),
    claim("mf_residual.ode", "With β²L = 1 the trajectory reaches its L → ∞ ODE limit "
           "dc/dt = f(c) − c", "the chapter (residual networks)", "ODE at t = 1",
           _residual, residual_ode))

COMMANDS, EXPERIMENTS = entry(
    "mf_residual", "Residual ReLU networks: variance and correlation",
    "the chapter (residual networks)", MF_RESIDUAL, _residual_main,
    "residual ReLU: stream variance vs (1+β²)^l, correlation vs the map and its ODE limit")
