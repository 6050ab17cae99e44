"""Jacobian spectrum: Var(λ) = L(v_W + v_D): the command ``mf_spectrum``, the claims and the
registry entry."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from rankexp import theory

from ..core import style
from ..core.claims import Check, Measured, NotRun
from ..core.runner import out_dir
from ..core.select import load, only, ordered
from ..core.style import save, to_markdown, write_text
from . import arrays, claim, entry, newest, standard_error, worst


def spectrum_rows(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (activation, init, L): Var(λ) measured, L(v_W + v_D), s.e. and the finite-width
    bias L²/n (the order of the 1/n corrections to the free-probability limit)."""
    d = newest(df, ["activation", "init", "depth"])
    return pd.DataFrame({
        "activation": d["activation"], "init": d["init"], "depth": d["depth"].astype(int),
        "measured": d["lambda_var"], "theory": d["lambda_var_theory"],
        "se": standard_error(d["lambda_var_std"], d["seeds"]),
        "bias": d["depth"].astype(float) ** 2 / d["width"].astype(float)})


SPECTRUM_ORDER = ["linear", "relu", "tanh"]


def spectrum_table(df: pd.DataFrame) -> pd.DataFrame:
    """Var(λ) measured (mean ± std over seeds, newest run per cell) beside L(v_W + v_D)."""
    d = newest(df, ["activation", "init", "depth"])
    t = d.set_index(["activation", "init", "depth"])[
        ["lambda_var", "lambda_var_std", "lambda_var_theory", "v_d_measured", "v_d_theory",
         "spectrum_q0", "seeds", "width"]].sort_index()
    theory_var = t["lambda_var_theory"].where(t["lambda_var_theory"] > 1e-12)  # 0: no ratio
    t["ratio"] = t["lambda_var"] / theory_var
    return t


#: |Var(λ)| below this is float round-off (an orthogonal linear chain's λ are all 1): shown as 0
ROUNDOFF = 1e-9


def var_text(v: float, digits: int = 3) -> str:
    """Var(λ) as text: round-off (|v| < :data:`ROUNDOFF`) is 0, never −1.11e-16 or −0."""
    return "0" if abs(v) < ROUNDOFF else f"{v:.{digits}g}"


def spectrum_markdown(t: pd.DataFrame) -> str:
    """The textbook's layout: rows activation × init, one column pair per L."""
    rows = pd.MultiIndex.from_product([ordered(t.index.get_level_values(0), SPECTRUM_ORDER),
                                       ["gaussian", "orthogonal"]], names=["activation", "init"])
    cells = {}
    for d, g in t.groupby(level="depth"):
        g = g.droplevel("depth").reindex(rows)
        pairs = zip(g["lambda_var"], g["lambda_var_std"], strict=True)
        cells[f"L={d} measured"] = [f"{var_text(m, 4)} ± {var_text(s, 2)}" if pd.notna(m) else "—"
                                    for m, s in pairs]
        cells[f"L={d} L(v_W+v_D)"] = [var_text(v, 4) if pd.notna(v) else "—"
                                      for v in g["lambda_var_theory"]]
    return to_markdown(pd.DataFrame(cells, index=rows))


def _spectrum_main(args: argparse.Namespace) -> list[Path]:
    df = load(args, ["activation", "init", "lambda_var", "lambda_var_theory"])
    t = spectrum_table(df)
    out = out_dir(args)
    write_text(out / "mf_spectrum.md", spectrum_markdown(t))
    d = newest(df, ["activation", "init", "depth"])
    acts = ordered(d["activation"], SPECTRUM_ORDER)
    inits = ["gaussian", "orthogonal"]
    fig, axes = style.grid(len(acts), 2, aspect=0.45)
    for i, act in enumerate(acts):
        for j, init in enumerate(inits):
            ax = axes[i, j]
            cell = d[(d["activation"] == act) & (d["init"] == init)].sort_values("depth")
            for k, (_, r) in enumerate(cell.iterrows()):
                a = arrays(args.uri, r["run_id"])
                ax.stairs(a["log_lambda_hist"], a["log_lambda_edges"], color=f"C{k}",
                          label=rf"$L$={int(r['depth'])}: Var$(\lambda)$={var_text(r['lambda_var'])} "
                                rf"(theory {var_text(r['lambda_var_theory'])})")
            ax.set_title(f"{act}, {init}", fontsize=9)
            ax.set(xlabel=r"$\log_{10}\lambda$", ylabel="density")
            if len(cell):
                ax.legend(fontsize=7)
    fig.suptitle(r"Squared singular values $\lambda$ of $\partial h_L/\partial h_0$ (mean 1); "
                 r"free probability: Var$(\lambda) = L\,(v_W + v_D)$")
    style.caption(fig, df, args.experiment)
    return save(fig, out, "mf_spectrum", t)


def spectrum_row_claim(activation: str, init: str) -> Callable[[pd.DataFrame], Measured]:
    def measure(rows: pd.DataFrame) -> Measured:
        sub = rows[(rows["activation"] == activation) & (rows["init"] == init)]
        return worst(sub, lambda r: f"L = {r['depth']:g}")

    return measure


def critical_tanh(df: pd.DataFrame) -> Measured:
    """The tanh runs' (σ_w², σ_b²) and the q* they used: max of |χ₁(σ_w², q*) − 1|,
    |64 q* − 1| and |q(q*) − q*|/q* (q ↦ the length map 215.1) — 0 at the critical point
    ``tanh_critical_point(1/64)``."""
    t = only(df, activation="tanh")
    if "spectrum_q0" not in t:
        raise NotRun("the tanh runs logged no spectrum_q0 (the q* they used)")
    worst_dev, where = -1.0, ""
    for _, r in t.iterrows():
        sw2, sb2, q = float(r["alpha"]) ** 2, float(r["bias"]) ** 2, float(r["spectrum_q0"])
        devs = {"|χ₁ − 1|": abs(theory.chi_1("tanh", sw2, q) - 1), "|64 q* − 1|": abs(64 * q - 1),
                "|q(q*) − q*|/q*": abs(float(theory.length_map(q, "tanh", sw2, sb2)) - q) / q}
        k = max(devs, key=devs.get)
        if devs[k] > worst_dev:
            worst_dev, where = devs[k], f"{k} at σ_w² = {sw2:.13g}, σ_b² = {sb2:.6g}, q* = {q:.6g}"
    return Measured(worst_dev, math.nan, where)


_SPECTRUM_ROWS = [("linear", "gaussian", "L (Fuss–Catalan: exactly L)"), ("linear", "orthogonal", "0"),
                  ("relu", "gaussian", "2L"), ("relu", "orthogonal", "L"),
                  ("tanh", "gaussian", "L(1 + v_D)"), ("tanh", "orthogonal", "L v_D (→ 0 as q* → 0)")]

MF_SPECTRUM = tuple(
    claim(f"mf_spectrum.var_{act}_{init}",
           f"{act}, {init} weights: Var(λ) of ∂h_L/∂h_0 (λ normalized to mean 1) = L(v_W + v_D)",
           "the chapter, 215.7", study, ("mf_spectrum", spectrum_rows),
           spectrum_row_claim(act, init))
    for act, init, study in _SPECTRUM_ROWS) + (
    claim("mf_spectrum.critical_tanh", "The tanh rows sit at the critical point of q* = 1/64: "
           "χ₁ = 1 and q* the length map's fixed point", "the chapter, 215.3, 215.7",
           "χ₁ = 1, q* = 1/64", "mf_spectrum", critical_tanh,
           Check("≤ 1e-9 (the config's 13 digits)", lambda v: v <= 1e-9), size="smoke"),)

COMMANDS, EXPERIMENTS = entry(
    "mf_spectrum", "Jacobian spectrum: Var(λ) = L(v_W + v_D)", "the chapter, 215.7", MF_SPECTRUM,
    _spectrum_main, "Var(λ) table of ∂h_L/∂h_0 beside L(v_W + v_D), log λ histograms")
