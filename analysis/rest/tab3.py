"""Table 3: rank-one projections along a random walk: the command ``table3``, the claims and the
registry entry."""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from ..core import style
from ..core.claims import Claim, Measured, NotRun, Runs, at_least, at_most
from ..core.registry import Experiment
from ..core.runner import Command, out_dir
from ..core.select import SelectionError, load, need, pooled
from ..core.style import save, write_markdown

EPS = "task.options.projection_walk.step_angle"

#: the study's Table 3: (ε, L) → erank/d
TABLE3 = {(e, L): v for e, values in {0.01: (0.996,) * 4, 0.15: (0.996,) * 4,
                                      0.30: (0.996, 0.996, 0.995, 0.995),
                                      0.60: (0.994, 0.992, 0.988, 0.980)}.items()
          for L, v in zip((48, 96, 192, 384), values, strict=True)}

_WALK = re.compile(r"^walk_erank_L(\d+)$")


def table3(df: pd.DataFrame) -> pd.DataFrame:
    """Mean and seed s.d. of erank/d per (ε, L) from the runs' ``walk_erank_L<L>`` scalars, with
    the study's value where it states one (``study``)."""
    lengths = sorted(int(m.group(1)) for c in df.columns if (m := _WALK.match(str(c))))
    if not lengths:
        raise SelectionError(f"runs have no walk_erank_L<L> metrics (was projection_walk in task.probes?); "
                       f"columns: {', '.join(sorted(map(str, df.columns)))}")
    t = pd.concat([pooled(df, f"walk_erank_L{L}", [EPS]).reset_index().assign(L=L)
                   for L in lengths], ignore_index=True)
    t = t.rename(columns={EPS: "epsilon"}).dropna(subset=["mean"])
    t["study"] = [next((v for (e, L2), v in TABLE3.items() if L2 == L and np.isclose(e, eps)),
                       np.nan) for eps, L in zip(t["epsilon"], t["L"], strict=True)]
    return t.set_index(["epsilon", "L"]).sort_index()[["mean", "std", "seeds", "study"]]


def _table3_main(args: argparse.Namespace) -> list[Path]:
    df = load(args, [EPS])
    t = table3(df)
    # erank/d against L, one line per ε (colour bar), the study's values as open markers.
    fig, (ax,) = style.panels(1, aspect=0.8)
    eps = sorted(t.index.get_level_values(0).unique())
    colors, sm = style.value_colors(eps, "plasma", stop=0.85)
    for e in eps:
        g = t.xs(e, level=0)
        ax.errorbar(g.index, g["mean"], yerr=g["std"].fillna(0), marker="o", color=colors[e])
        if g["study"].notna().any():
            ax.plot(g.index, g["study"], ls="none", marker="s", mfc="none", color=colors[e])
    ax.plot([], [], ls="none", marker="s", mfc="none", color="0.3", label="study (Table 3)")
    ax.plot([], [], marker="o", color="0.3", label="measured")
    ax.set(xscale="log", xlabel=r"product length $L$",
           ylabel=r"$\mathrm{erank}(\Pi_\ell (I - x_\ell x_\ell^\top))/d$")
    ax.legend()
    style.colorbar(fig, sm, ax, "epsilon", label=r"step angle $\varepsilon$")
    fig.suptitle("Rank-one projections along a random walk of step angle $\\varepsilon$")
    style.caption(fig, df, args.experiment, ["error bars: ±1 s.d. over seeds"])
    out = out_dir(args)
    paths = save(fig, out, "table3", t)
    wide = t["mean"].unstack("L")
    wide.columns = [f"L={v}" for v in wide.columns]
    study = t["study"].unstack("L")
    study.columns = [f"study L={v}" for v in study.columns]
    head = f"Table 3: erank/d of Π_l (I − x_l x_lᵀ), step angle ε ({', '.join(args.experiment)})"
    paths.append(write_markdown(out / "table3.md", head,
                                wide.join(study.dropna(axis=1, how="all")), ".4f", runs=df))
    return paths


def _tab3(runs: Runs) -> pd.DataFrame:
    df = runs("tab3")
    need(df, EPS)
    rows = []
    for (e, L), v in TABLE3.items():
        g = df[np.isclose(df[EPS].astype(float), e)]
        if len(g) and f"walk_erank_L{L}" in g:
            rows.append((e, L, float(g[f"walk_erank_L{L}"].mean()), v))
    if not rows:
        raise NotRun("no tab3 run at the study's ε and L")
    return pd.DataFrame(rows, columns=["epsilon", "L", "measured", "study"])


def _tab3_match(runs: Runs) -> Measured:
    t = _tab3(runs)
    i = (t["measured"] - t["study"]).abs().idxmax()
    return Measured(float(abs(t.loc[i, "measured"] - t.loc[i, "study"])), math.nan,
                    f"max |measured − study| over {len(t)} cells (worst ε = {t.loc[i, 'epsilon']:g}, "
                    f"L = {int(t.loc[i, 'L'])})")


def _tab3_floor(runs: Runs) -> Measured:
    t = _tab3(runs)
    return Measured(float(t["measured"].min()), math.nan, "lowest erank/d over ε and L")


TAB3 = (
    Claim("tab3.values", "Random-walk projection products: erank/d as the study's "
          "Table 3 (d = 256)", "the study, tab3", "0.996 … 0.980", at_most(0.002), _tab3_match, size="cpu"),
    Claim("tab3.no_collapse", "Rank-one projections along a random walk do not "
          "collapse rank", "the study, tab3", "≥ 0.98", at_least(0.98), _tab3_floor, size="cpu"))

COMMANDS = {"table3": Command(
    _table3_main,
    "Table 3: erank/d of rank-one projections along a random walk, per step angle ε and length L",
    experiment="tab3", where=True)}

EXPERIMENTS = (
    Experiment("tab3", "Table 3: rank-one projections along a random walk", "the study, tab3",
               analyses=("table3 --experiment tab3",), claims=TAB3),)
