"""Figure 2: rank over α × β collapses onto βα^M: the commands ``heatmap``, ``collapse``, the
claims and the registry entry."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..core import style
from ..core.claims import Claim, Measured, NotRun, Runs, at_most
from ..core.registry import Experiment, Needs
from ..core.runner import Command, out_dir
from ..core.select import (
    CONFIG_KEYS,
    PLACEMENT,
    PLACEMENT_ORDER,
    load,
    need,
    only,
    ordered,
    pooled,
    refuse_mixed,
    require,
    varying,
    warn_mixed,
)
from ..core.style import save, to_markdown, write_text


def heatmap_table(df: pd.DataFrame, metric: str, x: str, y: str, panel: str | None) -> pd.DataFrame:
    """Per (panel, y, x) cell: ``metric``'s ``mean`` and ``std`` over every seed of the cell's
    runs (:func:`analysis.core.select.pooled`), its ``seeds`` and run ``count``; SelectionError
    for a missing column or for runs of one cell that differ in another param."""
    keys = ([panel] if panel else []) + [y, x]
    require(df, [metric, *keys])
    refuse_mixed(df, keys, "heatmap")
    t = pooled(df, metric, keys).rename(columns={"runs": "count"})
    return t.astype({"seeds": int, "count": int})


def cell_note(mean, std) -> str:
    """The caption's word on what a cell shows, its ``mean`` ± its seed ``std`` (arrays alike;
    a cell of one seed has no s.d.)."""
    one = (np.isfinite(np.asarray(mean, float)) & ~np.isfinite(np.asarray(std, float))).any()
    return "cells: mean ± 1 s.d. over seeds" + ("; one seed where no ±" if one else "")


def draw_panel(ax, grid: pd.DataFrame, vmin: float, vmax: float, log_color: bool = False,
               spread: pd.DataFrame | None = None):
    """``grid`` (rows = y ascending, columns = x) on ``ax`` as a heatmap from ``vmin`` to ``vmax``
    (log if ``log_color`` and ``vmin > 0``), finite cells labelled with their value and, below
    it, their ``spread`` (the seed s.d., a grid like ``grid``) where finite; returns the image."""
    norm = None
    if log_color and vmin > 0:
        from matplotlib.colors import LogNorm

        norm = LogNorm(vmin, vmax)
    im = ax.imshow(grid.values, origin="lower", aspect="auto", cmap="viridis",
                   vmin=None if norm else vmin, vmax=None if norm else vmax, norm=norm)
    ax.set_xticks(range(grid.shape[1]), [style.number(c) for c in grid.columns])
    ax.set_yticks(range(grid.shape[0]), [style.number(r) for r in grid.index])
    ax.grid(False)
    mid = (np.log(vmin * vmax) / 2) if norm else (vmin + vmax) / 2
    small = grid.size > 30  # keep the annotations legible on a page-sized panel
    sd = np.full(grid.shape, np.nan) if spread is None else spread.to_numpy(float)
    for (i, j), v in np.ndenumerate(grid.values):
        if np.isfinite(v):
            dark = (np.log(v) if norm else v) < mid
            text = f"{v:.2g}" if small else f"{v:.3g}"
            ax.text(j, i, text + (f"\n±{sd[i, j]:.1g}" if np.isfinite(sd[i, j]) else ""),
                    ha="center", va="center", fontsize=5 if small else 6, linespacing=1.0,
                    color="white" if dark else "black")
    return im


def draw_heatmap(table: pd.DataFrame, metric: str, x: str, y: str, panel: str | None,
                 title: str = "", log_color: bool = False):
    """One annotated panel per value of ``panel`` (wrapped to fit a page); rows = ``y``
    (ascending), columns = ``x``; one colour bar named after ``metric``."""
    panels = ordered(table.index.get_level_values(0), PLACEMENT_ORDER) if panel else [None]
    means = table["mean"]
    vmin, vmax = float(np.nanmin(means)), float(np.nanmax(means))
    fig, axes = style.panels(len(panels), max_cols=2, aspect=0.85)
    for ax, p in zip(axes, panels, strict=True):
        grid, sd = ((table[c].xs(p, level=0) if panel else table[c]).unstack(x).sort_index()
                    for c in ("mean", "std"))
        cols = sorted(grid.columns)
        im = draw_panel(ax, grid[cols], vmin, vmax, log_color, sd[cols])
        ax.set(xlabel=style.name(x), ylabel=style.name(y),
               title=style.value_label(panel, p) if panel else style.name(metric))
    style.colorbar(fig, im, axes, metric)
    if title:
        fig.suptitle(title)
    return fig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metric", default="erank_io", help="metric to color (default: erank_io = erank(∂h_L/∂h_0)/d)")
    p.add_argument("--x", default="alpha", help="param on the x axis (default: alpha)")
    p.add_argument("--y", default="depth", help="param on the y axis (default: depth)")
    p.add_argument("--panel", default="norm.placement", help="one panel per value of this param ('' for one panel)")
    p.add_argument("--log-color", action="store_true", help="logarithmic color scale")


def main(args: argparse.Namespace) -> list[Path]:
    df = load(args)
    panel = args.panel or None
    table = heatmap_table(df, args.metric, args.x, args.y, panel)
    fig = draw_heatmap(table, args.metric, args.x, args.y, panel,
                       title=f"{style.name(args.metric)} over {style.name(args.x)} × {style.name(args.y)}",
                       log_color=args.log_color)
    style.caption(fig, df, args.experiment, [cell_note(table["mean"], table["std"])])
    return save(fig, out_dir(args), f"heatmap_{args.metric}_{args.y}_x_{args.x}", table)


#: the config keys each x is a function of (they may differ between runs of one group)
INGREDIENTS = {"nominal_ratio": ("alpha", "beta", "beta_scaling"),
               "depth_factor": ("alpha", "beta", "beta_scaling", "depth")}


def collapse_panels(df: pd.DataFrame, keys: list[str]) -> list[tuple[tuple, pd.DataFrame]]:
    """``[(values, runs)]`` per combination of ``keys``; placements in the study's order."""
    if not keys:
        return [((), df)]
    groups = [(v if isinstance(v, tuple) else (v,), g) for v, g in df.groupby(keys, sort=True)]
    if PLACEMENT in keys:
        i = keys.index(PLACEMENT)
        rank = {v: n for n, v in enumerate(ordered(df[PLACEMENT], PLACEMENT_ORDER))}
        groups.sort(key=lambda g: rank[g[0][i]])  # stable: other keys stay sorted
    return groups


def match_values(x, rtol: float) -> np.ndarray:
    """Cluster labels for positive ``x``: sorted values whose relative gap is ≤ ``rtol`` share
    a label (βα^M computed from different α, β differs in the last bits; a rounded α grid,
    e.g. 1.41 for √2, needs a looser ``rtol``)."""
    lx = np.log(np.asarray(x, dtype=float))
    order = np.argsort(lx, kind="stable")
    labels = np.empty(lx.size, dtype=int)
    labels[order] = np.concatenate([[0], np.cumsum(np.diff(lx[order]) > np.log1p(rtol))])
    return labels


def collapse_spread(df: pd.DataFrame, metric: str, x: str, rtol: float = 1e-9) -> pd.DataFrame:
    """Spread of ``metric`` among runs sharing ``x`` (to ``rtol``) and every varying key but x's
    :data:`INGREDIENTS`: one row per group of ≥ 2 runs (keys, ``x``, ``runs``, ``min``,
    ``max``, ``spread``), largest spread first."""
    skip = set(INGREDIENTS.get(x, ())) | {x}
    keys = [k for k in varying(df, CONFIG_KEYS) if k not in skip]
    g = df.assign(_x=match_values(df[x], rtol))
    rows = []
    for values, runs in g.groupby(keys + ["_x"], sort=True, dropna=False):
        if len(runs) < 2:
            continue
        values = values if isinstance(values, tuple) else (values,)
        v = runs[metric].astype(float)
        rows.append(
            {**dict(zip(keys, values[:-1], strict=True)), x: float(runs[x].min()),
             "runs": len(runs), "min": v.min(), "max": v.max(), "spread": v.max() - v.min()})
    out = pd.DataFrame(rows, columns=keys + [x, "runs", "min", "max", "spread"])
    return out.sort_values("spread", ascending=False, ignore_index=True)


def _collapse_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metric", default="erank_io",
                   help="y axis (default: erank_io = erank(∂h_L/∂h_0)/d)")
    p.add_argument("--x", default="nominal_ratio", choices=sorted(INGREDIENTS),
                   help="nominal_ratio = βα^M (Figure 2b) or depth_factor = βα^M√L (Figure 5d)")
    p.add_argument("--color", default=PLACEMENT,
                   help=f"one colour per value of this param (default: {PLACEMENT})")
    p.add_argument("--panel", nargs="*", default=[],
                   help="one panel per combination of these params (default: one panel)")
    p.add_argument("--match-rtol", type=float, default=1e-9,
                   help="runs share x when their x agree to this relative tolerance "
                   "(default: 1e-9, exact up to rounding; e.g. 0.01 for a rounded α grid)")


def _collapse_main(args: argparse.Namespace) -> list[Path]:
    keys = [args.color, *args.panel]
    df = load(args, [args.metric, args.x, *keys])
    warn_mixed(df, [*keys, *INGREDIENTS[args.x]], args.experiment)
    spread = collapse_spread(df, args.metric, args.x, args.match_rtol)
    xname = style.name(args.x)
    panels = collapse_panels(df, args.panel)
    fig, axes = style.panels(len(panels), max_cols=2, aspect=0.75, sharey=True)
    numeric = pd.api.types.is_numeric_dtype(df[args.color])
    if numeric:
        colors, sm = style.value_colors(df[args.color], "viridis")
    else:
        names = ordered(df[args.color], PLACEMENT_ORDER if args.color == PLACEMENT else [])
        colors = {c: f"C{k % 10}" for k, c in enumerate(names)}
    std = f"{args.metric}_std"
    for ax, (pv, sub) in zip(axes, panels, strict=True):
        for c, col in colors.items():
            s = sub[sub[args.color] == c]
            if s.empty:
                continue
            ax.errorbar(s[args.x], s[args.metric], yerr=s[std] if std in s else None, fmt="o",
                        ms=2.5, lw=0.5, color=col, alpha=0.85,
                        label=None if numeric else style.value_label(args.color, c))
            line = s.groupby(args.x)[args.metric].mean().sort_index()
            ax.plot(line.index, line.values, color=col, lw=0.6, alpha=0.6)
        ax.set(xscale="log", xlabel=xname)
        ax.set_title(", ".join(style.value_label(k, v) for k, v in zip(args.panel, pv, strict=True)))
    for ax in axes[:: min(2, len(axes))]:  # the first panel of each row (max_cols=2)
        ax.set_ylabel(style.name(args.metric))
    if numeric:
        style.colorbar(fig, sm, axes, args.color)
    else:
        axes[-1].legend()
    worst = float(spread["spread"].max()) if len(spread) else float("nan")
    spread_text = (f"max spread at equal {xname}: {worst:.2g}" if len(spread)
                   else f"no two runs share {xname}")  # never "nan" in a title
    fig.suptitle(f"{style.name(args.metric)} vs {xname} ({spread_text})")
    style.caption(fig, df, args.experiment, ["error bars: ±1 s.d. over seeds"])
    cols = ["run_id", *dict.fromkeys([*keys, "alpha", "beta", "beta_eff", "depth", args.x]),
            args.metric]
    table = df[[c for c in cols if c in df]].sort_values([args.x, args.color])
    stem = f"collapse_{args.metric}_vs_{args.x}"
    paths = save(fig, out_dir(args), stem, table.set_index("run_id"))
    paths.append(write_text(out_dir(args) / f"{stem}_spread.csv", spread.to_csv(index=False)))
    print(f"Collapse of {args.metric} onto {xname} ({', '.join(args.experiment)}): "
          f"{len(spread)} groups of runs that share {xname} and differ only in "
          f"{', '.join(INGREDIENTS[args.x])}"
          + (f"; max spread = {worst:.3g}" if len(spread) else ""))
    if len(spread):
        print(to_markdown(spread.head(10)))
    return paths


def _fig2_collapse(runs: Runs) -> Measured:
    df = only(runs("fig2"), activation="relu")
    need(df, "erank_io", "nominal_ratio")
    spread = collapse_spread(df, "erank_io", "nominal_ratio")
    if spread.empty:
        raise NotRun("no two runs share βα^M")
    return Measured(float(spread["spread"].max()), math.nan,
                    f"max spread of erank/d over {len(spread)} groups sharing βα^M")


FIG2 = (Claim("fig2.exact_collapse", "erank depends on (α, β) only through βα^M, exactly for ReLU",
              "the study, fig2", "0 (exact)", at_most(1e-9), _fig2_collapse),)

COMMANDS = {
    'heatmap': Command(main, "heatmap of a metric over two params, one panel per norm placement",
                       arguments=add_arguments),
    'collapse': Command(_collapse_main,
                        "Figure 2b/5d: a metric vs βα^M or βα^M√L, and how exact the collapse is",
                        experiment="fig2", where=True, arguments=_collapse_arguments)}

EXPERIMENTS = (Experiment("fig2", "Figure 2: rank over α × β collapses onto βα^M",
                          "the study, fig2",
                          analyses=("heatmap --experiment fig2 --x alpha --y beta --log-color",
                                    "collapse --experiment fig2"),
                          claims=FIG2, needs=Needs(gpu_full=True)),)
