"""Branch-Jacobian spectra (Figures 8/9/17), Table 1 and Table 6 from logged ``task=measure`` runs.

Commands (``python -m analysis <command> --help``):

* ``mp`` (experiment ``fig8``, probe ``branch_jacobian``) — ``erank(J_f)/d`` against m/d and
  against γ = p·m/d per activation, beside the Gaussian-product reference
  (:func:`rankexp.theory.gaussian_product_erank`); ``rank(D W_up)/d`` against m/d with the
  threshold m/d = 1/P(σ′≠0); and a grid of Marchenko–Pastur panels (rows σ, columns m/d, one
  width): the pooled histogram of normalized Gram eigenvalues of the masked up-projection
  ``D W_up`` **as logged by the probe in each run's ``arrays.npz`` artifact** (``mp_hist_*``;
  the newest run of each cell) against the MP density at the run's γ on a fine grid.
* ``table1`` (experiment ``tab1``, probe ``activation_spike``) — coherence c, spike bound 1/c,
  survival p = E[σ′²], P(σ′≠0) and κ = E[σ²] by quadrature at unit preactivation variance
  (:func:`rankexp.theory.activation_constants`), beside the measured stable rank of σ(W h)
  and its ratio to 1/c (Markdown + CSV).
* ``table6`` (experiment ``tab6``, probe ``representation``) — ``erank(Z_l)/d`` at each width d
  (rows) and layer l (columns, read off each run's ``rep_erank`` series, so one deep run per
  width serves every l ≤ its depth), Markdown + CSV, and the curves against l.

Errors (unknown experiment, no finished runs, a run without the probe's metrics or arrays)
raise :class:`~analysis.core.select.SelectionError`; ``python -m analysis`` prints it and
exits with status 2.
"""

from __future__ import annotations

import argparse
import logging
import math
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from rankexp.theory import (
    activation_constants,
    gaussian_product_erank,
    marchenko_pastur_density,
    marchenko_pastur_edges,
)
from rankexp.tracking import download_artifact

from ..core import style
from ..core.runner import Command, out_dir, set_experiment_default
from ..core.select import PLACEMENT, SelectionError, load, series, warn_mixed
from ..core.style import save
from ..core.tables import write_markdown

log = logging.getLogger("analysis")

#: Table 1's row order; activations not listed follow alphabetically.
TABLE1_ORDER = ("abs", "relu", "gelu", "silu", "tanh", "leaky_relu", "swiglu", "linear")


def _activations(values) -> list[str]:
    values = list(dict.fromkeys(values))
    return sorted(values, key=lambda a: (TABLE1_ORDER.index(a) if a in TABLE1_ORDER else 99, a))


# --------------------------------------------------------------------------- mp (Figures 8/9/17)
MP_COLUMNS = [
    "erank_branch",
    "erank_branch_std",
    "erank_branch_reference",
    "mp_gamma",
    "mp_ks",
    "masked_rank",
    "masked_rank_theory",
    "mp_zero_fraction",
    "mp_atom_theory",
    "survival_theory",
    "survival_measured",
]


def mp_table(df: pd.DataFrame) -> pd.DataFrame:
    """Mean over runs of the branch-Jacobian scalars per (activation, width, expansion).

    Adds ``threshold_expansion`` = 1/P(σ′≠0) (where ``rank(D W_up)`` reaches d; 1/p = 2 for
    ReLU) and ``runs``.
    """
    keys = ["activation", "width", "expansion"]
    cols = [c for c in MP_COLUMNS if c in df]
    t = df.groupby(keys)[cols].mean()
    t["threshold_expansion"] = [
        1.0 / activation_constants(a, 1.0).survival_rate for a in t.index.get_level_values(0)
    ]
    t["runs"] = df.groupby(keys).size()
    return t


def draw_mp_erank(table: pd.DataFrame, reference_draws: int = 4):
    """erank(J_f)/d vs m/d and vs γ (with the Gaussian-product curve), rank(D W_up)/d vs m/d."""
    acts = _activations(table.index.get_level_values("activation"))
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
    axes[0].set_xlabel(style.name("expansion"))
    axes[0].set_ylabel(style.name("erank_branch"))
    axes[0].set_title(r"vs $m/d$ (dotted: reference at each $\gamma$)")
    axes[1].set_xlabel(style.name("mp_gamma"))
    axes[1].set_ylabel(style.name("erank_branch"))
    axes[1].set_title(r"vs $\gamma$")
    axes[2].set_xlabel(style.name("expansion"))
    axes[2].set_ylabel(style.name("masked_rank"))
    axes[2].set_title(r"dotted: $\min(1, P(\sigma'\neq 0)\,m/d)$")
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
    """Long table of the logged MP histograms at ``width``: the newest run per (σ, m/d).

    Columns: activation, expansion, gamma, ks, zero_fraction, atom_theory, run_id, center,
    density (measured, per unit of normalized eigenvalue), theory (MP density at the center).

    Raises:
        TrackingError: a run has no ``arrays.npz`` (logged with ``tracking.log_arrays=false``).
        SelectionError: ``arrays.npz`` lacks the histogram (not a ``branch_jacobian`` run).
    """
    sub = df[df["width"] == width]
    if "start_time" in sub:
        sub = sub.sort_values("start_time", ascending=False)
    sub = sub.drop_duplicates(["activation", "expansion"])
    parts = []
    with tempfile.TemporaryDirectory() as tmp:
        for _, r in sub.iterrows():
            dst = Path(tmp) / r["run_id"]
            dst.mkdir()
            with np.load(download_artifact(uri, r["run_id"], "arrays.npz", str(dst))) as z:
                if "mp_hist_centers" not in z:
                    raise SelectionError(f"arrays.npz of run {r['run_id']} has no mp_hist_centers")
                centers, density = z["mp_hist_centers"], z["mp_hist_density"]
            parts.append(
                pd.DataFrame(
                    {
                        "activation": r["activation"],
                        "expansion": r["expansion"],
                        "gamma": r["mp_gamma"],
                        "ks": r["mp_ks"],
                        "zero_fraction": r.get("mp_zero_fraction", np.nan),
                        "atom_theory": r.get("mp_atom_theory", np.nan),
                        "run_id": r["run_id"],
                        "center": centers,
                        "density": density,
                        "theory": marchenko_pastur_density(centers, float(r["mp_gamma"])),
                    }
                )
            )
    return pd.concat(parts, ignore_index=True)


def draw_mp_histograms(hist: pd.DataFrame, width: int):
    """Rows = activation, columns = m/d; measured histogram (steps) and MP density (line)."""
    acts = _activations(hist["activation"])
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
            ax.set_title(
                f"{style.value_label('activation', act)}, $m/d = {e:g}$: "
                f"$\\gamma = {gamma:.2f}$, KS $= {h['ks'].iloc[0]:.3f}$",
                fontsize=6.5,
            )
            z, atom = h["zero_fraction"].iloc[0], h["atom_theory"].iloc[0]
            if np.isfinite(z) and (z > 0 or atom > 0):
                ax.text(
                    0.97,
                    0.9,
                    f"zeros {z:.2f} (MP {atom:.2f})",
                    transform=ax.transAxes,
                    ha="right",
                    fontsize=6,
                )
            if i == len(acts) - 1:
                ax.set_xlabel(r"eigenvalue $\lambda/\bar\lambda$")
            if j == 0:
                ax.set_ylabel("density")
    axes[0, 0].legend(fontsize=5.5)
    fig.suptitle(
        rf"Figures 9/17: Gram spectrum of $D W_\mathrm{{up}}$ vs Marchenko–Pastur (dashed: edges), $d = {width}$"
    )
    return fig


def _mp_arguments(p: argparse.ArgumentParser) -> None:
    set_experiment_default(p, "fig8")
    p.add_argument(
        "--width",
        type=int,
        default=None,
        help="width d of the histogram grid (default: the largest width run)",
    )
    p.add_argument(
        "--reference-draws",
        type=int,
        default=4,
        help="Monte Carlo draws per point of the Gaussian-product curve (default 4)",
    )


def _mp_main(args: argparse.Namespace) -> list[Path]:
    needs = ["activation", "width", "expansion"] + [
        c for c in MP_COLUMNS if c != "survival_measured"
    ]
    df = load(args, needs, probe="branch_jacobian")
    warn_mixed(df, (), args.experiment, keys=("depth", "matrices", "alpha", "beta", PLACEMENT, "seeds"))
    table = mp_table(df)
    out = out_dir(args)
    fig = draw_mp_erank(table, args.reference_draws)
    fig.suptitle(r"Figure 8: branch Jacobian rank $\mathrm{erank}(J_f)/d$")
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


MP_COMMAND = Command(_mp_arguments, _mp_main, "Figures 8/9/17: erank(J_f)/d vs m/d and γ = p·m/d; "
                     "Marchenko–Pastur histograms of D W_up")


# --------------------------------------------------------------------------- Table 1
def table1(df: pd.DataFrame) -> pd.DataFrame:
    """Table 1: quadrature constants at unit variance beside the measured stable rank of σ(W h).

    Columns: ``c``, ``1/c`` (∞ for c = 0), ``p`` = E[σ′²], ``P(σ′≠0)``, ``κ`` = E[σ²];
    ``stable_rank`` (mean over runs of the seed mean of ``hidden_stable_rank``),
    ``stable_rank_std`` (seed spread), ``coherence_measured`` (mean(A)²/mean(A²)),
    ``stable_rank/(1/c)`` (NaN when c = 0), ``runs``.  Index: activation, Table 1 order.
    """
    rows = []
    for act in _activations(df["activation"]):
        g = df[df["activation"] == act]
        k = activation_constants(act, 1.0)
        sr = float(g["hidden_stable_rank"].mean())
        rows.append(
            {
                "activation": act,
                "c": k.coherence,
                "1/c": k.spike_bound,
                "p": k.survival,
                "P(σ′≠0)": k.survival_rate,
                "κ": k.kappa,
                "stable_rank": sr,
                "stable_rank_std": float(g["hidden_stable_rank_std"].mean())
                if "hidden_stable_rank_std" in g
                else math.nan,
                "coherence_measured": float(g["hidden_coherence"].mean()),
                "stable_rank/(1/c)": sr * k.coherence if k.coherence > 0 else math.nan,
                "runs": len(g),
            }
        )
    return pd.DataFrame(rows).set_index("activation")


def _table1_arguments(p: argparse.ArgumentParser) -> None:
    set_experiment_default(p, "tab1")


def _table1_main(args: argparse.Namespace) -> list[Path]:
    needs = ["activation", "hidden_stable_rank", "hidden_coherence"]
    df = load(args, needs, probe="activation_spike")
    warn_mixed(df, (), args.experiment,
               keys=("width", "expansion", "matrices", PLACEMENT, "alpha", "task.options.activation_spike.n"))
    if "alpha" in df and (df["alpha"] != 1).any():
        log.warning("runs with alpha ≠ 1: Table 1's constants are at unit preactivation variance")
    t = table1(df)
    out = out_dir(args)
    fig = draw_table1(t)
    spread = float((t["stable_rank_std"] / t["stable_rank"]).max())
    style.caption(fig, df, args.experiment, [f"bars: mean over seeds (s.d. ≤ {spread:.0%} of the "
                                             "mean; per activation in table1.csv)"])
    paths = save(fig, out, "table1", t)
    md = write_markdown(
        out / "table1.md",
        f"Table 1 ({', '.join(args.experiment)}): quadrature at q = 1 vs measured "
        "stable rank of σ(W h)",
        t,
        runs=df,
    )
    return [*paths, md]


def draw_table1(t: pd.DataFrame):
    """Measured stable rank of σ(W h) per activation (bars: the seed mean) beside the spike
    bound 1/c of the quadrature (black ticks; none where c = 0), and measured vs quadrature
    coherence c."""
    fig, (ax, bx) = style.panels(2, aspect=0.75)
    x = np.arange(len(t))
    names = [style.value_label("activation", a) for a in t.index]
    # a log axis: no error bars (a bar's lower edge would cross zero); the seed s.d. is stated
    # in the caption and listed in table1.csv / table1.md
    ax.bar(x, t["stable_rank"], 0.6, color="C0", label=style.name("hidden_stable_rank"))
    bound = t["1/c"].where(np.isfinite(t["1/c"]))
    ax.plot(x, bound, "k_", ms=14, mew=1.5, label=r"spike bound $1/c$ (quadrature)")
    ax.set_xticks(x, names)
    ax.set_yscale("log")
    style.plain_log_ticks(ax)
    ax.grid(axis="x", visible=False)
    ax.set_ylabel("stable rank")
    ax.legend()
    ax.set_title(r"stable rank of $\sigma(W h)$")
    bx.bar(x - 0.2, t["coherence_measured"], 0.4, color="C1", label="measured")
    bx.bar(x + 0.2, t["c"], 0.4, color="0.3", label="quadrature")
    bx.set_xticks(x, names)
    bx.grid(axis="x", visible=False)
    bx.set_ylabel(r"coherence $c = \mathrm{E}[\sigma]^2/\mathrm{E}[\sigma^2]$")
    bx.legend()
    bx.set_title("coherence")
    fig.suptitle(r"Table 1: activation constants at $q = 1$ vs $\sigma(W h)$")
    return fig


TABLE1_COMMAND = Command(_table1_arguments, _table1_main, "Table 1: c, 1/c, p, κ by quadrature beside the "
                         "measured stable rank of σ(W h)")


# --------------------------------------------------------------------------- Table 6
def table6(df: pd.DataFrame, uri: str | None, layers: list[int]) -> pd.DataFrame:
    """``erank(Z_l)/d`` per (matrices, activation, width) (rows) and l (columns), mean over runs.

    Values come from each run's ``rep_erank`` series (step = l); an l beyond every run's
    depth is left out.

    Raises:
        SelectionError: no requested layer exists in any run.
    """
    rows = []
    for _, r in df.iterrows():
        steps, values = series(uri, r["run_id"], "rep_erank")
        at = dict(zip(steps.astype(int), values, strict=True))
        for l in layers:
            if l in at:
                rows.append(
                    {
                        "matrices": r["matrices"],
                        "activation": r["activation"],
                        "d": int(r["width"]),
                        "l": l,
                        "erank": at[l],
                    }
                )
    if not rows:
        raise SelectionError(
            f"no run reaches any of the layers {layers} (depths: {sorted(df['depth'].unique())})"
        )
    long = pd.DataFrame(rows)
    t = long.groupby(["matrices", "activation", "d", "l"])["erank"].mean().unstack("l")
    t.columns = [f"l={c}" for c in t.columns]
    return t


def _table6_arguments(p: argparse.ArgumentParser) -> None:
    set_experiment_default(p, "tab6")
    p.add_argument(
        "--layers",
        type=int,
        nargs="+",
        default=[32, 64, 128, 256, 512],
        help="layers l to tabulate (default: 32 64 128 256 512)",
    )


def _table6_main(args: argparse.Namespace) -> list[Path]:
    needs = ["width", "depth", "matrices", "activation", "rep_erank_final"]
    df = load(args, needs, probe="representation")
    warn_mixed(df, (), args.experiment,
               keys=("expansion", PLACEMENT, "alpha", "beta", "task.options.representation.n"))
    t = table6(df, args.uri, sorted(set(args.layers)))
    dropped = [l for l in args.layers if f"l={l}" not in t.columns]
    if dropped:
        log.info("layers %s are deeper than every run; left out", dropped)
    out = out_dir(args)
    fig, (ax,) = style.panels(1)
    ds = sorted({idx[2] for idx in t.index})
    colors, sm = style.value_colors(ds, "viridis")
    for idx, row in t.iterrows():
        ls = [int(c[2:]) for c in t.columns]
        ax.plot(ls, row.values, "o-", color=colors[idx[2]],
                label=f"{style.value_label('matrices', idx[0])}, "
                f"{style.value_label('activation', idx[1])}" if idx[2] == ds[0] else None)
    ax.set_xscale("log", base=2)
    ax.set_xlabel(style.name("layer"))
    ax.set_ylabel(style.name("rep_erank"))
    ax.legend()
    style.colorbar(fig, sm, ax, "width")
    fig.suptitle("Table 6: representation collapse")
    style.caption(fig, df, args.experiment, ["mean over seeds"])
    paths = save(fig, out, "table6", t)
    paths.append(
        write_markdown(
            out / "table6.md",
            f"Table 6 ({', '.join(args.experiment)}): erank(Z_l)/d",
            t,
            floatfmt=".3f",
            runs=df,
        )
    )
    return paths


TABLE6_COMMAND = Command(_table6_arguments, _table6_main, "Table 6: erank(Z_l)/d at each width d and layer l "
                         "(M = 1 representation collapse)")
COMMANDS = {"mp": MP_COMMAND, "table1": TABLE1_COMMAND, "table6": TABLE6_COMMAND}
