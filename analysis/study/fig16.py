"""Figure 16: how deep a network trains without normalization: the command ``fig16``, the claims
and the registry entry."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..core import style
from ..core.claims import Claim, Measured, NotRun, Runs, near
from ..core.registry import Experiment, Needs
from ..core.runner import Command, out_dir, set_experiment_default
from ..core.select import PLACEMENT, PLACEMENT_ORDER, load, need, only, ordered, pooled, warn_mixed
from . import publish
from .fig6_train import CHANCE, CONTEXT, depth_axis


def fig16_table(df: pd.DataFrame, metric: str = "best_test_accuracy") -> pd.DataFrame:
    """Mean, seed std (:func:`analysis.core.select.pooled`; a train run is one seed) and counts of
    ``metric`` per (matrices, placement, depth)."""
    t = pooled(df, metric, ["matrices", PLACEMENT, "depth"])
    return t.rename(columns={"runs": "count"})[["mean", "std", "count", "seeds"]]


def _fig16_arguments(p: argparse.ArgumentParser) -> None:
    set_experiment_default(p, ["fig16"], "task=train experiment(s) (default: fig16)")
    p.add_argument("--metric", default="best_test_accuracy",
                   help="y axis (default: best_test_accuracy)")


def _fig16_main(args: argparse.Namespace) -> list[Path]:
    df = load(args, ["matrices", PLACEMENT, "depth", args.metric])
    warn_mixed(df, ["matrices", PLACEMENT, "depth"], args.experiment, keys=CONTEXT)
    table = fig16_table(df, args.metric)
    fig, (ax,) = style.panels(1)
    for m in sorted(table.index.get_level_values(0).unique()):
        for p in ordered(table.loc[m].index.get_level_values(0), PLACEMENT_ORDER):
            s = table.loc[(m, p)]
            ax.errorbar(s.index, s["mean"], yerr=s["std"].fillna(0), marker="o",
                        linestyle="-" if m == 2 else "--",
                        label=f"{style.value_label('matrices', m)}, "
                        f"{style.value_label(PLACEMENT, p)}")
    ax.axhline(CHANCE, color="gray", lw=0.8, ls=":", label="chance (10 classes)")
    depth_axis(ax, table.index.get_level_values(2))
    ax.set_ylabel(style.name(args.metric))
    ax.legend()
    return publish(fig, f"{style.name(args.metric)} vs depth", df, args.experiment,
                   ["error bars: ±1 s.d. over seeds"], out_dir(args),
                   f"fig16_{args.metric}_vs_depth", table)


def _trainable_depth(df: pd.DataFrame) -> float:
    ok = df.groupby("depth")["best_test_accuracy"].mean()
    ok = ok[ok >= CHANCE + 0.05]
    return float(ok.index.max()) if len(ok) else 0.0


def _fig16(runs: Runs) -> Measured:
    df = runs("fig16")
    need(df, "best_test_accuracy")
    ratios = []
    for _, g in df.groupby("matrices"):
        none, pre = only(g, norm_placement="none"), only(g, norm_placement="pre")
        d_pre = _trainable_depth(pre)
        if d_pre > 0:
            ratios.append(_trainable_depth(none) / d_pre)
    if not ratios:
        raise NotRun("no Pre-Norm run trains above chance")
    return Measured(float(np.mean(ratios)), math.nan,
                    "deepest L above chance + 0.05, no norm ÷ Pre-Norm, mean over M")


FIG16 = (Claim("fig16.halves_depth", "Without norm the magnitude channel halves the "
               "trainable depth", "the study, fig16", "0.5 (ratio)", near(0.5, 0.25), _fig16),)

COMMANDS = {"fig16": Command(
    _fig16_main, "Figure 16: best test accuracy vs depth, one line per (M, norm placement)",
    arguments=_fig16_arguments)}

EXPERIMENTS = (Experiment("fig16", "Figure 16: how deep a network trains without normalization",
                          "the study, fig16", analyses=("fig16",), claims=FIG16,
                          needs=Needs(cifar10=True, train=True, gpu_full=True)),)
