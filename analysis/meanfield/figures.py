"""Figures of the mean-field lab (science.md §5): measurement beside the chapter's theory.

One command per experiment (``python -m analysis <command> --help``), each writing PNG + PDF
+ CSV (and Markdown tables) under ``--out/<experiment>/``:

* ``mf_phase`` — measured χ₁ and ξ_c = −1/ln χ_c over (σ_w², σ_b²) as heatmaps, the tanh
  critical line χ₁ = 1 and theory ξ_c contours overlaid; measured vs theory scatter.
* ``mf_relu_collapse`` — critical ReLU 1 − c_l vs l (log-log) against the exact map and
  9π²/(2l²), and the ratio to the asymptote.
* ``mf_spectrum`` — the Var(λ) table (activation × init × L, measured beside L(v_W + v_D))
  and the log₁₀ λ histograms (from each run's ``arrays.npz``).
* ``mf_bn`` — per-layer gradient norms of plain BN nets, the ratio first/last vs depth per
  architecture, and the shattered-gradient autocorrelation vs depth, with references.
* ``mf_residual`` — stream variance vs (1 + β²)^l and correlation trajectories vs the
  residual map and its continuous-depth ODE.
* ``mf_trainability`` — best test accuracy over (σ_w², L) with L = 6 ξ_c overlaid.
* ``deep_linear`` — T(N, a₀) by quadrature with the asymptote 215.9 and simulated points.

Every figure carries a caption line with width, depth, seeds and the experiment's size.
Errors (no such experiment, no finished runs, a missing metric) are
:class:`~analysis.core.select.SelectionError`; ``python -m analysis`` prints them and exits with
status 2.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colors, ticker

from rankexp import theory
from rankexp.probes.meanfield import DEEP_LINEAR_DEFAULTS
from rankexp.tracking import download_artifact

from ..core import style
from ..core.runner import Command, add_where, out_dir, set_experiment_default
from ..core.select import load, series
from ..core.style import plt, save
from ..core.tables import to_markdown, write_text

log = logging.getLogger("analysis")


# --------------------------------------------------------------------------- shared
def _values(df: pd.DataFrame, key: str) -> str:
    if key not in df:
        return "?"
    vals = sorted(df[key].dropna().unique().tolist())
    fmt = [f"{v:g}" if isinstance(v, float) else str(v) for v in vals]
    return fmt[0] if len(fmt) == 1 else "{" + ", ".join(fmt) + "}"


def _arrays(uri: str | None, run_id: str) -> dict[str, np.ndarray]:
    """The run's ``arrays.npz`` artifact as a dict of arrays."""
    with tempfile.TemporaryDirectory() as tmp:
        with np.load(download_artifact(uri, run_id, "arrays.npz", tmp)) as z:
            return {k: z[k] for k in z.files}


def _newest(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """One run per combination of ``keys``: the newest (a rerun supersedes)."""
    if "start_time" in df:
        df = df.sort_values("start_time", ascending=False)
    return df.drop_duplicates(keys).reset_index(drop=True)


def _edges(centers) -> np.ndarray:
    """Cell edges around sorted ``centers`` (midpoints; end cells mirrored)."""
    c = np.asarray(centers, dtype=float)
    if c.size == 1:
        return np.array([c[0] - 0.5, c[0] + 0.5]) if c[0] else np.array([-0.5, 0.5])
    mid = 0.5 * (c[1:] + c[:-1])
    return np.concatenate([[c[0] - (mid[0] - c[0])], mid, [c[-1] + (c[-1] - mid[-1])]])


def _plain_log_ticks(ax, which: str = "x") -> None:
    """Plain numbers (1, 10, 100 …) instead of 2×10⁰ on a short log axis (layers, depths)."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(ticker.NullFormatter())


def _common(p: argparse.ArgumentParser, experiment: str) -> None:
    set_experiment_default(p, [experiment], f"MLflow experiment(s) (default: {experiment})")
    add_where(p)


# --------------------------------------------------------------------------- mf_phase
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
    xe, ye = np.clip(_edges(sw2), 0, None), np.clip(_edges(sb2), 0, None)
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
        ax.set_xlim(xe[0], xe[-1])
        ax.set_ylim(ye[0], ye[-1])
        ax.set_xlabel(r"$\sigma_w^2$")
        ax.set_ylabel(r"$\sigma_b^2$")
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
    ax.set_xlabel(r"theory $\xi_c$")
    ax.set_ylabel(r"measured $\xi_c$")
    ax.set_title(r"depth scale: measured vs theory", fontsize=9)
    ax.legend(fontsize=7)
    fig.suptitle(r"Phase diagram of plain tanh networks: order ($\chi_1<1$) and chaos ($\chi_1>1$)")
    return fig


def _phase_arguments(p: argparse.ArgumentParser) -> None:
    _common(p, "mf_phase")
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


MF_PHASE_COMMAND = Command(_phase_arguments, _phase_main,
                           "phase diagram: measured χ₁ and ξ_c over (σ_w², σ_b²), critical line and ξ_c contours")


# --------------------------------------------------------------------------- mf_relu_collapse
C0 = "task.options.correlation.c0"


def relu_collapse_table(df: pd.DataFrame, uri: str | None) -> pd.DataFrame:
    """Long table per (c_0, l): measured 1 − c_l (seed mean, std), the exact critical ReLU map
    iterated from c_0 (:func:`rankexp.theory.relu_correlation_iterates`) and 9π²/(2l²)."""
    rows = []
    for _, r in _newest(df, [C0, "width", "depth"]).iterrows():
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


def draw_relu_collapse(t: pd.DataFrame):
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
    axes[0].set_xscale("log")
    axes[0].set_yscale("log")
    axes[0].set_xlabel(r"layer $\ell$")
    axes[0].set_ylabel(r"$1-c_\ell$")
    axes[0].set_title(r"critical ReLU ($\sigma_w^2=2$): lines = exact map $f$ iterated from $c_0$",
                      fontsize=9)
    axes[0].legend(fontsize=7)
    axes[1].axhline(1, color="k", lw=0.8)
    axes[1].set_xscale("log")
    axes[1].set_xlabel(r"layer $\ell$")
    axes[1].set_ylabel(r"$(1-c_\ell)\,/\,(9\pi^2/2\ell^2)$")
    axes[1].set_title("ratio to the asymptote (→ 1; markers: measured)", fontsize=9)
    axes[1].legend(fontsize=7)
    for ax in axes:
        _plain_log_ticks(ax)
    fig.suptitle("Polynomial collapse of the correlation in critical ReLU networks")
    return fig


def _relu_arguments(p: argparse.ArgumentParser) -> None:
    _common(p, "mf_relu_collapse")


def _relu_main(args: argparse.Namespace) -> list[Path]:
    df = load(args, [C0, "mf_c"])
    t = relu_collapse_table(df, args.uri)
    fig = draw_relu_collapse(t)
    style.caption(fig, df, args.experiment, ["bands: ±1 s.d. over seeds"])
    return save(fig, out_dir(args), "mf_relu_collapse", t)


MF_RELU_COLLAPSE_COMMAND = Command(_relu_arguments, _relu_main,
                                   "critical ReLU 1 − c_l vs l against the exact map and 9π²/(2l²)")


# --------------------------------------------------------------------------- mf_spectrum
SPECTRUM_ORDER = ["linear", "relu", "tanh"]


def spectrum_table(df: pd.DataFrame) -> pd.DataFrame:
    """Var(λ) measured (mean ± std over seeds, newest run per cell) beside L(v_W + v_D)."""
    d = _newest(df, ["activation", "init", "depth"])
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
    depths = sorted(t.index.get_level_values("depth").unique())
    lines = ["| activation | init | " + " | ".join(f"L={d} measured | L={d} L(v_W+v_D)" for d in depths) + " |",
             "|---|---|" + "---|---|" * len(depths)]
    acts = sorted(t.index.get_level_values(0).unique(),
                  key=lambda a: SPECTRUM_ORDER.index(a) if a in SPECTRUM_ORDER else 9)
    for act in acts:
        for init in ("gaussian", "orthogonal"):
            cells = []
            for d in depths:
                if (act, init, d) in t.index:
                    r = t.loc[(act, init, d)]
                    cells += [f"{var_text(r['lambda_var'], 4)} ± {var_text(r['lambda_var_std'], 2)}",
                              var_text(r["lambda_var_theory"], 4)]
                else:
                    cells += ["—", "—"]
            lines.append(f"| {act} | {init} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def draw_spectrum(df: pd.DataFrame, uri: str | None):
    d = _newest(df, ["activation", "init", "depth"])
    acts = sorted(d["activation"].unique(), key=lambda a: SPECTRUM_ORDER.index(a) if a in SPECTRUM_ORDER else 9)
    inits = ["gaussian", "orthogonal"]
    fig, axes = style.grid(len(acts), 2, aspect=0.45)
    for i, act in enumerate(acts):
        for j, init in enumerate(inits):
            ax = axes[i, j]
            cell = d[(d["activation"] == act) & (d["init"] == init)].sort_values("depth")
            for k, (_, r) in enumerate(cell.iterrows()):
                a = _arrays(uri, r["run_id"])
                ax.stairs(a["log_lambda_hist"], a["log_lambda_edges"], color=f"C{k}",
                          label=rf"$L$={int(r['depth'])}: Var$(\lambda)$={var_text(r['lambda_var'])} "
                                rf"(theory {var_text(r['lambda_var_theory'])})")
            ax.set_title(f"{act}, {init}", fontsize=9)
            ax.set_xlabel(r"$\log_{10}\lambda$")
            ax.set_ylabel("density")
            if len(cell):
                ax.legend(fontsize=7)
    fig.suptitle(r"Squared singular values $\lambda$ of $\partial h_L/\partial h_0$ (mean 1); "
                 r"free probability: Var$(\lambda) = L\,(v_W + v_D)$")
    return fig


def _spectrum_arguments(p: argparse.ArgumentParser) -> None:
    _common(p, "mf_spectrum")


def _spectrum_main(args: argparse.Namespace) -> list[Path]:
    df = load(args, ["activation", "init", "lambda_var", "lambda_var_theory"])
    t = spectrum_table(df)
    out = out_dir(args)
    write_text(out / "mf_spectrum.md", spectrum_markdown(t))
    fig = draw_spectrum(df, args.uri)
    style.caption(fig, df, args.experiment)
    return save(fig, out, "mf_spectrum", t)


MF_SPECTRUM_COMMAND = Command(_spectrum_arguments, _spectrum_main,
                              "Var(λ) table of ∂h_L/∂h_0 beside L(v_W + v_D), log λ histograms")


# --------------------------------------------------------------------------- mf_bn


def architecture(r) -> str:
    """``plain``, ``plain + BN``, ``residual (β = 1)``, ``residual + BN (β = 1/√L)`` …"""
    bn = r.get("norm.placement", "none") != "none" and r.get("norm.op") == "batchnorm"
    name = "plain" if int(r["skip_every"]) == 0 else "residual"
    if name == "residual":
        beta = {"const": f"{r.get('beta', 1):g}", "inv_sqrt_depth": "1/√L",
                "inv_depth": "1/L"}.get(r.get("beta_scaling", "const"), "?")
        return f"{name}{' + BN' if bn else ''} (β = {beta})"
    return name + (" + BN" if bn else "")


def bn_table(df: pd.DataFrame) -> pd.DataFrame:
    d = _newest(df.assign(arch=[architecture(r) for _, r in df.iterrows()]), ["arch", "depth"])
    cols = [c for c in ("grad_ratio", "grad_ratio_std", "grad_growth", "shattered_autocorr_final",
                        "shattered_autocorr_final_std") if c in d]
    return d.set_index(["arch", "depth"])[cols + ["run_id"]].sort_index()


def draw_bn(t: pd.DataFrame, uri: str | None):
    fig, axes = style.panels(3, aspect=0.95)
    archs = list(dict.fromkeys(t.index.get_level_values("arch")))
    arch_color = {a: f"C{i}" for i, a in enumerate(archs)}
    ax = axes[0]
    if "plain + BN" in archs:
        sub = t.loc["plain + BN"]
        for k, (depth, r) in enumerate(sub.iterrows()):
            steps, g = series(uri, r["run_id"], "grad_norm")
            ax.semilogy(steps, g, "-", color=plt.cm.viridis(k / max(1, len(sub) - 1)), label=f"L={depth}")
            mid = len(g) // 2  # anchored mid-network: the last layer has its own offset
            ref = g[mid] * theory.BN_RELU_GRADIENT_GROWTH ** (steps[mid] - steps)
            ax.semilogy(steps, ref, **{**style.THEORY, "color": "grey", "lw": 0.8})
        ax.set_title(r"plain + BN: $\|\partial\ell/\partial W_\ell\|_F$ per layer"
                     "\n" r"(dashed: $\sqrt{\pi/(\pi-1)}$ per layer toward the input)", fontsize=9)
        ax.set_xlabel(r"layer $\ell$")
        ax.set_ylabel("weight-gradient norm")
        ax.legend(fontsize=7)
    ax = axes[1]
    for a in archs:  # a log axis: no error bars (the caption states the seed spread)
        sub = t.loc[a]
        ax.plot(sub.index, sub["grad_ratio"], "o-", color=arch_color[a], ms=4, label=a)
    depths = np.array(sorted(t.index.get_level_values("depth").unique()), dtype=float)
    ax.plot(depths, theory.BN_RELU_GRADIENT_GROWTH ** (depths - 1), **style.THEORY,
            label=r"$(\pi/(\pi-1))^{(L-1)/2}$ (Yang et al.)")  # dotted is panel 3's 1/√L
    ax.set_yscale("log")
    ax.set_xlabel(style.name("depth"))
    ax.set_ylabel(r"$\|\nabla W_1\| / \|\nabla W_L\|$")
    ax.set_title("gradient ratio first / last layer", fontsize=9)
    ax.legend(fontsize=7)
    ax = axes[2]
    for a in archs:
        deepest = t.loc[a].iloc[-1]
        steps, ac = series(uri, deepest["run_id"], "shattered_autocorr")
        ax.plot(steps, ac, "-", color=arch_color[a], label=a)
        if "shattered_autocorr_final" in t:
            ax.plot(t.loc[a].index, t.loc[a]["shattered_autocorr_final"], "o", ms=4, color=arch_color[a])
    lay = np.arange(1, int(depths.max()) + 1, dtype=float)
    ax.plot(lay, 0.5**lay, "k--", lw=0.8, label=r"$2^{-L}$")
    ax.plot(lay, 0.75**lay, "k-.", lw=0.8, label=r"$(3/4)^L$")
    ax.plot(lay, 1 / np.sqrt(lay), "k:", lw=0.8, label=r"$1/\sqrt{L}$")
    ax.set_xscale("log")
    _plain_log_ticks(ax)
    ax.set_ylim(-0.2, 1.05)
    ax.set_xlabel("depth $L$ (lines: every layer of the deepest run; markers: each run)")
    ax.set_ylabel("lag-1 autocorrelation of $d(v^\\top h_L)/dx$")
    ax.set_title("shattered gradients (Balduzzi et al. 2017; references from the chapter)", fontsize=9)
    ax.legend(fontsize=7)
    fig.suptitle("Batch normalization at initialization: exploding and shattered gradients")
    return fig


def bn_spread_note(t: pd.DataFrame) -> str:
    """The seed spread of the gradient ratio the log-axis panel cannot draw as bars."""
    if "grad_ratio_std" not in t:
        return "no seed spread logged"
    rel = (t["grad_ratio_std"] / t["grad_ratio"].abs()).replace([np.inf, -np.inf], np.nan).dropna()
    return (f"gradient ratio: seed s.d. ≤ {100 * rel.max():.2g} % of each point (1 s.d. over seeds)"
            if len(rel) else "gradient ratio: one seed, no spread")


def _bn_arguments(p: argparse.ArgumentParser) -> None:
    _common(p, "mf_bn")


def _bn_main(args: argparse.Namespace) -> list[Path]:
    df = load(args, ["skip_every", "grad_ratio"])
    t = bn_table(df)
    out = out_dir(args)
    write_text(out / "mf_bn.md", to_markdown(t.drop(columns="run_id")))
    fig = draw_bn(t, args.uri)
    style.caption(fig, df, args.experiment, ["ReLU, $\\sigma_w^2$ = 2", bn_spread_note(t)])
    return save(fig, out, "mf_bn",
                t.drop(columns="run_id"))


MF_BN_COMMAND = Command(_bn_arguments, _bn_main,
                        "BN at init: per-layer gradient norms, ratio first/last vs depth, shattered-gradient autocorrelation")


# --------------------------------------------------------------------------- mf_residual
def residual_table(df: pd.DataFrame, uri: str | None) -> pd.DataFrame:
    """Long table per (β scaling, L, l): measured q_l, c_l; (1+β²)^l q_0; the residual map;
    the ODE limit at t = l/L with τ = β²L."""
    rows = []
    for _, r in _newest(df, ["beta_scaling", "depth", "width"]).iterrows():
        depth = int(r["depth"])
        beta = float(r["beta_eff"])
        steps, q = series(uri, r["run_id"], "mf_q")
        _, c = series(uri, r["run_id"], "mf_c")
        c0 = float(c[0])
        tau = beta**2 * depth
        rows.append(pd.DataFrame({
            "beta_scaling": r["beta_scaling"], "depth": depth, "beta": beta, "layer": steps,
            "t": steps / depth, "q": q, "q_theory": q[0] * (1 + beta**2) ** steps,
            "q_ode": q[0] * np.exp(tau * steps / depth), "c": c,
            "c_map": theory.residual_relu_correlation(c0, depth, beta)[steps],
            "c_ode": theory.residual_relu_correlation_ode(c0, steps / depth, tau)}))
    return pd.concat(rows, ignore_index=True)


def draw_residual(t: pd.DataFrame):
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
    axes[0].set_xlabel(r"layer $\ell$")
    axes[0].set_ylabel(r"stream variance $q_\ell$")
    axes[0].set_title(r"lines: $q_0(1+\beta^2)^\ell$", fontsize=9)
    axes[1].set_xlabel(r"$t = \ell/L$")
    axes[1].set_ylabel(r"$q_\ell$")
    axes[1].set_title(r"$\beta = 1/\sqrt{L}$: $(1+1/L)^{tL} \to e^{t}$", fontsize=9)
    axes[2].set_xlabel(r"$t = \ell/L$")
    axes[2].set_ylabel(r"correlation $c_\ell$")
    axes[2].set_title(r"lines: residual map $c \mapsto (c + \beta^2 f(c))/(1+\beta^2)$", fontsize=9)
    for ax in axes:
        ax.legend(fontsize=7)
    fig.suptitle(r"Residual ReLU networks: variance $(1+\beta^2)^L$ and the depth limit $\beta^2 L = O(1)$")
    return fig


def _residual_arguments(p: argparse.ArgumentParser) -> None:
    _common(p, "mf_residual")


def _residual_main(args: argparse.Namespace) -> list[Path]:
    df = load(args, ["beta_scaling", "beta_eff", "mf_q", "mf_c"])
    t = residual_table(df, args.uri)
    fig = draw_residual(t)
    style.caption(fig, df, args.experiment, ["ReLU, $\\sigma_w^2$ = 2, $c_0$ = 0.5"])
    return save(fig,
                out_dir(args), "mf_residual", t)


MF_RESIDUAL_COMMAND = Command(_residual_arguments, _residual_main,
                              "residual ReLU: stream variance vs (1+β²)^l, correlation vs the map and its ODE limit")


# --------------------------------------------------------------------------- mf_trainability
def trainability_table(df: pd.DataFrame) -> pd.DataFrame:
    d = df.assign(sigma_w2=(df["alpha"] ** 2).round(12), sigma_b2=(df["bias"] ** 2).round(12))
    t = d.groupby(["sigma_b2", "sigma_w2", "depth"])[["best_test_accuracy"]].max()
    xi = {(b, w): theory.correlation_depth_scale(d["activation"].iloc[0], w, b).xi_c
          for b, w in {(b, w) for b, w, _ in t.index}}
    t["xi_c_theory"] = [xi[(b, w)] for b, w, _ in t.index]
    t["six_xi_c"] = 6 * t["xi_c_theory"]
    return t


def draw_trainability(t: pd.DataFrame, activation: str):
    sb2s = sorted(t.index.get_level_values("sigma_b2").unique())
    fig, axes = style.grid(1, len(sb2s), width=min(style.TWO_COLUMN, 3.6 * len(sb2s)), aspect=0.85)
    for ax, sb2 in zip(axes[0], sb2s, strict=True):
        g = t.loc[sb2]["best_test_accuracy"].unstack("sigma_w2")
        sw2, depths = g.columns.to_numpy(float), g.index.to_numpy(float)
        ye = np.exp(_edges(np.log(depths)))
        mesh = ax.pcolormesh(np.clip(_edges(sw2), 0, None), ye, g.to_numpy(), cmap="magma",
                             vmin=0.1, shading="flat")
        fig.colorbar(mesh, ax=ax, label="best test accuracy")
        fine = np.linspace(sw2.min(), sw2.max(), 60)
        xi = np.array([theory.correlation_depth_scale(activation, w, sb2).xi_c for w in fine])
        ax.plot(fine, np.clip(6 * xi, ye[0], ye[-1] * 10), "c-", lw=2, label=r"$L = 6\,\xi_c$")
        if activation == "tanh":
            ax.axvline(theory.tanh_critical_line(sb2), color="w", ls="--", lw=1,
                       label=r"critical $\chi_1 = 1$")
        ax.set_yscale("log")
        ax.set_ylim(ye[0], ye[-1])
        ax.set_yticks(depths, [f"{d:g}" for d in depths])
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xlabel(r"$\sigma_w^2$")
        ax.set_ylabel(style.name("depth"))
        ax.set_title(rf"{activation}, $\sigma_b^2$ = {sb2:.3g}", fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("Trainability of plain networks on CIFAR-10 vs the correlation depth scale "
                 "(Schoenholz et al. 2017)")
    return fig


def _trainability_arguments(p: argparse.ArgumentParser) -> None:
    _common(p, "mf_trainability")


def _trainability_main(args: argparse.Namespace) -> list[Path]:
    df = load(args, ["alpha", "bias", "depth", "activation", "best_test_accuracy"])
    t = trainability_table(df)
    steps = _values(df, "task.steps")
    lrs = _values(df, "task.lrs")
    fig = draw_trainability(t, str(df["activation"].iloc[0]))
    style.caption(fig, df, args.experiment, [f"Adam, {steps} steps, best over lrs {lrs}"])
    return save(fig, out_dir(args),
                "mf_trainability", t)


MF_TRAINABILITY_COMMAND = Command(_trainability_arguments, _trainability_main,
                                  "best CIFAR-10 accuracy over (σ_w², L) with L = 6 ξ_c overlaid")


# --------------------------------------------------------------------------- deep_linear
S_KEY = "task.options.deep_linear.s"


def deep_linear_table(df: pd.DataFrame, uri: str | None) -> pd.DataFrame:
    """Long table per (s, a₀, N): quadrature, asymptote (N > 2, a₀ < 1), simulation where run."""
    rows = []
    for _, r in _newest(df, [S_KEY]).iterrows():
        s = float(r[S_KEY])
        a0s = sorted(float(c[len("T_quad_a"):]) for c in df.columns if c.startswith("T_quad_a")
                     and pd.notna(r[c]))
        for a0 in a0s:
            steps, quad = series(uri, r["run_id"], f"T_quad_a{a0:g}")
            asym = np.full_like(quad, np.nan)
            if a0 < 1:
                st, v = series(uri, r["run_id"], f"T_asym_a{a0:g}")
                asym[np.isin(steps, st)] = v
            sim = [r.get(f"T_sim_N{int(n)}_a{a0:g}", np.nan) for n in steps]
            rows.append(pd.DataFrame({"s": s, "a0": a0, "N": steps, "T_quad": quad,
                                      "T_asymptote": asym, "T_sim": sim}))
    t = pd.concat(rows, ignore_index=True)
    t["asymptote_ratio"] = t["T_asymptote"] / t["T_quad"]
    return t


def draw_deep_linear(t: pd.DataFrame):
    ss = sorted(t["s"].unique())
    fig, axes = style.grid(1, len(ss), width=min(style.TWO_COLUMN, 3.6 * len(ss)), aspect=0.8)
    for ax, s in zip(axes[0], ss, strict=True):
        for k, (a0, g) in enumerate(t[t["s"] == s].groupby("a0")):
            col = f"C{k}"
            pos = g[g["T_quad"] > 0]
            lab = "identity start $a_0$ = 1" if a0 == 1 else f"$a_0$ = {a0:g}"
            ax.semilogy(pos["N"], pos["T_quad"], "-", color=col, label=lab)
            ax.semilogy(g["N"], g["T_asymptote"], "--", color=col, lw=0.8)
            ax.semilogy(g["N"], g["T_sim"], "o", mfc="none", color=col, ms=7)
        ax.plot([], [], "k--", lw=0.8, label=r"asymptote $a_0^{-(N-2)}/(s(N-2))$")
        ax.plot([], [], "ko", mfc="none", label="gradient flow on a real chain")
        ax.set_xlabel("layers $N$")
        ax.set_ylabel(r"time $T(N, a_0)$ to reach $s/2$")
        ax.set_title(rf"target $s$ = {s:g} (lines: quadrature of 215.8)", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("The deep-linear plateau: learning time grows like $a_0^{-N}$")
    return fig


def _deep_linear_arguments(p: argparse.ArgumentParser) -> None:
    _common(p, "deep_linear")


def _deep_linear_main(args: argparse.Namespace) -> list[Path]:
    df = load(args, [S_KEY, "T_sim_rel_err"])
    t = deep_linear_table(df, args.uri)
    out = out_dir(args)
    table = t.pivot_table(index=["s", "N"], columns="a0", values="T_quad")
    write_text(out / "deep_linear.md", to_markdown(table, ".6g"))
    # the chains simulated are sim_width wide (the task's own network is unused): d is theirs
    key = "task.options.deep_linear.sim_width"
    sim_width = df[key].astype(int) if key in df else DEEP_LINEAR_DEFAULTS["sim_width"]
    fig = draw_deep_linear(t)
    style.caption(fig, df.assign(width=sim_width).drop(columns=["depth"], errors="ignore"),
                  args.experiment, [f"one run per target $s$; gradient flow on orthogonal chains, "
                                    f"largest |sim − quad|/quad = {df['T_sim_rel_err'].max():.1e}"])
    return save(fig, out, "deep_linear", t)


DEEP_LINEAR_COMMAND = Command(_deep_linear_arguments, _deep_linear_main,
                              "deep-linear learning time T(N, a₀) by quadrature, asymptote, simulated chains")

COMMANDS = {"mf_phase": MF_PHASE_COMMAND, "mf_relu_collapse": MF_RELU_COLLAPSE_COMMAND, "mf_spectrum": MF_SPECTRUM_COMMAND, "mf_bn": MF_BN_COMMAND, "mf_residual": MF_RESIDUAL_COMMAND, "mf_trainability": MF_TRAINABILITY_COMMAND, "deep_linear": DEEP_LINEAR_COMMAND}
