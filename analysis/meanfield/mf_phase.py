"""Phase diagram: χ₁ and ξ_c over (σ_w², σ_b²): the command ``mf_phase``, the claims and the
registry entry."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colors

from rankexp import theory

from ..core import style
from ..core.claims import Measured, NotRun, at_most
from ..core.registry import Needs
from ..core.runner import out_dir
from ..core.select import load
from ..core.style import save, to_markdown, write_text
from . import claim, edges, entry, newest, standard_error, worst

PHASE_COLUMNS = ["alpha", "bias", "chi1", "chi1_theory", "chi_c", "chi_c_theory", "xi_c",
                 "xi_c_theory", "xi_c_fit", "xi_c_fit_theory"]


def phase_table(df: pd.DataFrame) -> pd.DataFrame:
    """Mean over runs per (σ_w², σ_b²) of the correlation probe's χ and ξ_c, measured and theory."""
    d = df.assign(sigma_w2=(df["alpha"] ** 2).round(12), sigma_b2=(df["bias"] ** 2).round(12))
    cols = [c for c in PHASE_COLUMNS[2:] if c in d]
    t = d.groupby(["sigma_w2", "sigma_b2"])[cols].mean()
    t["runs"] = d.groupby(["sigma_w2", "sigma_b2"]).size()
    return t


def theory_depth_scale_grid(sw2: np.ndarray, sb2: np.ndarray, activation: str = "tanh") -> np.ndarray:
    """ξ_c of :func:`rankexp.theory.correlation_depth_scale` on the grid ``(len(sb2), len(sw2))``."""
    out = np.full((len(sb2), len(sw2)), np.nan)
    for i, b in enumerate(sb2):
        for j, w in enumerate(sw2):
            try:
                out[i, j] = theory.correlation_depth_scale(activation, float(w), float(b)).xi_c
            except ValueError:
                pass
    return out


def draw_phase(table: pd.DataFrame, resolution: int):
    sw2 = np.sort(table.index.get_level_values("sigma_w2").unique().to_numpy())
    sb2 = np.sort(table.index.get_level_values("sigma_b2").unique().to_numpy())
    grid = {k: table[k].unstack("sigma_w2").reindex(index=sb2, columns=sw2).to_numpy()
            for k in ("chi1", "xi_c") if k in table}
    xe, ye = np.clip(edges(sw2), 0, None), np.clip(edges(sb2), 0, None)
    fine_b = np.linspace(ye[0], ye[-1], 200)
    crit = theory.tanh_critical_line(fine_b)
    tw = np.linspace(max(xe[0], 1e-3), xe[-1], resolution)
    tb = np.linspace(ye[0], ye[-1], max(2, resolution * 2 // 3))
    xi_theory = theory_depth_scale_grid(tw, tb)
    fig, axes = style.panels(3, aspect=0.9)
    panels = (("chi1", r"measured $\chi_1$", colors.TwoSlopeNorm(1.0, vmin=min(0.5, np.nanmin(grid["chi1"])),
                                                                vmax=max(1.5, np.nanmax(grid["chi1"]))), "RdBu_r"),
              ("xi_c", r"measured $\xi_c = -1/\ln\chi_c$ (layers)",
               colors.LogNorm(vmin=1, vmax=max(10.0, np.nanmax(np.clip(grid["xi_c"], 1, 1e3)))), "viridis"))
    for ax, (key, title, norm, cmap) in zip(axes[:2], panels, strict=True):
        vals = np.clip(grid[key], 1, 1e3) if key == "xi_c" else grid[key]
        mesh = ax.pcolormesh(xe, ye, vals, norm=norm, cmap=cmap, shading="flat")
        fig.colorbar(mesh, ax=ax, label=title.split(" (")[0].replace("measured ", ""))
        ax.plot(crit, fine_b, "k-", lw=2, label=r"critical line $\chi_1 = 1$")
        cs = ax.contour(tw, tb, xi_theory, levels=[2, 5, 10, 20, 50], colors="w", linewidths=0.8,
                        linestyles="--")
        ax.clabel(cs, fmt=lambda v: rf"$\xi_c$={v:g}", fontsize=7)
        ax.set(xlim=(xe[0], xe[-1]), ylim=(ye[0], ye[-1]), xlabel=r"$\sigma_w^2$",
               ylabel=r"$\sigma_b^2$")
        ax.set_title(title + "\n(dashed: theory $\\xi_c$ contours)", fontsize=9)
    axes[0].legend(loc="upper left", fontsize=7)
    ax = axes[2]
    ok = np.isfinite(table["xi_c_theory"]) & (table["xi_c_theory"] < 1e5)
    ax.loglog(table.loc[ok, "xi_c_theory"], table.loc[ok, "xi_c"], "o", ms=4,
              label=r"$-1/\ln\chi_c$ measured")
    if "xi_c_fit" in table:
        ax.loglog(table.loc[ok, "xi_c_fit_theory"], table.loc[ok, "xi_c_fit"], "x", ms=4,
                  label=r"fit of $c_\ell$ (vs the same fit of the iterated map)")
    lim = [1, max(10.0, float(np.nanmax(table.loc[ok, "xi_c_theory"])) if ok.any() else 10.0)]
    ax.plot(lim, lim, "k-", lw=0.8, label="measured = theory")
    ax.set(xlabel=r"theory $\xi_c$", ylabel=r"measured $\xi_c$")
    ax.set_title(r"depth scale: measured vs theory", fontsize=9)
    ax.legend(fontsize=7)
    fig.suptitle(r"Phase diagram of plain tanh networks: order ($\chi_1<1$) and chaos ($\chi_1>1$)")
    return fig


def _phase_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--theory-resolution", type=int, default=24,
                   help="σ_w² points of the theory ξ_c contour grid (default 24)")


def _phase_main(args: argparse.Namespace) -> list[Path]:
    df = load(args, PHASE_COLUMNS)
    table = phase_table(df)
    out = out_dir(args)
    fig = draw_phase(table, args.theory_resolution)
    style.caption(fig, df, args.experiment, ["tanh, two inputs at $c_0$ = 0.5"])
    write_text(out / "mf_phase.md", to_markdown(table))
    return save(fig, out, "mf_phase", table)


def phase_rows(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (σ_w², σ_b²): χ₁, χ_c, ξ_c measured and theory, their s.e., n and L."""
    d = newest(df, ["alpha", "bias"])
    return pd.DataFrame({
        "sigma_w2": d["alpha"].astype(float) ** 2, "sigma_b2": d["bias"].astype(float) ** 2,
        "chi1": d["chi1"], "chi1_theory": d["chi1_theory"], "chi1_se": standard_error(d["chi1_std"], d["seeds"]),
        "chi_c": d["chi_c"], "chi_c_se": standard_error(d["chi_c_std"], d["seeds"]), "xi_c": d["xi_c"],
        "xi_c_theory": d["xi_c_theory"], "width": d["width"].astype(float),
        "depth": d["depth"].astype(float)})


def _cell(r) -> str:
    return f"σ_w² = {r['sigma_w2']:.3g}, σ_b² = {r['sigma_b2']:.3g}"


def phase_chi1(t: pd.DataFrame) -> Measured:
    """χ₁ (215.3) measured vs theory at every cell; bias χ₁/n (the 1/n fluctuation of q_l
    around q* that the layer average inherits)."""
    rows = t.assign(measured=t["chi1"], theory=t["chi1_theory"], se=t["chi1_se"],
                    bias=t["chi1_theory"].abs() / t["width"]).dropna(subset=["theory"])
    return worst(rows, _cell)


def phase_sides(t: pd.DataFrame) -> Measured:
    """Cells on the wrong side of the critical line: sign(χ₁ − 1) ≠ sign(χ₁_theory − 1), among
    the cells whose theory χ₁ is farther from 1 than the allowance 3 s.e. + χ₁/n."""
    allowance = 3 * t["chi1_se"] + t["chi1_theory"].abs() / t["width"]
    decided = t[(t["chi1_theory"] - 1).abs() > allowance]
    if decided.empty:
        raise NotRun("no cell whose theory χ₁ is clear of 1 by more than its allowance")
    wrong = decided[np.sign(decided["chi1"] - 1) != np.sign(decided["chi1_theory"] - 1)]
    note = f"{len(wrong)} of {len(decided)} cells on the wrong side"
    if len(wrong):
        note += f" (e.g. {_cell(wrong.iloc[0])}: χ₁ = {wrong.iloc[0]['chi1']:.3g})"
    return Measured(float(len(wrong)), math.nan, note)


#: the probe averages χ_c over l ≥ L/2, which must sit at the fixed point c*: c_l − c* shrinks
#: like e^{−l/ξ_c}, so ξ_c ≤ L/(2 ln 50) leaves at most 2 % of the input's offset there
XI_RESOLVED = 2 * math.log(50)


def phase_xi(t: pd.DataFrame) -> Measured:
    """ξ_c = −1/ln χ_c (215.4) measured vs theory where theory ξ_c ≤ L/(2 ln 50)
    (:data:`XI_RESOLVED`); s.e. ξ²·s.e.(χ_c)/χ_c, bias ξ²/n."""
    ok = t[(t["xi_c_theory"] <= t["depth"] / XI_RESOLVED) & (t["chi_c"] > 0)]
    xi = ok["xi_c_theory"]
    rows = ok.assign(measured=ok["xi_c"], theory=xi, se=xi**2 * ok["chi_c_se"] / ok["chi_c"],
                     bias=xi**2 / ok["width"])
    return worst(rows, _cell, " layers")


PHASE = ("mf_phase", phase_rows)

MF_PHASE = (
    claim("mf_phase.chi1", "χ₁ = σ_w² E[φ′(√q* z)²] is the mean squared singular value of a "
           "layer Jacobian (tanh, every (σ_w², σ_b²))", "the chapter, 215.3", "χ₁ theory",
           PHASE, phase_chi1),
    claim("mf_phase.sides", "Ordered where χ₁ < 1, chaotic where χ₁ > 1: every cell is on the "
           "side of the critical line the theory puts it", "the chapter, 215.3", "0 cells",
           PHASE, phase_sides, at_most(0)),
    claim("mf_phase.xi_c", "The depth scale ξ_c = −1/ln χ_c (tanh, cells with ξ_c ≤ L/(2 ln 50))",
           "the chapter, 215.4", "ξ_c theory", PHASE, phase_xi))

COMMANDS, EXPERIMENTS = entry(
    "mf_phase", "Phase diagram: χ₁ and ξ_c over (σ_w², σ_b²)", "the chapter, 215.1–215.4",
    MF_PHASE, _phase_main,
    "phase diagram: measured χ₁ and ξ_c over (σ_w², σ_b²), critical line and ξ_c contours",
    arguments=_phase_arguments, needs=Needs(gpu_full=True))
