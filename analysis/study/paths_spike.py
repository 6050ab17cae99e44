"""Path orders (Figure 3) and the mean spike (Figure 7) from logged ``task=measure`` runs.

Commands (``python -m analysis <command> --help``):

* ``paths`` (experiment ``fig3``, probe ``path_order``) — the normalized path-order profile
  ``μ_k / Σ_j μ_j``, ``μ_k = ‖β^k S_k‖_F`` (Eq. 5/11/12), one panel per β scaling and one
  line per α; and the mean path order ``⟨k⟩`` against βα^M, which is one curve whatever
  β and α are.  Overlay: the *uncorrelated* prediction of :mod:`rankexp.theory` — the energy
  profile ``μ_k² / Σ μ_j²`` is Poisson-binomial with success probabilities ``ρ_l/(1+ρ_l)``,
  ``ρ_l = p r̃_l²`` (Eq. 22 for Pre-Norm, ``r̃ = βα^M`` for Post-Norm; p, κ of the activation
  at unit variance), i.e. Binomial(L, ρ/(1+ρ)) at constant ρ; the μ profile is its square root,
  renormalized.  Exact in law for positively homogeneous σ (relu, abs, leaky_relu, linear).
* ``spike`` (experiment ``fig7``, probe ``representation``) — per M (rows): the cross-layer
  cosines against the coherence c of Table 1 (per input ``cos(b_l(x), b_k(x))`` and of the
  branch means ``cos(m_l, m_k)``; M = 1 predicts c, 1/π for ReLU, M = 2 predicts 0),
  ``‖Σ_{k≤l} m_k‖`` against l on log–log axes with ∝ l and ∝ √l guides, and ``erank(Z_l)/d``
  against l; one colour per σ, one line style per probe count n.

Series (step = path order or layer) are read with :func:`analysis.core.select.series`.
An experiment without finished runs, or runs without the probe's metrics, raise
:class:`~analysis.core.select.SelectionError`: ``python -m analysis`` prints it, exit status 2.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
import pandas as pd

from rankexp.theory import activation_constants, prenorm_branch_ratio, uncorrelated_path_profile

from ..core import style
from ..core.runner import Command, out_dir, set_experiment_default
from ..core.select import PLACEMENT, load, series, warn_mixed
from ..core.style import save

log = logging.getLogger("analysis")

BETA_SCALINGS = ("const", "inv_sqrt_depth", "inv_depth")
SCALING_LABEL = {"const": "", "inv_sqrt_depth": r"/\sqrt{L}", "inv_depth": "/L"}
PROBE_N = "task.options.representation.n"
DEFAULT_N = 1024  # the representation probe's default number of probe inputs


# --------------------------------------------------------------------------- paths (Figure 3)
def uncorrelated_orders(ratio: float, depth: int, activation: str, placement: str) -> np.ndarray:
    """Energy profile ``μ_k² / Σ_j μ_j²`` over k = 0…L if paths were uncorrelated, ``(L+1,)``.

    ``ρ_l = p r̃_l²`` with ``r̃_l`` from Eq. 22 (Pre-Norm) or ``r̃ = βα^M`` (Post-Norm), p and
    κ of ``activation`` at unit preactivation variance (:func:`rankexp.theory.activation_constants`);
    then :func:`rankexp.theory.uncorrelated_path_profile` (Poisson-binomial).

    Raises:
        ValueError: a placement other than ``pre`` / ``post`` (no closed-form ratio).
    """
    k = activation_constants(activation, 1.0)
    layers = np.arange(1, depth + 1)
    if placement == "pre":
        r = prenorm_branch_ratio(layers, ratio, k.kappa)
    elif placement == "post":
        r = np.full(depth, float(ratio))
    else:
        raise ValueError(f"no branch-ratio prediction for norm placement {placement!r} (pre, post)")
    return uncorrelated_path_profile(k.survival * r**2)


def mean_orders(energy: np.ndarray) -> tuple[float, float]:
    """``(⟨k⟩ under μ_k, ⟨k⟩ under μ_k²)`` of an energy profile ``μ_k²/Σμ²``."""
    k = np.arange(energy.size)
    mu = np.sqrt(np.clip(energy, 0, None))
    return float((k * mu).sum() / mu.sum()), float((k * energy).sum())


def beta_label(beta: float, scaling: str) -> str:
    """``$\\beta = 1/\\sqrt{L}$`` for β = 1 with scaling inv_sqrt_depth."""
    suffix = SCALING_LABEL.get(scaling, rf"\cdot\mathrm{{{scaling}}}")
    return rf"$\beta = {beta:g}{suffix}$"


def paths_tables(df: pd.DataFrame, uri: str | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-run summary and the long table of profiles (measured and uncorrelated theory).

    Summary columns: the run's β, α, βα^M, ``mean_path_order`` (+ ``_std`` over seeds),
    ``mean_path_order_energy``, ``mean_path_order_uncorrelated`` (logged: Poisson-binomial with
    the *measured* r_l), ``*_theory`` (Eq. 22 ratios), ``path_order_peak``; index = run_id.
    Profiles: one row per (run, k) with ``profile`` = μ_k/Σμ and ``theory`` (μ form).
    """
    rows, prof = [], []
    for _, rec in df.iterrows():
        depth, act, place = int(rec["depth"]), str(rec["activation"]), str(rec[PLACEMENT])
        try:
            energy = uncorrelated_orders(float(rec["nominal_ratio"]), depth, act, place)
            th_mu, th_en = mean_orders(energy)
        except ValueError as e:
            log.warning("%s: no theory overlay", e)
            energy, th_mu, th_en = None, np.nan, np.nan
        rows.append(
            {
                "run_id": rec["run_id"],
                "beta_scaling": rec["beta_scaling"],
                "beta": rec["beta"],
                "beta_eff": rec["beta_eff"],
                "alpha": rec["alpha"],
                "depth": depth,
                "nominal_ratio": rec["nominal_ratio"],
                "mean_path_order": rec["mean_path_order"],
                "mean_path_order_std": rec.get("mean_path_order_std", np.nan),
                "mean_path_order_theory": th_mu,
                "mean_path_order_energy": rec["mean_path_order_energy"],
                "mean_path_order_energy_std": rec.get("mean_path_order_energy_std", np.nan),
                "mean_path_order_energy_theory": th_en,
                "mean_path_order_uncorrelated": rec.get("mean_path_order_uncorrelated", np.nan),
                "path_order_peak": rec["path_order_peak"],
            }
        )
        steps, values = series(uri, rec["run_id"], "path_profile")
        theory = np.full(steps.size, np.nan)
        if energy is not None:
            mu = np.sqrt(np.clip(energy, 0, None))
            mu /= mu.sum()
            ok = steps < mu.size
            theory[ok] = mu[steps[ok].astype(int)]
        prof.append(
            pd.DataFrame(
                {
                    "run_id": rec["run_id"],
                    "beta_scaling": rec["beta_scaling"],
                    "beta": rec["beta"],
                    "alpha": rec["alpha"],
                    "k": steps.astype(int),
                    "profile": values,
                    "theory": theory,
                }
            )
        )
    return pd.DataFrame(rows).set_index("run_id"), pd.concat(prof, ignore_index=True)


def _scalings(values) -> list[str]:
    values = list(dict.fromkeys(values))
    return sorted(values, key=lambda s: (BETA_SCALINGS.index(s) if s in BETA_SCALINGS else 9, s))


def draw_profiles(profiles: pd.DataFrame, summary: pd.DataFrame):
    """One panel per (β, β scaling); one line per α (mean over its runs), theory dashed."""
    panels = summary[["beta", "beta_scaling"]].drop_duplicates()
    order = {sc: i for i, sc in enumerate(_scalings(panels["beta_scaling"]))}
    panels = sorted(panels.itertuples(index=False), key=lambda p: (order[p.beta_scaling], -p.beta))
    alphas = sorted(summary["alpha"].unique())
    colors, sm = style.value_colors(alphas, "viridis")
    mean = profiles.groupby(["beta", "beta_scaling", "alpha", "k"])[["profile", "theory"]].mean()
    visible = mean.index.get_level_values("k")[mean["profile"] > 1e-3 * mean["profile"].max()]
    kmax = max(10, int(visible.max()) + 2) if len(visible) else 10
    fig, axes = style.panels(len(panels), max_cols=3, aspect=0.8, sharey=True)
    for ax, p in zip(axes, panels, strict=True):
        for a in alphas:
            key = (p.beta, p.beta_scaling, a)
            if key not in mean.index.droplevel("k"):
                continue
            t = mean.loc[key]
            ax.plot(t.index, t["profile"], "o-", ms=2.5, color=colors[a])
            ax.plot(t.index, t["theory"], "--", color=colors[a], lw=0.8)
        ax.set_xlim(-0.5, kmax)
        ax.set_xlabel("path order $k$")
        ax.set_title(beta_label(p.beta, p.beta_scaling))
    axes[0].set_ylabel(style.name("path_profile"))
    axes[0].plot([], [], **style.THEORY, label=r"uncorrelated: $\sqrt{\mathrm{Binomial}(L, \rho/(1+\rho))}$")
    axes[0].legend(loc="upper right")
    style.colorbar(fig, sm, axes, "alpha")
    return fig


def draw_mean_order(summary: pd.DataFrame, df: pd.DataFrame):
    """⟨k⟩ (μ-weighted and energy-weighted) against βα^M, markers per β scaling, theory curve."""
    fig, axes = style.panels(2, aspect=0.8)
    markers = dict(zip(BETA_SCALINGS, "osD", strict=True))
    lo, hi = summary["nominal_ratio"].min(), summary["nominal_ratio"].max()
    grid = np.geomspace(lo / 1.5, hi * 1.5, 80)
    contexts = df[["depth", "activation", PLACEMENT]].drop_duplicates()
    for ax, col, what in (
        (axes[0], "mean_path_order", r"$\langle k\rangle$ under $\mu_k$"),
        (axes[1], "mean_path_order_energy", r"$\langle k\rangle$ under $\mu_k^2$"),
    ):
        groups = summary.groupby(["beta", "beta_scaling"])
        order = {sc: i for i, sc in enumerate(_scalings(summary["beta_scaling"]))}
        for (beta, scaling), g in sorted(groups, key=lambda kv: (order[kv[0][1]], -kv[0][0])):
            ax.errorbar(
                g["nominal_ratio"],
                g[col],
                yerr=g[f"{col}_std"] if f"{col}_std" in g else None,
                fmt=markers.get(scaling, "^"),
                ms=4,
                mfc="none",
                lw=0.6,
                label=beta_label(beta, scaling),
            )
        for ctx in contexts.itertuples(index=False):
            depth, act, place = int(ctx[0]), str(ctx[1]), str(ctx[2])
            try:
                th = np.array(
                    [mean_orders(uncorrelated_orders(r, depth, act, place)) for r in grid]
                )
            except ValueError:
                continue
            ax.plot(
                grid,
                th[:, 0 if col == "mean_path_order" else 1],
                **{**style.THEORY, "ls": "-"},
                label=f"uncorrelated ({style.value_label(PLACEMENT, place)}, "
                f"{style.value_label('activation', act)}, $L = {depth}$)",
            )
        if (
            col == "mean_path_order_energy"
            and summary["mean_path_order_uncorrelated"].notna().any()
        ):
            ax.plot(
                summary["nominal_ratio"],
                summary["mean_path_order_uncorrelated"],
                "k.",
                ms=3,
                label=r"uncorrelated, measured $r_\ell$",
            )
        ax.set_xscale("log")
        ax.set_xlabel(style.name("nominal_ratio"))
        ax.set_ylabel(what)
        ax.legend()
    return fig


def _paths_arguments(p: argparse.ArgumentParser) -> None:
    set_experiment_default(p, "fig3")


def _paths_main(args: argparse.Namespace) -> list[Path]:
    needs = [
        "alpha",
        "beta",
        "beta_eff",
        "beta_scaling",
        "depth",
        "activation",
        PLACEMENT,
        "nominal_ratio",
        "mean_path_order",
        "mean_path_order_energy",
        "path_order_peak",
    ]
    df = load(args, needs, probe="path_order")
    warn_mixed(df, (), args.experiment,
               keys=("width", "depth", "matrices", "expansion", "activation", PLACEMENT, "norm.op"))
    summary, profiles = paths_tables(df, args.uri)
    out = out_dir(args)
    fig = draw_profiles(profiles, summary)
    fig.suptitle(r"Figure 3: path-order profile $\mu_k = \|\beta^k S_k\|_F$ (Eq. 11)")
    style.caption(fig, df, args.experiment, ["lines: mean over seeds"])
    paths = save(fig, out, "paths_profile", profiles.set_index(["run_id", "k"]))
    fig = draw_mean_order(summary, df)
    fig.suptitle(r"Figure 3: mean path order vs $\beta\alpha^M$")
    style.caption(fig, df, args.experiment, ["error bars: ±1 s.d. over seeds"])
    paths += save(fig, out, "paths_mean_order", summary.sort_values("nominal_ratio"))
    return paths


PATHS_COMMAND = Command(_paths_arguments, _paths_main, "Figure 3: path-order profiles μ_k per β/α and ⟨k⟩ "
                        "vs βα^M with the uncorrelated prediction")


# --------------------------------------------------------------------------- spike (Figure 7)
def spike_table(df: pd.DataFrame) -> pd.DataFrame:
    """Scalars of the mean spike per (M, σ, n), mean over runs.

    Columns: ``branch_input_cos_cross`` (per-input cross-layer cosine), ``branch_mean_cos_cross``
    (cosine between branch means), ``c_prediction`` (the coherence c at the measured
    preactivation variance for M = 1, 0 for M = 2), ``branch_mean_sum_exponent`` (log–log slope
    of ‖Σ m_k‖: 1 aligned, ½ random), ``rep_erank_final``, ``rep_erank_min``, ``branch_mean_snr``,
    ``runs``.
    """
    cols = [
        "branch_input_cos_cross",
        "branch_mean_cos_cross",
        "coherence_theory",
        "branch_mean_sum_exponent",
        "rep_erank_final",
        "rep_erank_min",
        "branch_mean_snr",
        "branch_input_cos_cross_std",
        "branch_mean_cos_cross_std",
    ]
    cols = [c for c in cols if c in df]
    t = df.groupby(["matrices", "activation", "n"])[cols].mean()
    t["runs"] = df.groupby(["matrices", "activation", "n"]).size()
    m = t.index.get_level_values("matrices").to_numpy()
    t.insert(2, "c_prediction", np.where(m == 1, t["coherence_theory"], 0.0))
    return t


def _activation_order(values) -> list[str]:
    order = ["relu", "gelu", "tanh", "swiglu", "silu", "abs", "leaky_relu", "linear"]
    values = list(dict.fromkeys(values))
    return sorted(values, key=lambda a: (order.index(a) if a in order else 99, a))


def draw_spike(df: pd.DataFrame, table: pd.DataFrame, uri: str | None):
    """Rows = M; columns = cosines vs c, ‖Σ m_k‖ vs l (log–log), erank(Z_l)/d vs l."""
    ms = sorted(df["matrices"].unique())
    acts = _activation_order(df["activation"])
    ns = sorted(df["n"].unique())
    colors = {a: f"C{k % 10}" for k, a in enumerate(acts)}
    styles = dict(zip(reversed(ns), ["-", "--", ":", "-."] * 4, strict=False))
    fig, axes = style.grid(len(ms), 3, aspect=0.8)
    cos = table[["branch_input_cos_cross", "branch_mean_cos_cross", "c_prediction"]].to_numpy()
    # headroom above the bars for the legend
    cos_lim = (min(-0.02, np.nanmin(cos) - 0.02), max(0.05, 1.7 * np.nanmax(cos) + 0.05))
    for i, m in enumerate(ms):
        ax = axes[i, 0]
        # per activation, the row of the largest n it was run with (the least noisy means)
        sub = table.xs(m, level="matrices").reset_index().sort_values("n")
        sub = sub.groupby("activation").last()
        sub = sub.reindex([a for a in acts if a in sub.index])
        x = np.arange(len(sub))
        ax.bar(x - 0.2, sub["branch_input_cos_cross"], 0.4, color="C0",
               yerr=sub.get("branch_input_cos_cross_std"), error_kw={"elinewidth": 0.6},
               label=f"per input {style.name('branch_input_cos_cross')}")
        ax.bar(x + 0.2, sub["branch_mean_cos_cross"], 0.4, color="C1",
               yerr=sub.get("branch_mean_cos_cross_std"), error_kw={"elinewidth": 0.6},
               label=f"branch means {style.name('branch_mean_cos_cross')}")
        ax.plot(
            x,
            sub["c_prediction"],
            "k_",
            ms=16,
            mew=1.5,
            label=r"$c_\sigma$ (Table 1)" if m == 1 else "prediction 0",
        )
        if m == 1:
            ax.axhline(1 / np.pi, **style.THEORY, label=r"$1/\pi$ (ReLU)")
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_xticks(x, [style.value_label("activation", a) for a in sub.index])
        ax.grid(axis="x", visible=False)
        ax.set_ylim(*cos_lim)  # the same scale in every row: M = 2's ≈ 0 beside M = 1's c
        ax.set_ylabel("cross-layer cosine")
        ax.set_title(f"$M = {m}$: cross-layer cosines")
        ax.legend(loc="upper right", fontsize=5.5)
        first = []
        for _, rec in df[df["matrices"] == m].iterrows():
            c, ls = colors[rec["activation"]], styles[rec["n"]]
            steps, v = series(uri, rec["run_id"], "branch_mean_sum_norm")
            axes[i, 1].loglog(steps, v, ls, color=c, lw=1.1)
            first.append(v[0])
            steps, v = series(uri, rec["run_id"], "rep_erank")
            axes[i, 2].plot(steps, v, ls, color=c, lw=1.1)
        if first:
            l = np.geomspace(1, df["depth"].max(), 50)
            a = float(np.median(first))
            axes[i, 1].loglog(l, a * l, **style.THEORY, label=r"coherent $\propto \ell$")
            axes[i, 1].loglog(l, a * np.sqrt(l), color="k", ls=":", lw=0.9,
                              label=r"uncorrelated $\propto \sqrt{\ell}$")
        axes[i, 1].set_xlabel(style.name("layer"))
        axes[i, 1].set_ylabel(style.name("branch_mean_sum_norm"))
        axes[i, 1].set_title(f"$M = {m}$: accumulated branch mean")
        axes[i, 1].legend(fontsize=5.5, loc="lower right")
        axes[i, 2].set_xlabel(style.name("layer"))
        axes[i, 2].set_ylabel(style.name("rep_erank"))
        axes[i, 2].set_ylim(0, 1.02)
        axes[i, 2].set_title(f"$M = {m}$: representation rank")
    # one key for colour (σ) and line style (n) instead of an entry per line
    for a in acts:
        axes[0, 2].plot([], [], color=colors[a], label=style.value_label("activation", a))
    for n in sorted(ns):
        axes[0, 2].plot([], [], styles[n], color="0.3", label=f"$n = {int(n)}$")
    axes[0, 2].legend(fontsize=5.5, ncol=2, loc="upper right")
    return fig


def _spike_arguments(p: argparse.ArgumentParser) -> None:
    set_experiment_default(p, "fig7")


def _spike_main(args: argparse.Namespace) -> list[Path]:
    needs = [
        "matrices",
        "activation",
        "depth",
        "branch_input_cos_cross",
        "branch_mean_cos_cross",
        "coherence_theory",
        "branch_mean_sum_exponent",
        "rep_erank_final",
    ]
    df = load(args, needs, probe="representation")
    df = df.assign(n=df[PROBE_N].astype(float) if PROBE_N in df else float(DEFAULT_N))
    df["n"] = df["n"].fillna(DEFAULT_N).astype(int)
    warn_mixed(df, (), args.experiment, keys=("width", "depth", "expansion", PLACEMENT, "alpha", "beta"))
    table = spike_table(df)
    fig = draw_spike(df, table, args.uri)
    fig.suptitle("Figure 7: the mean spike")
    style.caption(fig, df, args.experiment, [
        f"$n \\in \\{{{', '.join(str(int(n)) for n in sorted(df['n'].unique()))}\\}}$ probe inputs",
        "bars: largest $n$, ±1 s.d. over seeds"])
    return save(fig, out_dir(args), "spike", table)


SPIKE_COMMAND = Command(_spike_arguments, _spike_main, "Figure 7: mean spike — cross-layer cosines vs c, "
                        "‖Σ m_k‖ vs l, erank(Z_l)/d vs l, per M and σ")
COMMANDS = {"paths": PATHS_COMMAND, "spike": SPIKE_COMMAND}
