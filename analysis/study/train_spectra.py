"""Spectra during training: the fig6 grid probed at log-spaced optimizer steps: the command
``train-spectra``, the claims and the registry entry."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from ..core import style
from ..core.claims import Claim, Measured, NotRun, Runs, above, at_least, at_most
from ..core.registry import Experiment, Needs
from ..core.runner import Command, out_dir, set_experiment_default
from ..core.select import PLACEMENT, PLACEMENT_ORDER, SelectionError, load, ordered, series
from ..core.style import save
from .fig6_train import run_lrs

EXPERIMENT = "train_spectra"

#: the probed quantities drawn, in row order (per-member scalars of the probes)
QUANTITIES = ("erank_io", "branch_ratio_last", "mean_path_order", "rep_erank_final")

#: erank/d at or below which a network counts as collapsed (the study, fig6: Post-Norm
#: trains at chance where its rank ≤ 1–2 % of width)
COLLAPSE = 0.02

#: the Pre-Norm floor of erank/d (the study, reference magnitudes: ≈ 0.2 across the grid)
PRE_FLOOR = 0.2


def spectra_table(uri: str | None, runs: pd.DataFrame, quantities=QUANTITIES) -> pd.DataFrame:
    """One row per (run, lr, quantity, step): run_id, norm.placement, alpha, depth, lr, diverged,
    quantity, step, value."""
    rows = []
    for _, run in runs.iterrows():
        lrs = run_lrs(run.dropna().to_frame().T)
        if not lrs:
            raise SelectionError(f"run {run['run_id']} has no per-LR metrics: a task=train run?")
        for k, lr in lrs.items():
            diverged = bool(run.get(f"diverged_lr{k}", 0.0) or 0.0)
            for q in quantities:
                steps, values = series(uri, run["run_id"], f"{q}_lr{k}")
                rows += [(run["run_id"], run[PLACEMENT], float(run["alpha"]), int(run["depth"]), lr,
                          diverged, q, int(s), float(v)) for s, v in zip(steps, values, strict=True)]
    return pd.DataFrame(rows, columns=["run_id", PLACEMENT, "alpha", "depth", "lr", "diverged",
                                       "quantity", "step", "value"])


def init_and_final(table: pd.DataFrame, quantity: str) -> pd.DataFrame:
    """Per non-diverged (run, lr): ``init``, ``final``, ``low`` (min over steps) of ``quantity``."""
    t = table[(table["quantity"] == quantity) & ~table["diverged"]]
    if t.empty:
        raise NotRun(f"no {quantity} series of a learning rate that did not diverge")
    g = t.sort_values("step").groupby(["run_id", "lr"])
    out = pd.DataFrame({"init": g.apply(lambda d: d.loc[d["step"] == 0, "value"].mean()),
                        "final": g["value"].last(), "low": g["value"].min(),
                        PLACEMENT: g[PLACEMENT].first(), "alpha": g["alpha"].first(),
                        "depth": g["depth"].first()})
    return out.reset_index()


def post_recovery(table: pd.DataFrame) -> Measured:
    """Largest final erank/d of Post-Norm members collapsed at step 0 (≤ :data:`COLLAPSE`)."""
    df = init_and_final(table, "erank_io")
    low = df[(df[PLACEMENT] == "post") & (df["init"] <= COLLAPSE)]
    if low.empty:
        lowest = df.loc[df[PLACEMENT] == "post", "init"].min()
        raise NotRun(f"no Post-Norm cell collapsed at init (erank/d ≤ {COLLAPSE:g}; lowest: {lowest:.3g})")
    worst = low.loc[low["final"].idxmax()]
    return Measured(float(low["final"].max()), float(low["final"].std(ddof=1)) if len(low) > 1 else np.nan,
                    f"max final erank/d over {len(low)} collapsed (run, lr) members (worst: α = "
                    f"{worst['alpha']:g}, L = {worst['depth']}, lr = {worst['lr']:g}; init {worst['init']:.3g})")


def pre_floor_kept(table: pd.DataFrame) -> Measured:
    """Lowest erank/d over steps of non-diverged Pre-Norm members (≥ :data:`PRE_FLOOR`)."""
    df = init_and_final(table, "erank_io")
    pre = df[df[PLACEMENT] == "pre"]
    if pre.empty:
        raise NotRun("no Pre-Norm run")
    worst = pre.loc[pre["low"].idxmin()]
    return Measured(float(pre["low"].min()), np.nan,
                    f"min over {len(pre)} (run, lr) members and every probed step (α = "
                    f"{worst['alpha']:g}, L = {worst['depth']}, lr = {worst['lr']:g})")


def path_order_shift(table: pd.DataFrame) -> Measured:
    """Median of ⟨k⟩(final) − ⟨k⟩(0) over non-diverged members (> 0: toward longer paths)."""
    df = init_and_final(table, "mean_path_order")
    shift = df["final"] - df["init"]
    q25, q75 = np.nanpercentile(shift, [25, 75])
    return Measured(float(np.nanmedian(shift)), float((q75 - q25) / 1.349),
                    f"median over {len(df)} (run, lr) members; spread = IQR/1.349; "
                    f"{int((shift > 0).sum())} of {len(df)} moved to longer paths")


def _table(runs: Runs) -> pd.DataFrame:
    key = (EXPERIMENT, "table")
    if key not in runs.cache:
        runs.cache[key] = spectra_table(runs.uri, runs(EXPERIMENT))
    return runs.cache[key]


CLAIMS = (
    Claim("train_spectra.post_stays_collapsed", "Post-Norm's rank collapsed at initialization "
          f"stays collapsed through training at every rate that does not diverge (final erank/d "
          f"≤ {COLLAPSE:g})", "the study, train_spectra (question 1)", f"≤ {COLLAPSE:g}",
          at_most(COLLAPSE), lambda runs: post_recovery(_table(runs)), size="full"),
    Claim("train_spectra.pre_floor", "Pre-Norm keeps its rank floor (erank/d ≥ 0.2) at every "
          "probed step of training", "the study, reference magnitudes, train_spectra",
          f"≥ {PRE_FLOOR:g}", at_least(PRE_FLOOR), lambda runs: pre_floor_kept(_table(runs)),
          size="cpu"),
    Claim("train_spectra.longer_paths", "Training moves ⟨k⟩ toward longer paths (median "
          "⟨k⟩(final) − ⟨k⟩(0) > 0)", "the study, train_spectra (question 2)",
          "> 0", above(0.0), lambda runs: path_order_shift(_table(runs)), size="cpu"))


def draw_cell(cell: pd.DataFrame):
    """One (α, L) cell: rows = quantities, columns = placements; lines = learning rates."""
    placements = ordered(cell[PLACEMENT], PLACEMENT_ORDER)
    quantities = [q for q in QUANTITIES if q in set(cell["quantity"])]
    lrs = sorted(cell["lr"].unique())
    colors, _ = style.value_colors(lrs, "plasma")
    fig, axes = style.grid(len(quantities), len(placements), aspect=0.62)
    for i, q in enumerate(quantities):
        for j, p in enumerate(placements):
            ax, d = axes[i, j], cell[(cell["quantity"] == q) & (cell[PLACEMENT] == p)]
            init = d.loc[d["step"] == 0, "value"].mean()
            for lr, g in d[d["step"] > 0].groupby("lr"):
                g = g.sort_values("step")
                ax.plot(g["step"], g["value"], color=colors[lr], marker="o", ms=2, lw=1,
                        ls=":" if g["diverged"].any() else "-", label=f"lr = {lr:g}")
            if np.isfinite(init):
                ax.axhline(init, color="0.35", lw=0.8, ls="--", label="init (step 0)")
            if q == "erank_io":
                ax.axhline(COLLAPSE, color="tab:red", lw=0.8, ls="-.", label=f"collapse ({COLLAPSE:g})")
            ax.set(xscale="log", ylabel=style.name(q))
            if i == 0:
                ax.set_title(style.value_label(PLACEMENT, p))
            if i == len(quantities) - 1:
                ax.set_xlabel("optimizer step")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize="small")
    a, L = float(cell["alpha"].iloc[0]), int(cell["depth"].iloc[0])
    fig.suptitle(rf"Spectra during training, $\alpha = {a:g}$, $L = {L}$")
    return fig


def _arguments(p: argparse.ArgumentParser) -> None:
    set_experiment_default(p, [EXPERIMENT], f"task=train experiment(s) with probes during training (default: {EXPERIMENT})")


def _main(args: argparse.Namespace) -> list[Path]:
    runs = load(args, ["alpha", "depth", PLACEMENT])
    table = spectra_table(args.uri, runs)
    out, paths = out_dir(args), []
    for (a, L), cell in table.groupby(["alpha", "depth"]):
        fig = draw_cell(cell)
        style.caption(fig, runs[(runs["alpha"].astype(float) == a) & (runs["depth"].astype(int) == L)],
                      args.experiment, ["lines: learning rates (dotted: diverged)",
                                        "dashed: step 0", "probes on Gaussian inputs"])
        paths += save(fig, out, f"train_spectra_a{a:g}_L{L}",
                      cell.set_index([PLACEMENT, "quantity", "lr", "step"])["value"].to_frame())
    return paths


COMMANDS = {
    "train-spectra": Command(_main, "probed spectra vs optimizer step, per learning rate, Pre vs "
                                    "Post (experiment train_spectra)", None, True, _arguments)}

EXPERIMENTS = (
    Experiment(
        EXPERIMENT, "Spectra during training: the fig6 grid probed at log-spaced optimizer steps",
        "the study, train_spectra (future work)", analyses=("train-spectra",),
        claims=CLAIMS, needs=Needs(cifar10=True, train=True, gpu_full=True)),)
