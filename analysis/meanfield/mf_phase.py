"""Phase diagram: χ₁ and ξ_c over (σ_w², σ_b²): the command ``mf_phase``, the claims and the
registry entry."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colors

from rankexp import theory

from ..core import style
from ..core.claims import Check, Claim, Measured, NotRun, Runs, at_most
from ..core.registry import Experiment, Needs
from ..core.runner import Command, add_where, out_dir, set_experiment_default
from ..core.select import load, series
from ..core.style import save
from ..core.tables import to_markdown, write_text


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


def _common(p: argparse.ArgumentParser, experiment: str) -> None:
    set_experiment_default(p, [experiment], f"MLflow experiment(s) (default: {experiment})")
    add_where(p)


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


def architecture(r) -> str:
    """``plain``, ``plain + BN``, ``residual (β = 1)``, ``residual + BN (β = 1/√L)`` …"""
    bn = r.get("norm.placement", "none") != "none" and r.get("norm.op") == "batchnorm"
    name = "plain" if int(r["skip_every"]) == 0 else "residual"
    if name == "residual":
        beta = {"const": f"{r.get('beta', 1):g}", "inv_sqrt_depth": "1/√L",
                "inv_depth": "1/L"}.get(r.get("beta_scaling", "const"), "?")
        return f"{name}{' + BN' if bn else ''} (β = {beta})"
    return name + (" + BN" if bn else "")


def trainability_table(df: pd.DataFrame) -> pd.DataFrame:
    d = df.assign(sigma_w2=(df["alpha"] ** 2).round(12), sigma_b2=(df["bias"] ** 2).round(12))
    t = d.groupby(["sigma_b2", "sigma_w2", "depth"])[["best_test_accuracy"]].max()
    xi = {(b, w): theory.correlation_depth_scale(d["activation"].iloc[0], w, b).xi_c
          for b, w in {(b, w) for b, w, _ in t.index}}
    t["xi_c_theory"] = [xi[(b, w)] for b, w, _ in t.index]
    t["six_xi_c"] = 6 * t["xi_c_theory"]
    return t


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


#: a deviation in units of its allowance (3 s.e. + the stated bias) holds at ≤ 1
WITHIN = Check("≤ 1 (|Δ| ≤ 3 s.e. + bias)", lambda v: v <= 1.0)


def _se(std, seeds):
    """Standard error of a seed mean: s.d. / √seeds (NaN with one seed)."""
    seeds = np.asarray(seeds, dtype=float)
    return np.where(seeds > 1, np.asarray(std, dtype=float) / np.sqrt(np.maximum(seeds, 1)), np.nan)


def worst(rows: pd.DataFrame, label: Callable[[pd.Series], str], unit: str = "") -> Measured:
    """The row of ``rows`` (columns ``measured``, ``theory``, ``se``, ``bias``) with the largest
    deviation |measured − theory| / (3 se + bias), as :class:`Measured` naming it.

    Raises:
        NotRun: no rows, or no seed spread (one seed: no standard error).
    """
    if rows.empty:
        raise NotRun("the runs hold none of the rows this claim reads")
    allowance = 3 * rows["se"].astype(float) + rows["bias"].astype(float)
    if allowance.isna().any():
        raise NotRun("these runs have one seed each, so the seed spread the tolerance needs is unknown")
    gap = (rows["measured"] - rows["theory"]).abs()
    dev = pd.Series(np.where(allowance > 0, gap / allowance.where(allowance > 0, 1.0),
                             np.where(gap > 0, np.inf, 0.0)), index=rows.index)
    r = rows.loc[dev.idxmax()]
    return Measured(float(dev.max()), math.nan,
                    f"worst: {label(r)}: {r['measured']:.4g}{unit} vs theory {r['theory']:.4g}{unit} "
                    f"(allowance ±{3 * r['se'] + r['bias']:.2g} = 3 s.e. + bias {r['bias']:.2g}); "
                    f"{len(rows)} row(s)")


def spectrum_rows(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (activation, init, L): Var(λ) measured, L(v_W + v_D), s.e. and the
    finite-width bias L²/n (the order of the 1/n corrections to the free-probability limit:
    an independent Monte Carlo of Gaussian linear chains at n = 400 gives 8.18 ± 0.07 at L = 8
    against 8, i.e. 0.18 ≈ L²/n = 0.16)."""
    d = _newest(df, ["activation", "init", "depth"])
    return pd.DataFrame({
        "activation": d["activation"], "init": d["init"], "depth": d["depth"].astype(int),
        "measured": d["lambda_var"], "theory": d["lambda_var_theory"],
        "se": _se(d["lambda_var_std"], d["seeds"]),
        "bias": d["depth"].astype(float) ** 2 / d["width"].astype(float)})


def phase_rows(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (σ_w², σ_b²): χ₁, χ_c, ξ_c measured and theory, their s.e., n and L."""
    d = _newest(df, ["alpha", "bias"])
    return pd.DataFrame({
        "sigma_w2": d["alpha"].astype(float) ** 2, "sigma_b2": d["bias"].astype(float) ** 2,
        "chi1": d["chi1"], "chi1_theory": d["chi1_theory"], "chi1_se": _se(d["chi1_std"], d["seeds"]),
        "chi_c": d["chi_c"], "chi_c_se": _se(d["chi_c_std"], d["seeds"]), "xi_c": d["xi_c"],
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
    """ξ_c = −1/ln χ_c (215.4) measured vs theory at the cells whose theory ξ_c ≤
    L/(2 ln 50) (:data:`XI_RESOLVED`: the layers averaged are at the fixed point); s.e.
    ξ²·s.e.(χ_c)/χ_c (the derivative of −1/ln χ_c), bias ξ²/n (χ_c's 1/n correction carried
    the same way)."""
    ok = t[(t["xi_c_theory"] <= t["depth"] / XI_RESOLVED) & (t["chi_c"] > 0)]
    xi = ok["xi_c_theory"]
    rows = ok.assign(measured=ok["xi_c"], theory=xi, se=xi**2 * ok["chi_c_se"] / ok["chi_c"],
                     bias=xi**2 / ok["width"])
    return worst(rows, _cell, " layers")


def relu_rows(t: pd.DataFrame, seeds: int) -> pd.DataFrame:
    """:func:`~analysis.meanfield.figures.relu_collapse_table` with the s.e. of 1 − c_l."""
    return t.assign(se=_se(t["gap_std"], np.full(len(t), seeds)))


def bn_rows(df: pd.DataFrame) -> pd.DataFrame:
    d = _newest(df.assign(arch=[architecture(r) for _, r in df.iterrows()]), ["arch", "depth"])
    return pd.DataFrame({"arch": d["arch"], "depth": d["depth"].astype(int),
                         "grad_growth": d["grad_growth"],
                         "grad_growth_se": _se(d["grad_growth_std"], d["seeds"]),
                         "autocorr": d["shattered_autocorr_final"],
                         "autocorr_se": _se(d["shattered_autocorr_final_std"], d["seeds"]),
                         "points": d["task.options.shattered.points"].astype(float)
                         if "task.options.shattered.points" in d else 256.0,
                         "width": d["width"].astype(float), "beta": d["beta_eff"].astype(float)
                         if "beta_eff" in d else 1.0})


def residual_rows(runs: Runs, df: pd.DataFrame) -> pd.DataFrame:
    """One row per run and layer: q_l, c_l, their s.e., (1+β²)^l q_0, the residual map, its
    ODE at t = l/L (τ = β²L) and n."""
    out = []
    for _, r in _newest(df, ["beta_scaling", "depth", "width"]).iterrows():
        depth, beta, seeds = int(r["depth"]), float(r["beta_eff"]), int(r["seeds"])
        steps, q = runs.series(r["run_id"], "mf_q")
        _, c = runs.series(r["run_id"], "mf_c")
        qs = runs.series(r["run_id"], "mf_q_std")[1] if seeds > 1 else np.full_like(q, np.nan)
        cs = runs.series(r["run_id"], "mf_c_std")[1] if seeds > 1 else np.full_like(c, np.nan)
        out.append(pd.DataFrame({
            "beta_scaling": r["beta_scaling"], "depth": depth, "beta": beta, "layer": steps,
            "width": float(r["width"]), "q0": float(q[0]), "q": q, "q_se": _se(qs, np.full(len(q), seeds)),
            "q_theory": q[0] * (1 + beta**2) ** steps, "c": c, "c_se": _se(cs, np.full(len(c), seeds)),
            "c_map": theory.residual_relu_correlation(float(c[0]), depth, beta)[steps],
            "c_ode": theory.residual_relu_correlation_ode(float(c[0]), steps / depth, beta**2 * depth)}))
    return pd.concat(out, ignore_index=True)


def _spectrum(runs: Runs) -> pd.DataFrame:
    return spectrum_rows(runs("mf_spectrum"))


def _relu(runs: Runs) -> pd.DataFrame:
    df = runs("mf_relu_collapse")
    return relu_rows(relu_collapse_table(df, runs.uri), int(df["seeds"].min()))


def _residual(runs: Runs) -> pd.DataFrame:
    return residual_rows(runs, runs("mf_residual"))


def _trainability(runs: Runs) -> pd.DataFrame:

    return trainability_table(runs("mf_trainability"))


def _deep_linear(runs: Runs) -> pd.DataFrame:
    return deep_linear_table(runs("deep_linear"), runs.uri)


#: table name → how it is built from the runs (once per store, ``Runs.cache``)
TABLES: dict[str, Callable[[Runs], pd.DataFrame]] = {
    "spectrum": _spectrum, "spectrum_runs": lambda runs: runs("mf_spectrum"),
    "phase": lambda runs: phase_rows(runs("mf_phase")), "relu": _relu,
    "bn": lambda runs: bn_rows(runs("mf_bn")), "residual": _residual,
    "trainability": _trainability, "deep_linear": _deep_linear,
    "deep_linear_runs": lambda runs: runs("deep_linear"),
}


#: claim id → (table name, pure function of that table)
FUNCTIONS: dict[str, tuple[str, Callable[[pd.DataFrame], Measured]]] = {}


def _claim(cid: str, statement: str, source: str, study: str, table: str, fn, check: Check = WITHIN,
           size: str = "cpu") -> Claim:
    FUNCTIONS[cid] = (table, fn)

    def measure(runs: Runs) -> Measured:
        key = f"meanfield.{table}"
        if key not in runs.cache:
            try:
                runs.cache[key] = TABLES[table](runs)
            except KeyError as e:
                raise NotRun(f"the runs lack the column {e}") from e
        return fn(runs.cache[key])

    return Claim(cid, statement, source, study, check, measure, size=size)


MF_PHASE = (
    _claim("mf_phase.chi1", "χ₁ = σ_w² E[φ′(√q* z)²] is the mean squared singular value of a "
           "layer Jacobian (tanh, every (σ_w², σ_b²))", "science.md §5 (215.3)", "χ₁ theory",
           "phase", phase_chi1),
    _claim("mf_phase.sides", "Ordered where χ₁ < 1, chaotic where χ₁ > 1: every cell is on the "
           "side of the critical line the theory puts it", "science.md §5 (215.3)", "0 cells",
           "phase", phase_sides, at_most(0)),
    _claim("mf_phase.xi_c", "The depth scale ξ_c = −1/ln χ_c (tanh, cells with ξ_c ≤ L/(2 ln 50))",
           "science.md §5 (215.4)", "ξ_c theory", "phase", phase_xi),
)


COMMANDS = {
    'mf_phase': MF_PHASE_COMMAND,
}


EXPERIMENTS = (
    Experiment(
        "mf_phase",
        "Phase diagram: χ₁ and ξ_c over (σ_w², σ_b²)",
        "science.md §5 (215.1–215.4)",
        analyses=(
            "mf_phase -e mf_phase",
        ),
        claims=MF_PHASE,
        needs=Needs(gpu_full=True),
    ),
)
