"""Figures 8/9: the branch Jacobian and Marchenko–Pastur: the command ``mp``, the claims and the
registry entry."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd

from rankexp.theory import (
    activation_constants,
    gaussian_product_erank,
    marchenko_pastur_density,
    marchenko_pastur_edges,
)

from ..core import style
from ..core.claims import Claim, Measured, NotRun, Runs, above, at_most, near
from ..core.registry import Experiment
from ..core.runner import Command, out_dir
from ..core.select import PLACEMENT, SelectionError, load, need, ordered, warn_mixed
from ..core.style import save
from ..meanfield import arrays

#: Table 1's row order; activations not listed follow alphabetically.
TABLE1_ORDER = ("abs", "relu", "gelu", "silu", "tanh", "leaky_relu", "swiglu", "linear")


def activation_order(values) -> list[str]:
    return ordered(values, list(TABLE1_ORDER))


MP_COLUMNS = ["erank_branch", "erank_branch_std", "erank_branch_reference", "mp_gamma", "mp_ks",
              "masked_rank", "masked_rank_theory", "mp_zero_fraction", "mp_atom_theory",
              "survival_theory", "survival_measured"]


def mp_table(df: pd.DataFrame) -> pd.DataFrame:
    """Mean branch-Jacobian scalars per (activation, width, expansion), ``threshold_expansion`` =
    1/P(σ′≠0) (where rank(D W_up) reaches d) and ``runs``."""
    keys = ["activation", "width", "expansion"]
    cols = [c for c in MP_COLUMNS if c in df]
    t = df.groupby(keys)[cols].mean()
    t["threshold_expansion"] = [
        1.0 / activation_constants(a, 1.0).survival_rate for a in t.index.get_level_values(0)]
    t["runs"] = df.groupby(keys).size()
    return t


def draw_mp_erank(table: pd.DataFrame, reference_draws: int = 4):
    """erank(J_f)/d vs m/d and vs γ (with the Gaussian-product curve), rank(D W_up)/d vs m/d."""
    acts = activation_order(table.index.get_level_values("activation"))
    widths = sorted(table.index.get_level_values("width").unique())
    colors = {a: f"C{k % 10}" for k, a in enumerate(acts)}
    styles = dict(zip(reversed(widths), ["-", "--", ":", "-."] * 4, strict=False))
    fig, axes = style.panels(3, aspect=0.85)
    for (act, width), g in table.groupby(level=["activation", "width"]):
        g = g.droplevel([0, 1]).sort_index()
        kw = dict(color=colors[act], ls=styles[width], marker="o", ms=2.5)
        err = g["erank_branch_std"] if "erank_branch_std" in g else None
        axes[0].errorbar(g.index, g["erank_branch"], yerr=err, lw=0.9, **kw)
        axes[1].errorbar(g["mp_gamma"], g["erank_branch"], yerr=err, lw=0.9, **kw)
        axes[2].plot(g.index, g["masked_rank"], lw=0.9, **kw)
        if width == widths[-1]:
            axes[0].plot(g.index, g["erank_branch_reference"], color=colors[act], lw=0.7, ls=":")
            axes[2].plot(g.index, g["masked_rank_theory"], color=colors[act], lw=0.7, ls=":")
    d = int(widths[-1])
    gam = np.geomspace(table["mp_gamma"].min() / 1.2, table["mp_gamma"].max() * 1.2, 16)
    ref = [gaussian_product_erank(d, int(round(x * d)), draws=reference_draws, seed=0) for x in gam]
    axes[1].plot(gam, ref, **{**style.THEORY, "ls": "-"},
                 label=rf"Gaussian product $G_2G_1$, inner $\gamma d$ ($d = {d}$)")
    for ax in axes:
        ax.set_xscale("log", base=2)
    for ax, x, y, title in zip(axes, ("expansion", "mp_gamma", "expansion"),
                               ("erank_branch", "erank_branch", "masked_rank"),
                               (r"vs $m/d$ (dotted: reference at each $\gamma$)", r"vs $\gamma$",
                                r"dotted: $\min(1, P(\sigma'\neq 0)\,m/d)$"), strict=True):
        ax.set(xlabel=style.name(x), ylabel=style.name(y), title=title)
    axes[1].legend(fontsize=5.5, loc="lower right")
    # one legend for what colour and line style mean, not one entry per line
    for act in acts:
        axes[2].plot([], [], color=colors[act], marker="o", ms=2.5,
                     label=style.value_label("activation", act))
    for width in widths:
        axes[2].plot([], [], color="0.3", ls=styles[width], label=f"$d = {int(width)}$")
    axes[2].legend(fontsize=5.5, ncol=2, loc="lower right")
    return fig


def mp_histograms(df: pd.DataFrame, uri: str | None, width: int) -> pd.DataFrame:
    """Long table of the logged MP histograms at ``width``, newest run per (σ, m/d): activation,
    expansion, gamma, ks, zero_fraction, atom_theory, run_id, center, density, theory."""
    sub = df[df["width"] == width]
    if "start_time" in sub:
        sub = sub.sort_values("start_time", ascending=False)
    sub = sub.drop_duplicates(["activation", "expansion"])
    parts = []
    for _, r in sub.iterrows():
        z = arrays(uri, r["run_id"])
        if "mp_hist_centers" not in z:
            raise SelectionError(f"arrays.npz of run {r['run_id']} has no mp_hist_centers")
        centers, density = z["mp_hist_centers"], z["mp_hist_density"]
        parts.append(
            pd.DataFrame({"activation": r["activation"], "expansion": r["expansion"],
                          "gamma": r["mp_gamma"], "ks": r["mp_ks"],
                          "zero_fraction": r.get("mp_zero_fraction", np.nan),
                          "atom_theory": r.get("mp_atom_theory", np.nan), "run_id": r["run_id"],
                          "center": centers, "density": density,
                          "theory": marchenko_pastur_density(centers, float(r["mp_gamma"]))}))
    return pd.concat(parts, ignore_index=True)


def draw_mp_histograms(hist: pd.DataFrame, width: int):
    """Rows = activation, columns = m/d; measured histogram (steps) and MP density (line)."""
    acts = activation_order(hist["activation"])
    exps = sorted(hist["expansion"].unique())
    fig, axes = style.grid(len(acts), len(exps), aspect=0.62)
    for i, act in enumerate(acts):
        for j, e in enumerate(exps):
            ax = axes[i, j]
            h = hist[(hist["activation"] == act) & (hist["expansion"] == e)]
            if h.empty:
                ax.set_axis_off()
                continue
            gamma = float(h["gamma"].iloc[0])
            ax.step(h["center"], h["density"], where="mid", color="C0", lw=0.9,
                    label=r"$D W_\mathrm{up}$")
            lo, hi = marchenko_pastur_edges(gamma)
            x = np.linspace(lo + 1e-3 * (hi - lo), hi, 400)
            ax.plot(x, marchenko_pastur_density(x, gamma), **{**style.THEORY, "ls": "-"},
                    label="Marchenko–Pastur")
            # the MP density diverges at 0 when γ = 1: scale to the measured bins instead
            ax.set_ylim(0, 1.15 * max(h["density"].max(), h["theory"].max()))
            for edge in (lo, hi):
                ax.axvline(edge, color="grey", lw=0.5, ls="--")
            ax.grid(False)
            ax.set_title(f"{style.value_label('activation', act)}, $m/d = {e:g}$: "
                         f"$\\gamma = {gamma:.2f}$, KS $= {h['ks'].iloc[0]:.3f}$", fontsize=6.5)
            z, atom = h["zero_fraction"].iloc[0], h["atom_theory"].iloc[0]
            if np.isfinite(z) and (z > 0 or atom > 0):
                ax.text(0.97, 0.9, f"zeros {z:.2f} (MP {atom:.2f})", transform=ax.transAxes,
                        ha="right", fontsize=6)
            if i == len(acts) - 1:
                ax.set_xlabel(r"eigenvalue $\lambda/\bar\lambda$")
            if j == 0:
                ax.set_ylabel("density")
    axes[0, 0].legend(fontsize=5.5)
    fig.suptitle(rf"Gram spectrum of $D W_\mathrm{{up}}$ vs Marchenko–Pastur "
                 rf"(dashed: edges), $d = {width}$")
    return fig


def _mp_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--width", type=int, default=None,
                   help="width d of the histogram grid (default: the largest width run)")
    p.add_argument("--reference-draws", type=int, default=4,
                   help="Monte Carlo draws per point of the Gaussian-product curve (default 4)")


def _mp_main(args: argparse.Namespace) -> list[Path]:
    needs = ["activation", "width", "expansion", *MP_COLUMNS[:-1]]  # not survival_measured
    df = load(args, needs, probe="branch_jacobian")
    warn_mixed(df, (), args.experiment, keys=("depth", "matrices", "alpha", "beta", PLACEMENT, "seeds"))
    table = mp_table(df)
    out = out_dir(args)
    fig = draw_mp_erank(table, args.reference_draws)
    fig.suptitle(r"Branch Jacobian rank $\mathrm{erank}(J_f)/d$")
    style.caption(fig, df, args.experiment, ["error bars: ±1 s.d. over seeds"])
    paths = save(fig, out, "mp_erank", table)
    widths = sorted(df["width"].unique())
    width = int(args.width if args.width is not None else widths[-1])
    if width not in widths:
        raise SelectionError(f"--width {width}: the runs have widths {[int(w) for w in widths]}")
    hist = mp_histograms(df, args.uri, width)
    fig = draw_mp_histograms(hist, width)
    style.caption(fig, df[df["width"] == width], args.experiment, ["all seeds' eigenvalues pooled"])
    paths += save(fig, out, f"mp_histograms_d{width}", hist.set_index(["activation", "expansion"]))
    return paths


def _fig8(runs: Runs, *cols: str, acts: tuple[str, ...] = ()) -> pd.DataFrame:
    df = runs("fig8")
    need(df, *cols)
    if acts:
        df = df[df["activation"].isin(acts)]
        if df.empty:
            raise NotRun(f"no fig8 run of {', '.join(acts)}")
    return df


def _jf_rises(runs: Runs) -> Measured:
    df = _fig8(runs, "erank_branch", "expansion")
    steps = []
    for _, g in df.groupby(["activation", "width"]):
        m = g.groupby("expansion")["erank_branch"].mean().sort_index()
        steps += list(np.diff(m.to_numpy()))
    if not steps:
        raise NotRun("needs ≥ 2 values of m/d")
    return Measured(float(min(steps)), math.nan,
                    "smallest rise of erank(J_f)/d per m/d step, over σ and d")


def _bias(df: pd.DataFrame, measured: str, reference: str) -> Measured:
    """Mean over runs of ``measured − reference``: a law of the expectation is judged on its
    bias, not on the largest single-run fluctuation (binomial at finite d)."""
    diff = df[measured] - df[reference]
    std = f"{measured}_std"
    n = df["seeds"].astype(float) if "seeds" in df else 1.0
    se = float(np.sqrt((df[std] ** 2 / n).sum()) / len(df)) if std in df else math.nan
    return Measured(float(diff.mean()), se, f"mean over {len(df)} relu/abs runs of "
                    f"{measured} − {reference} (± its standard error over seeds)")


def _jf_reference(runs: Runs) -> Measured:
    df = _fig8(runs, "erank_branch", "erank_branch_reference", acts=("relu", "abs"))
    return _bias(df, "erank_branch", "erank_branch_reference")


def mp_atom_allowance(width: int, expansion: float, p: float) -> float:
    """E|atom_emp − atom_MP| over the active-unit count k ~ Bin(m, p), exactly: the Gram of D W_up
    has max(0, d − k)/d zero eigenvalues, MP(γ = p·m/d) max(0, 1 − γ) (≈ 0.28/√d at γ = 1)."""
    from scipy.stats import binom

    d, m = int(width), int(round(expansion * width))
    if p >= 1:
        return abs(max(0.0, (d - m) / d) - max(0.0, 1 - m / d))
    k = np.arange(m + 1)
    atom = np.maximum(0, d - k) / d
    return float((binom.pmf(k, m, p) * np.abs(atom - max(0.0, 1 - p * m / d))).sum())


def mp_ks_ratio(df: pd.DataFrame) -> pd.Series:
    """KS / (1.36/√N + :func:`mp_atom_allowance`) per run (relu/abs): the 95 % Kolmogorov
    value for the N = d·seeds pooled eigenvalues (conservative: eigenvalues repel) plus the
    atom the finite active-unit count leaves at zero."""
    crit = 1.36 / np.sqrt(df["width"].astype(float) * df["seeds"].astype(float))
    atom = [mp_atom_allowance(int(r["width"]), float(r["expansion"]), activation_constants(str(r["activation"])).survival_rate)
            for _, r in df.iterrows()]
    return df["mp_ks"] / (crit + np.asarray(atom))


def _mp_ks(runs: Runs) -> Measured:
    df = _fig8(runs, "mp_ks", "seeds", acts=("relu", "abs"))
    z = mp_ks_ratio(df)
    i = z.idxmax()
    return Measured(float(z.max()), math.nan,
                    f"max over relu/abs runs of KS / (1.36/√N + E|atom gap|) (worst: {df.loc[i, 'activation']}, "
                    f"m/d = {df.loc[i, 'expansion']:g}, d = {int(df.loc[i, 'width'])}: KS = "
                    f"{df.loc[i, 'mp_ks']:.3f})")


def _masked_rank(runs: Runs) -> Measured:
    df = _fig8(runs, "masked_rank", "masked_rank_theory", acts=("relu", "abs"))
    return _bias(df, "masked_rank", "masked_rank_theory")


FIG8 = (
    Claim("fig8.erank_rises", "erank(J_f)/d rises with m/d", "the study, fig8",
          "rises", above(0.0), _jf_rises),
    Claim("fig8.gaussian_product", "erank(J_f)/d follows the Gaussian-product "
          "reference at γ = p·m/d (relu, abs)", "the study, Figure 8", "0 (bias)",
          near(0.0, 0.02), _jf_reference),
    Claim("fig9.mp_exact", "Gram spectrum of D W_up is Marchenko–Pastur at γ, "
          "exact for relu/abs", "the study, fig8/9, fig17", "exact",
          at_most(1.0), _mp_ks),
    Claim("fig8.threshold", "rank(D W_up)/d = min(1, P(σ′≠0)·m/d): full rank from "
          "m/d = 1/p", "the study, fig8/9", "0 (bias)", near(0.0, 0.02), _masked_rank))

COMMANDS = {"mp": Command(
    _mp_main,
    "Figures 8/9/17: erank(J_f)/d vs m/d and γ = p·m/d; Marchenko–Pastur histograms of D W_up",
    experiment="fig8", arguments=_mp_arguments)}

EXPERIMENTS = (Experiment("fig8", "Figures 8/9: the branch Jacobian and Marchenko–Pastur",
                          "the study, fig8/9", analyses=("mp --experiment fig8",), claims=FIG8),)
