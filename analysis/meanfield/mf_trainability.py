"""Trainability vs the correlation depth scale (L ≈ 6ξ_c): the command ``mf_trainability``, the
claims and the registry entry."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import ticker

from rankexp import theory

from ..core import style
from ..core.claims import Measured, NotRun, at_most
from ..core.registry import Needs
from ..core.runner import out_dir
from ..core.select import load
from ..core.style import save
from . import claim, edges, entry, values_text


def trainability_table(df: pd.DataFrame) -> pd.DataFrame:
    d = df.assign(sigma_w2=(df["alpha"] ** 2).round(12), sigma_b2=(df["bias"] ** 2).round(12))
    t = d.groupby(["sigma_b2", "sigma_w2", "depth"])[["best_test_accuracy"]].max()
    xi = {(b, w): theory.correlation_depth_scale(d["activation"].iloc[0], w, b).xi_c
          for b, w in {(b, w) for b, w, _ in t.index}}
    t["xi_c_theory"] = [xi[(b, w)] for b, w, _ in t.index]
    t["six_xi_c"] = 6 * t["xi_c_theory"]
    return t


def _trainability_main(args: argparse.Namespace) -> list[Path]:
    df = load(args, ["alpha", "bias", "depth", "activation", "best_test_accuracy"])
    t = trainability_table(df)
    steps = values_text(df, "task.steps")
    lrs = values_text(df, "task.lrs")
    activation = str(df["activation"].iloc[0])
    sb2s = sorted(t.index.get_level_values("sigma_b2").unique())
    fig, axes = style.grid(1, len(sb2s), width=min(style.TWO_COLUMN, 3.6 * len(sb2s)), aspect=0.85)
    for ax, sb2 in zip(axes[0], sb2s, strict=True):
        g = t.loc[sb2]["best_test_accuracy"].unstack("sigma_w2")
        sw2, depths = g.columns.to_numpy(float), g.index.to_numpy(float)
        ye = np.exp(edges(np.log(depths)))
        mesh = ax.pcolormesh(np.clip(edges(sw2), 0, None), ye, g.to_numpy(), cmap="magma",
                             vmin=0.1, shading="flat")
        fig.colorbar(mesh, ax=ax, label="best test accuracy")
        fine = np.linspace(sw2.min(), sw2.max(), 60)
        xi = np.array([theory.correlation_depth_scale(activation, w, sb2).xi_c for w in fine])
        ax.plot(fine, np.clip(6 * xi, ye[0], ye[-1] * 10), "c-", lw=2, label=r"$L = 6\,\xi_c$")
        if activation == "tanh":
            ax.axvline(theory.tanh_critical_line(sb2), color="w", ls="--", lw=1,
                       label=r"critical $\chi_1 = 1$")
        ax.set(yscale="log", ylim=(ye[0], ye[-1]))
        ax.set_yticks(depths, [f"{d:g}" for d in depths])
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set(xlabel=r"$\sigma_w^2$", ylabel=style.name("depth"))
        ax.set_title(rf"{activation}, $\sigma_b^2$ = {sb2:.3g}", fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("Trainability of plain networks on CIFAR-10 vs the correlation depth scale "
                 "(Schoenholz et al. 2017)")
    style.caption(fig, df, args.experiment, [f"Adam, {steps} steps, best over lrs {lrs}"])
    return save(fig, out_dir(args), "mf_trainability", t)


#: the chance accuracy of CIFAR-10 and 3 binomial s.e. of it on the 10 000 test images: a
#: network "trains" when its best test accuracy exceeds this
CHANCE, TEST_IMAGES = 0.1, 10_000

TRAINED = CHANCE + 3 * math.sqrt(CHANCE * (1 - CHANCE) / TEST_IMAGES)

#: Schoenholz et al.'s boundary L = 6 ξ_c; cells within a factor 2 of it are the transition
#: (their Fig. 5: accuracy falls from trained to chance over about a factor 2 in L) and not judged
SIX, BAND = 6.0, 2.0


def trainability(t: pd.DataFrame) -> Measured:
    """Cells that contradict "networks train where L ≲ 6 ξ_c": L ≤ 6ξ_c/2 and best test
    accuracy ≤ chance + 3 s.e. (:data:`TRAINED`), or L ≥ 2·6ξ_c and above it; cells within a
    factor 2 of the boundary are the transition and not judged."""
    ratio = t.index.get_level_values("depth").to_numpy(float) / t["six_xi_c"].to_numpy(float)
    trained = t["best_test_accuracy"].to_numpy(float) > TRAINED
    inside, outside = ratio <= 1 / BAND, ratio >= BAND
    if not (inside | outside).any():
        raise NotRun("every cell lies within a factor 2 of L = 6 ξ_c")
    wrong = int((inside & ~trained).sum() + (outside & trained).sum())
    return Measured(float(wrong), math.nan,
                    f"{wrong} of {int((inside | outside).sum())} judged cells contradict "
                    f"(trained: best test accuracy > {TRAINED:.3f})")


MF_TRAINABILITY = (
    claim("mf_trainability.six_xi_c", "Plain tanh nets train where L ≲ 6 ξ_c and not beyond "
           "(cells within a factor 2 of the boundary not judged)",
           "the chapter (Schoenholz et al. 2017)", "0 cells",
           ("mf_trainability", trainability_table), trainability,
           at_most(0), size="full"),)

COMMANDS, EXPERIMENTS = entry(
    "mf_trainability", "Trainability vs the correlation depth scale (L ≈ 6ξ_c)",
    "the chapter (Schoenholz et al. 2017)", MF_TRAINABILITY, _trainability_main,
    "best CIFAR-10 accuracy over (σ_w², L) with L = 6 ξ_c overlaid",
    needs=Needs(cifar10=True, train=True, gpu_full=True))
