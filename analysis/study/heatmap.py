"""Heatmap of any metric over any two params, one panel per norm placement (Figure 6 style)."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from ..core import style
from ..core.runner import Command
from ..core.runs import load_runs
from ..core.select import PLACEMENT_ORDER, SelectionError, ordered, refuse_mixed
from ..core.style import save


def heatmap_table(df: pd.DataFrame, metric: str, x: str, y: str, panel: str | None) -> pd.DataFrame:
    """Mean of ``metric`` per (panel, y, x) cell, with the number of runs per cell.

    Runs of one cell must share every other param (seed offsets aside): a cell never averages
    runs whose configs differ.

    Raises:
        SelectionError: a column that the runs do not have (lists the ones they do).
        SelectionError: runs of one cell differ in a param (each named with its values).
    """
    for col in [metric, x, y] + ([panel] if panel else []):
        if col not in df:
            raise SelectionError(f"runs have no column {col!r}; available: {', '.join(sorted(map(str, df.columns)))}")
    keys = ([panel] if panel else []) + [y, x]
    refuse_mixed(df, keys, "heatmap")
    return df.groupby(keys, dropna=False)[metric].agg(["mean", "std", "count"])


def draw_panel(ax, grid: pd.DataFrame, vmin: float, vmax: float, log_color: bool = False):
    """Draw ``grid`` (rows = y ascending, columns = x) on ``ax`` as an annotated heatmap.

    The colour scale runs from ``vmin`` to ``vmax`` (logarithmic if ``log_color`` and
    ``vmin > 0``); each finite cell is labelled with its value.  Returns the image.
    """
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
    for (i, j), v in np.ndenumerate(grid.values):
        if np.isfinite(v):
            dark = (np.log(v) if norm else v) < mid
            ax.text(j, i, f"{v:.2g}" if small else f"{v:.3g}", ha="center", va="center",
                    fontsize=5 if small else 6, color="white" if dark else "black")
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
        grid = (means.xs(p, level=0) if panel else means).unstack(x).sort_index()
        grid = grid.reindex(sorted(grid.columns), axis=1)
        im = draw_panel(ax, grid, vmin, vmax, log_color)
        ax.set_xlabel(style.name(x))
        ax.set_ylabel(style.name(y))
        ax.set_title(style.value_label(panel, p) if panel else style.name(metric))
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
    df = load_runs(args.experiment, args.uri, filter_string=args.filter)
    if df.empty:
        raise SelectionError(f"no finished runs in experiment(s) {args.experiment}")
    panel = args.panel or None
    table = heatmap_table(df, args.metric, args.x, args.y, panel)
    fig = draw_heatmap(table, args.metric, args.x, args.y, panel,
                       title=f"{style.name(args.metric)} over {style.name(args.x)} × {style.name(args.y)}",
                       log_color=args.log_color)
    style.caption(fig, df, args.experiment, ["cells: mean over seeds"])
    stem = f"heatmap_{args.metric}_{args.y}_x_{args.x}"
    return save(fig, Path(args.out) / "_".join(args.experiment), stem, table)


COMMANDS = {"heatmap": Command(add_arguments, main,
                               "heatmap of a metric over two params, one panel per norm placement")}
