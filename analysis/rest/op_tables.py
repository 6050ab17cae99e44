"""Tables 2 and 3: the post-residual ops' Jacobians, and rank-one projections along a random walk.

* ``table2`` (experiment ``tab2``, probe ``norm_jacobian``) — one row per op R: the closed-form
  Jacobian's distance from autograd, the directions it removes (``‖J x̂‖/‖J‖₂``,
  ``‖J x̂_c‖/‖J‖₂``, ``‖J 1̂‖/‖J‖₂``: 0 = removed), how many (d − rank), its scale against
  Table 2's c, and whether it rescales (c·rms(x) = 1) — beside the study's reading: rmsnorm
  removes x̂, detached removes nothing, meansub removes 1 (no rescale), layernorm both.
* ``table3`` (experiment ``tab3``, probe ``projection_walk``) — erank/d of
  ``Π_l (I − x_l x_lᵀ)`` per step angle ε (rows) and length L (columns), mean ± s.d. over
  seeds, beside the study's values, and a figure of erank/d against L per ε.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np
import pandas as pd

from ..core import style
from ..core.runner import Command, add_where, out_dir, set_experiment_default
from ..core.runs import attach_to_parents
from ..core.seeds import pooled
from ..core.select import SelectionError, load
from ..core.style import save
from ..core.tables import write_markdown

OP = "norm.op"
OPS = ["rmsnorm", "detached", "meansub", "layernorm"]
#: Table 2's reading of each op: (what J removes, whether it rescales)
TABLE2 = {
    "rmsnorm": ("x̂", "√d/‖x‖"),
    "detached": ("nothing", "√d/‖x‖"),
    "meansub": ("1", "none"),
    "layernorm": ("x̂_c and 1", "√d/‖x−μ‖"),
}
T2_COLUMNS = ("jac_autograd_error", "jac_removes_xhat", "jac_removes_xhat_c", "jac_removes_ones",
              "jac_rank_deficit", "jac_scale", "jac_scale_theory", "jac_sv_spread", "jac_scale_rms")
EPS = "task.options.projection_walk.step_angle"
#: the study's Table 3: ε → erank/d at L = 48, 96, 192, 384
TABLE3 = {0.01: (0.996,) * 4, 0.15: (0.996,) * 4, 0.30: (0.996, 0.996, 0.995, 0.995),
          0.60: (0.994, 0.992, 0.988, 0.980)}
TABLE3_DEPTHS = (48, 96, 192, 384)
_WALK = re.compile(r"^walk_erank_L(\d+)$")


# --------------------------------------------------------------------------- Table 2
def table2(df: pd.DataFrame) -> pd.DataFrame:
    """One row per op (Table 2's order): the mean over every seed of each measured column,
    the worst seed's autograd error, and the study's reading."""
    cols = [c for c in T2_COLUMNS if c in df]
    rows = {}
    for op, g in df.groupby(OP):
        row = {c: float(pooled(g, c, []).iloc[0]["mean"]) for c in cols}
        row["removes (Table 2)"], row["rescale (Table 2)"] = TABLE2.get(op, ("?", "?"))
        rows[op] = row
    t = pd.DataFrame.from_dict(rows, orient="index")
    return t.reindex([o for o in OPS if o in t.index] + [o for o in t.index if o not in OPS]).rename_axis("op")


def _table2_arguments(p: argparse.ArgumentParser) -> None:
    set_experiment_default(p, ["tab2"], "MLflow experiment(s) (default: tab2)")
    add_where(p)


def _table2_main(args: argparse.Namespace) -> list[Path]:
    df = load(args, [OP, "jac_autograd_error", "jac_rank_deficit"])
    t = table2(df)
    out = out_dir(args)
    d = sorted(df["width"].unique().tolist()) if "width" in df else []
    head = (f"Table 2: Jacobians of the post-residual ops at gain 1 ({', '.join(args.experiment)}; "
            f"d = {'/'.join(str(int(v)) for v in d)}; removes_*: ‖J v̂‖/‖J‖₂, 0 = removed)")
    paths = [write_markdown(out / "table2.md", head, t, ".3g", runs=df), out / "table2.csv"]
    t.to_csv(paths[1])
    attach_to_parents(paths[1:], df)
    return paths


TABLE2_COMMAND = Command(_table2_arguments, _table2_main,
                         "Table 2: the post-residual ops' Jacobians (closed form vs autograd, removed directions, scale)")


# --------------------------------------------------------------------------- Table 3
def table3(df: pd.DataFrame) -> pd.DataFrame:
    """Mean and seed s.d. of erank/d per (ε, L) from the runs' ``walk_erank_L<L>`` scalars, with
    the study's value where it states one (``study``)."""
    lengths = sorted(int(m.group(1)) for c in df.columns if (m := _WALK.match(str(c))))
    if not lengths:
        raise SelectionError(f"runs have no walk_erank_L<L> metrics (was projection_walk in task.probes?); "
                       f"columns: {', '.join(sorted(map(str, df.columns)))}")
    rows = []
    for L in lengths:
        t = pooled(df, f"walk_erank_L{L}", [EPS]).reset_index()
        t["L"] = L
        rows.append(t)
    t = pd.concat(rows, ignore_index=True).rename(columns={EPS: "epsilon"})
    t = t.dropna(subset=["mean"])

    def study(eps: float, L: int) -> float:
        for e, values in TABLE3.items():
            if np.isclose(e, eps) and L in TABLE3_DEPTHS:
                return values[TABLE3_DEPTHS.index(L)]
        return np.nan

    t["study"] = [study(e, L) for e, L in zip(t["epsilon"], t["L"], strict=True)]
    return t.set_index(["epsilon", "L"]).sort_index()[["mean", "std", "seeds", "study"]]


def draw_table3(t: pd.DataFrame):
    """erank/d against L, one line per ε (colour bar), the study's values as open markers."""
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
    ax.set_xscale("log")
    ax.set_xlabel(r"product length $L$")
    ax.set_ylabel(r"$\mathrm{erank}(\Pi_\ell (I - x_\ell x_\ell^\top))/d$")
    ax.legend()
    style.colorbar(fig, sm, ax, "epsilon", label=r"step angle $\varepsilon$")
    return fig


def _table3_arguments(p: argparse.ArgumentParser) -> None:
    set_experiment_default(p, ["tab3"], "MLflow experiment(s) (default: tab3)")
    add_where(p)


def _table3_main(args: argparse.Namespace) -> list[Path]:
    df = load(args, [EPS])
    t = table3(df)
    fig = draw_table3(t)
    fig.suptitle("Table 3: rank-one projections along a random walk of step angle $\\varepsilon$")
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


TABLE3_COMMAND = Command(_table3_arguments, _table3_main,
                         "Table 3: erank/d of rank-one projections along a random walk, per step angle ε and length L")

COMMANDS = {"table2": TABLE2_COMMAND, "table3": TABLE3_COMMAND}
