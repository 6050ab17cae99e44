"""Figure 10: the post-residual op R of the general block (Eq. 17) with and without a Pre-RMSNorm.

``python -m analysis post_ops --experiment fig10`` draws ``erank_io`` (erank(∂h_L/∂h_0)/d)
against depth:

* (a) P = identity (no Pre-Norm control), one line per R ∈ {none, rmsnorm, detached, meansub,
  layernorm} — the study: the branch is unnormalized, its ratio stays at βα^M, and rank
  collapses at nearly the rescaling rate, so the five ops are indistinguishable;
* (b) R ∈ {rmsnorm, layernorm}, without (solid) and with (dashed) the Pre-RMSNorm control —
  the study: the curves coincide.

and prints the table (mean over every seed per (P, R, L)), the spread of the five ops at each
depth (max/min over R, P = identity) and the relative gap of (b) per depth.  Error bars:
±1 s.d. over seeds (:func:`analysis.core.seeds.pooled`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from ..core import style
from ..core.runner import Command, add_where, out_dir, set_experiment_default
from ..core.seeds import pooled
from ..core.select import load, warn_mixed
from ..core.style import save
from ..core.tables import to_markdown, write_text

PRE, OUT, POST = "norm.pre", "norm.out", "norm.post"
R_ORDER = ["none", "rmsnorm", "detached", "meansub", "layernorm"]
RESCALING = ("rmsnorm", "layernorm")


def op_table(df: pd.DataFrame, metric: str = "erank_io") -> pd.DataFrame:
    """Mean, seed std, seeds and runs of ``metric`` per (P, R, depth), B = identity runs only;
    rows in the order P = none first, R as :data:`R_ORDER`."""
    d = df[df[OUT].astype(str) == "none"] if OUT in df else df
    t = pooled(d, metric, [PRE, POST, "depth"]).reset_index()
    rank = {o: i for i, o in enumerate(R_ORDER)}
    t = t.assign(_p=t[PRE].map(lambda v: rank.get(v, 9)), _r=t[POST].map(lambda v: rank.get(v, 9)))
    return t.sort_values(["_p", "_r", "depth"]).drop(columns=["_p", "_r"]).set_index([PRE, POST, "depth"])


def ops_spread(table: pd.DataFrame) -> pd.Series:
    """Figure 10a: max/min over R of the mean at each depth, P = identity (≈ 1: alike)."""
    if "none" not in table.index.get_level_values(0):
        return pd.Series(dtype=float, name="spread")
    m = table["mean"].xs("none", level=0).unstack(POST)
    return (m.max(axis=1) / m.min(axis=1)).rename("max/min over R")


def control_gap(table: pd.DataFrame) -> pd.DataFrame:
    """Figure 10b: |with − without control| / without, per rescaling R and depth (≈ 0)."""
    m = table["mean"]
    pres = set(m.index.get_level_values(0))
    if not {"none", "rmsnorm"} <= pres:
        return pd.DataFrame()
    rows = {}
    for r in RESCALING:
        try:
            free, ctrl = m.xs(("none", r), level=(0, 1)), m.xs(("rmsnorm", r), level=(0, 1))
        except KeyError:
            continue
        rows[r] = ((ctrl - free).abs() / free).dropna()
    return pd.DataFrame(rows).rename_axis("depth")


def _line(ax, t: pd.DataFrame, **kw) -> None:
    ax.plot(t.index, t["mean"], marker="o", **kw)  # log–log axes: no error bars (see spread_note)


def spread_note(table: pd.DataFrame) -> str:
    """The caption's seed spread, which log–log axes cannot draw as bars."""
    rel = (table["std"] / table["mean"].abs()).replace([np.inf, -np.inf], np.nan).dropna()
    return (f"seed s.d. ≤ {100 * rel.max():.2g} % of each point (1 s.d. over seeds)" if len(rel)
            else "one seed per point: no spread")


def draw(table: pd.DataFrame, metric: str):
    """Panels (a) and (b) side by side (log–log axes over depth)."""
    fig, axes = style.panels(2, max_cols=2, aspect=0.8)
    colors = dict(zip(R_ORDER, style.value_colors(range(len(R_ORDER)), "tab10", stop=0.45)[0].values(),
                      strict=True))
    pres = list(dict.fromkeys(table.index.get_level_values(0)))
    if "none" in pres:
        free = table.xs("none", level=0)
        for r in [o for o in R_ORDER if o in free.index.get_level_values(0)]:
            _line(axes[0], free.xs(r, level=0), color=colors[r], label=f"$R$ = {style.OP_NAMES.get(r, r)}")
    axes[0].set_title("(a) no Pre-Norm ($P$ = identity)")
    for r in RESCALING:
        for p, ls, what in (("none", "-", "without"), ("rmsnorm", "--", "with")):
            if (p, r) in table.index.droplevel(2):
                _line(axes[1], table.xs((p, r), level=(0, 1)), color=colors[r], ls=ls,
                      label=f"Post-{style.OP_NAMES[r]}, {what} Pre-RMSNorm")
    axes[1].set_title("(b) with vs without the control")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(style.name("depth"))
        ax.set_ylabel(style.name(metric))
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    return fig


def _arguments(p: argparse.ArgumentParser) -> None:
    set_experiment_default(p, ["fig10"], "MLflow experiment(s) (default: fig10)")
    p.add_argument("--metric", default="erank_io", help="y axis (default: erank_io = erank(∂h_L/∂h_0)/d)")
    add_where(p)


def _main(args: argparse.Namespace) -> list[Path]:
    df = load(args, [args.metric, "depth", PRE, POST])
    warn_mixed(df, ["depth", "norm.placement", "norm.op"], args.experiment)
    table = op_table(df, args.metric)
    fig = draw(table, args.metric)
    fig.suptitle("Figure 10: post-residual op $R$ without the Pre-RMSNorm control")
    style.caption(fig, df, args.experiment, [spread_note(table)])
    out = out_dir(args)
    paths = save(fig, out, f"post_ops_{args.metric}", table)
    wide = table["mean"].unstack("depth").reindex(list(dict.fromkeys(table.index.droplevel(2))))
    wide.columns = [f"L={int(v)}" for v in wide.columns]
    spread, gap = ops_spread(table), control_gap(table)
    text = [f"{args.metric} by (P, R) and depth ({', '.join(args.experiment)})", "", to_markdown(wide)]
    if len(spread):
        text += ["", "Figure 10a: max/min over R (P = identity) per depth (study: indistinguishable, ≈ 1)",
                 "", to_markdown(spread.to_frame())]
    if not gap.empty:
        text += ["", "Figure 10b: |with − without Pre-RMSNorm| / without (study: coincide, ≈ 0)", "",
                 to_markdown(gap)]
    print("\n".join(text))
    paths.append(write_text(out / f"post_ops_{args.metric}.md", "\n".join(text) + "\n"))
    return paths


POST_OPS_COMMAND = Command(_arguments, _main,
                           "Figure 10: erank by post-residual op R across depth, without and with the Pre-RMSNorm control")

COMMANDS = {"post_ops": POST_OPS_COMMAND}
