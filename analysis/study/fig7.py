"""Figure 7: the mean spike: the command ``spike``, the claims and the registry entry."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd

from rankexp.theory import activation_constants

from ..core import style
from ..core.claims import Claim, Measured, NotRun, Runs, at_most, near, seed_std
from ..core.registry import Experiment, Needs
from ..core.runner import Command, out_dir
from ..core.select import PLACEMENT, load, need, only, ordered, series, warn_mixed
from . import extreme, mean_ratio, publish, worst

PROBE_N = "task.options.representation.n"

DEFAULT_N = 1024  # the representation probe's default number of probe inputs

FIG7_ORDER = ["relu", "gelu", "tanh", "swiglu", "silu", "abs", "leaky_relu", "linear"]


def spike_table(df: pd.DataFrame) -> pd.DataFrame:
    """Mean spike scalars per (M, σ, n): cross-layer cosines (per input, of branch means),
    ``c_prediction`` (c for M = 1, 0 for M = 2), ``branch_mean_sum_exponent`` (1 aligned,
    ½ random), ``rep_erank_final``, ``rep_erank_min``, ``branch_mean_snr``, ``runs``."""
    cols = ["branch_input_cos_cross", "branch_mean_cos_cross", "coherence_theory",
            "branch_mean_sum_exponent", "rep_erank_final", "rep_erank_min", "branch_mean_snr",
            "branch_input_cos_cross_std", "branch_mean_cos_cross_std"]
    cols = [c for c in cols if c in df]
    t = df.groupby(["matrices", "activation", "n"])[cols].mean()
    t["runs"] = df.groupby(["matrices", "activation", "n"]).size()
    m = t.index.get_level_values("matrices").to_numpy()
    t.insert(2, "c_prediction", np.where(m == 1, t["coherence_theory"], 0.0))
    return t


def draw_spike(df: pd.DataFrame, table: pd.DataFrame, uri: str | None):
    """Rows = M; columns = cosines vs c, ‖Σ m_k‖ vs l (log–log), erank(Z_l)/d vs l."""
    ms = sorted(df["matrices"].unique())
    acts = ordered(df["activation"], FIG7_ORDER)
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
        for dx, c, col, what in ((-0.2, "C0", "branch_input_cos_cross", "per input"),
                                 (0.2, "C1", "branch_mean_cos_cross", "branch means")):
            ax.bar(x + dx, sub[col], 0.4, color=c, yerr=sub.get(f"{col}_std"),
                   error_kw={"elinewidth": 0.6}, label=f"{what} {style.name(col)}")
        ax.plot(x, sub["c_prediction"], "k_", ms=16, mew=1.5,
                label=r"$c_\sigma$ (Table 1)" if m == 1 else "prediction 0")
        if m == 1:
            ax.axhline(1 / np.pi, **style.THEORY, label=r"$1/\pi$ (ReLU)")
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_xticks(x, [style.value_label("activation", a) for a in sub.index])
        ax.grid(axis="x", visible=False)
        # the same scale in every row: M = 2's ≈ 0 beside M = 1's c
        ax.set(ylim=cos_lim, ylabel="cross-layer cosine", title=f"$M = {m}$: cross-layer cosines")
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
        axes[i, 1].set(xlabel=style.name("layer"), ylabel=style.name("branch_mean_sum_norm"),
                       title=f"$M = {m}$: accumulated branch mean")
        axes[i, 1].legend(fontsize=5.5, loc="lower right")
        axes[i, 2].set(xlabel=style.name("layer"), ylabel=style.name("rep_erank"), ylim=(0, 1.02),
                       title=f"$M = {m}$: representation rank")
    # one key for colour (σ) and line style (n) instead of an entry per line
    for a in acts:
        axes[0, 2].plot([], [], color=colors[a], label=style.value_label("activation", a))
    for n in sorted(ns):
        axes[0, 2].plot([], [], styles[n], color="0.3", label=f"$n = {int(n)}$")
    axes[0, 2].legend(fontsize=5.5, ncol=2, loc="upper right")
    return fig


def _spike_main(args: argparse.Namespace) -> list[Path]:
    needs = ["matrices", "activation", "depth", "branch_input_cos_cross", "branch_mean_cos_cross",
             "coherence_theory", "branch_mean_sum_exponent", "rep_erank_final"]
    df = load(args, needs, probe="representation")
    df = df.assign(n=df[PROBE_N].astype(float) if PROBE_N in df else float(DEFAULT_N))
    df["n"] = df["n"].fillna(DEFAULT_N).astype(int)
    warn_mixed(df, (), args.experiment, keys=("width", "depth", "expansion", PLACEMENT, "alpha", "beta"))
    table = spike_table(df)
    ns = ", ".join(str(int(n)) for n in sorted(df["n"].unique()))
    return publish(draw_spike(df, table, args.uri), "The mean spike: cross-layer cosines, branch mean and rank", df, args.experiment,
                   [f"$n \\in \\{{{ns}\\}}$ probe inputs", "bars: largest $n$, ±1 s.d. over seeds"],
                   out_dir(args), "spike", table)


def _spike_runs(runs: Runs, m: int) -> pd.DataFrame:
    df = only(runs("fig7"), matrices=m)
    need(df, "branch_input_cos_cross")
    if PROBE_N in df:  # the largest probe count: the least noisy means
        df = df[df[PROBE_N] == df[PROBE_N].max()]
    return df.reset_index(drop=True)


def _cos_relu(runs: Runs) -> Measured:
    df = only(_spike_runs(runs, 1), activation="relu")
    return Measured(float(df["branch_input_cos_cross"].mean()),
                    seed_std(df, "branch_input_cos_cross"))


def coherence_gap(df: pd.DataFrame, metric: str, what: str, note: str = "") -> Measured:
    """Largest |mean ``metric`` − c_σ| over the activations σ of ``df`` (c at unit variance)."""
    return worst({a: abs(g[metric].mean() - activation_constants(a, 1.0).coherence)
                  for a, g in df.groupby("activation")}, what, note)


def _cos_c(runs: Runs) -> Measured:
    return coherence_gap(_spike_runs(runs, 1), "branch_input_cos_cross", "max",
                         "; c at unit variance")


def _cos_zero(runs: Runs) -> Measured:
    return extreme(_spike_runs(runs, 2), "branch_input_cos_cross",
                   lambda r: f"max |cos| over σ (worst: {r['activation']})", absolute=True)


def _exponent(m: int):
    def measure(runs: Runs) -> Measured:
        df = _spike_runs(runs, m)
        need(df, "branch_mean_sum_exponent")
        if m == 1:  # the coherent drift needs a spike: σ with c > 0
            df = df[[activation_constants(a, 1.0).coherence > 0.05 for a in df["activation"]]]
            if df.empty:
                raise NotRun("no M = 1 run of a σ with c > 0.05")
        return Measured(float(df["branch_mean_sum_exponent"].mean()),
                        seed_std(df, "branch_mean_sum_exponent"),
                        f"log–log slope of ‖Σ m_k‖, mean over σ ∈ {sorted(df['activation'].unique())}")

    return measure


def _rep_collapse(runs: Runs) -> Measured:
    one = only(_spike_runs(runs, 1), activation="relu")
    need(one, "rep_erank_final")
    return mean_ratio(runs, one, only(_spike_runs(runs, 2), activation="relu"), "rep_erank_final",
                      "erank(Z_L)/d: M = 1 ÷ M = 2, ReLU")


FIG7 = (
    Claim("fig7.cos_relu", "M = 1, ReLU: cross-layer cosine = c = 1/π",
          "the study, fig7", "0.318", near(1 / math.pi, 0.03), _cos_relu),
    Claim("fig7.cos_c", "M = 1: cross-layer cosine = c_σ of each σ (Table 1)",
          "the study, fig7", "c_σ", at_most(0.03), _cos_c),
    Claim("fig7.cos_zero", "M = 2: cross-layer cosines ≈ 0", "the study, fig7",
          "≈ 0", at_most(0.03), _cos_zero),
    Claim("fig7.sum_linear", "M = 1: ‖Σ_k m_k‖ ∝ l", "the study, fig7",
          "1 (exponent)", near(1.0, 0.15), _exponent(1)),
    Claim("fig7.sum_sqrt", "M = 2: ‖Σ_k m_k‖ ∝ √l", "the study, fig7",
          "0.5 (exponent)", near(0.5, 0.15), _exponent(2)),
    Claim("fig7.rep_collapse_m1", "erank(Z_l) collapses only for M = 1",
          "the study, fig7", "≪ 1 (ratio)", at_most(0.5), _rep_collapse))

COMMANDS = {"spike": Command(
    _spike_main,
    "Figure 7: mean spike — cross-layer cosines vs c, ‖Σ m_k‖ vs l, erank(Z_l)/d vs l, per M and σ",
    experiment="fig7")}

EXPERIMENTS = (
    Experiment("fig7", "Figure 7: the mean spike", "the study, fig7",
               analyses=("spike --experiment fig7",), claims=FIG7, needs=Needs(gpu_full=True)),)
