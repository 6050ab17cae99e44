"""Rank against the nominal branch ratio: Figure 2b / 5d (collapse) and Figure 5c / Table 4
(iso-rank contours).

Commands (``python -m analysis <command> --help``):

* ``collapse`` — a metric (default ``erank_io``) vs ``nominal_ratio`` = βα^M (Figure 2b) or
  ``depth_factor`` = βα^M√L (Figure 5d), coloured by placement or depth.  It also measures
  how exact the collapse is: among runs that differ only in the ingredients of x (α, β and
  for ``depth_factor`` also L) and share its value, the largest spread of the metric.  For a
  positively homogeneous σ (ReLU) and x = βα^M that spread is rounding error (≲ 1e-12).
* ``isorank`` — contours of ``erank_io`` over (α, L), one panel per placement and m/d, at
  chosen rank levels; along each contour the power law α ∝ L^s is fitted by log-log least
  squares on the contour's crossing points, one per depth (:func:`contour_points`,
  :func:`fit_power_law`).  Reported as ``slope_alpha`` = d log α / d log L and
  ``slope_ratio`` = d log(βα^M) / d log L (= M·slope_alpha at constant β).  The study's
  Table 4: ≈ −0.50 for Post-Norm, i.e. the rank is a function of βα^M√L.  The same command
  reads a contour sweep (``experiment=tab4_contour``, ``hydra/sweeper=contour``): its runs
  bracket each crossing tightly, so the first crossing per depth is interpolated between the
  two runs that bracket it — the sweeper's own estimate; the panel then shows the runs as
  points (:func:`sparse_grid`) instead of a grid's cells.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
import pandas as pd

from hydra_plugins.rankexp_plugins.contour import fit_exponent

from ..core import style
from ..core.runner import Command, add_where, out_dir, set_experiment_default
from ..core.select import (
    CONFIG_KEYS,
    PLACEMENT,
    PLACEMENT_ORDER,
    SelectionError,
    load,
    ordered,
    varying,
    warn_mixed,
)
from ..core.style import save
from ..core.tables import to_markdown, write_text

log = logging.getLogger("analysis")

#: the config keys each x is a function of (they may differ between runs of one group)
INGREDIENTS = {
    "nominal_ratio": ("alpha", "beta", "beta_scaling"),
    "depth_factor": ("alpha", "beta", "beta_scaling", "depth"),
}


def _panels(df: pd.DataFrame, keys: list[str]) -> list[tuple[tuple, pd.DataFrame]]:
    """``[(values, runs)]`` per combination of ``keys``; placements in the study's order."""
    if not keys:
        return [((), df)]
    groups = [(v if isinstance(v, tuple) else (v,), g) for v, g in df.groupby(keys, sort=True)]
    if PLACEMENT in keys:
        i = keys.index(PLACEMENT)
        rank = {v: n for n, v in enumerate(ordered(df[PLACEMENT], PLACEMENT_ORDER))}
        groups.sort(key=lambda g: rank[g[0][i]])  # stable: other keys stay sorted
    return groups


# --------------------------------------------------------------------------- collapse
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
    """Spread of ``metric`` among runs that share ``x`` and every varying config key except
    x's ingredients (:data:`INGREDIENTS`).

    Runs share ``x`` when their values agree to ``rtol`` (:func:`match_values`).

    Returns:
        One row per group of ≥ 2 runs: the group keys, ``x`` (the group's smallest),
        ``runs``, ``min``, ``max``, ``spread`` = max − min of ``metric``; largest spread first.
    """
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
            {
                **dict(zip(keys, values[:-1], strict=True)),
                x: float(runs[x].min()),
                "runs": len(runs),
                "min": v.min(),
                "max": v.max(),
                "spread": v.max() - v.min(),
            }
        )
    cols = keys + [x, "runs", "min", "max", "spread"]
    out = pd.DataFrame(rows, columns=cols)
    return out.sort_values("spread", ascending=False, ignore_index=True)


def _collapse_arguments(p: argparse.ArgumentParser) -> None:
    set_experiment_default(p, ["fig2"], "MLflow experiment(s) (default: fig2)")
    p.add_argument(
        "--metric", default="erank_io", help="y axis (default: erank_io = erank(∂h_L/∂h_0)/d)"
    )
    p.add_argument(
        "--x",
        default="nominal_ratio",
        choices=sorted(INGREDIENTS),
        help="nominal_ratio = βα^M (Figure 2b) or depth_factor = βα^M√L (Figure 5d)",
    )
    p.add_argument(
        "--color",
        default=PLACEMENT,
        help=f"one colour per value of this param (default: {PLACEMENT})",
    )
    p.add_argument(
        "--panel",
        nargs="*",
        default=[],
        help="one panel per combination of these params (default: one panel)",
    )
    p.add_argument(
        "--match-rtol",
        type=float,
        default=1e-9,
        help="runs share x when their x agree to this relative tolerance "
        "(default: 1e-9, exact up to rounding; e.g. 0.01 for a rounded α grid)",
    )
    add_where(p)


def _collapse_main(args: argparse.Namespace) -> list[Path]:
    keys = [args.color, *args.panel]
    df = load(args, [args.metric, args.x, *keys])
    warn_mixed(df, [*keys, *INGREDIENTS[args.x]], args.experiment)
    spread = collapse_spread(df, args.metric, args.x, args.match_rtol)
    xname = style.name(args.x)
    panels = _panels(df, args.panel)
    fig, axes = style.panels(len(panels), max_cols=2, aspect=0.75, sharey=True)
    numeric = pd.api.types.is_numeric_dtype(df[args.color])
    if numeric:
        colors, sm = style.value_colors(df[args.color], "viridis")
    else:
        order = PLACEMENT_ORDER if args.color == PLACEMENT else []
        names = ordered(df[args.color], order) if order else sorted(df[args.color].unique())
        colors = {c: f"C{k % 10}" for k, c in enumerate(names)}
    std = f"{args.metric}_std"
    for ax, (pv, sub) in zip(axes, panels, strict=True):
        for c, col in colors.items():
            s = sub[sub[args.color] == c]
            if s.empty:
                continue
            ax.errorbar(
                s[args.x],
                s[args.metric],
                yerr=s[std] if std in s else None,
                fmt="o",
                ms=2.5,
                lw=0.5,
                color=col,
                alpha=0.85,
                label=None if numeric else style.value_label(args.color, c),
            )
            line = s.groupby(args.x)[args.metric].mean().sort_index()
            ax.plot(line.index, line.values, color=col, lw=0.6, alpha=0.6)
        ax.set_xscale("log")
        ax.set_xlabel(xname)
        pv = pv if isinstance(pv, tuple) else (pv,)
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
    cols = [
        "run_id",
        *dict.fromkeys([*keys, "alpha", "beta", "beta_eff", "depth", args.x]),
        args.metric,
    ]
    table = df[[c for c in cols if c in df]].sort_values([args.x, args.color])
    stem = f"collapse_{args.metric}_vs_{args.x}"
    paths = save(fig, out_dir(args), stem, table.set_index("run_id"))
    spread.to_csv(out_dir(args) / f"{stem}_spread.csv", index=False)
    paths.append(out_dir(args) / f"{stem}_spread.csv")
    log.info("wrote %s", paths[-1])
    print(
        f"Collapse of {args.metric} onto {xname} ({', '.join(args.experiment)}): "
        f"{len(spread)} groups of runs that share {xname} and differ only in "
        f"{', '.join(INGREDIENTS[args.x])}" + (f"; max spread = {worst:.3g}" if len(spread) else "")
    )
    if len(spread):
        print(to_markdown(spread.head(10)))
    return paths


COLLAPSE_COMMAND = Command(_collapse_arguments, _collapse_main,
                           "Figure 2b/5d: a metric vs βα^M or βα^M√L, and how exact the collapse is")


# --------------------------------------------------------------------------- iso-rank contours
def contour_points(grid: pd.DataFrame, level: float) -> pd.Series:
    """Where each row of ``grid`` first crosses ``level``, interpolated linearly in log x.

    Args:
        grid: rows = y values (e.g. depth L), columns = ascending x values (e.g. α > 0),
            cells = the metric (NaN allowed).
        level: the contour level.

    Returns:
        ``x`` at the crossing per row (index = y); rows that never cross are left out.
        The first crossing from small x is taken, where the metric first reaches the
        level (rank falls with α; noise can make it cross again at large α).
    """
    xs = np.log(np.asarray(grid.columns, dtype=float))
    out = {}
    for y, row in grid.iterrows():
        v = row.to_numpy(dtype=float)
        ok = np.isfinite(v)
        lx, v = xs[ok], v[ok] - level
        for j in range(len(v) - 1):
            if v[j] == 0:
                out[y] = float(np.exp(lx[j]))
                break
            if v[j] * v[j + 1] <= 0:
                t = v[j] / (v[j] - v[j + 1])
                out[y] = float(np.exp(lx[j] + t * (lx[j + 1] - lx[j])))
                break
    return pd.Series(out, dtype=float, name=level)


def sparse_grid(grid: pd.DataFrame) -> bool:
    """Whether a (y × x) table of runs is a contour sweep's, not a grid's: most cells empty
    (each depth measured at its own α values, :mod:`hydra_plugins.rankexp_plugins.contour`)."""
    return bool(grid.isna().to_numpy().mean() > 0.5)


def fit_power_law(y, x) -> tuple[float, float, float]:
    """Least-squares fit of ``log x = s log y + c`` (x ∝ y^s).

    Returns:
        ``(s, c, r²)``; NaN when fewer than two points.  ``r²`` is 1 for two points.
    """
    ly, lx = np.log(np.asarray(y, dtype=float)), np.log(np.asarray(x, dtype=float))
    if ly.size < 2:
        return float("nan"), float("nan"), float("nan")
    s, c = np.polyfit(ly, lx, 1)
    resid = lx - (s * ly + c)
    tot = ((lx - lx.mean()) ** 2).sum()
    return float(s), float(c), float(1 - (resid**2).sum() / tot) if tot > 0 else 1.0


def isorank_table(
    df: pd.DataFrame,
    metric: str,
    levels: list[float],
    panel: list[str],
    x: str = "alpha",
    y: str = "depth",
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Iso-rank contours and their power-law slopes (Table 4).

    For each panel (combination of ``panel`` keys) the mean of ``metric`` over runs per
    (y, x) cell forms a grid; for each level, :func:`contour_points` gives x at the level in
    each row and :func:`fit_power_law` the slope d log x / d log y.  ``slope_ratio`` is the
    same fit for the nominal ratio at the crossing, ``β_eff(L) · x^M`` (x = α), i.e.
    d log(βα^M) / d log L.

    Returns:
        ``(slopes, points)``: slopes indexed by panel keys + ``level`` with columns
        ``points``, ``slope_alpha``, ``slope_ratio`` with its 95 % interval ``slope_ratio_lo``,
        ``slope_ratio_hi`` (:func:`hydra_plugins.rankexp_plugins.contour.fit_exponent`; NaN below 3 points),
        ``r2``, ``depth_min``, ``depth_max``;
        points: one row per (panel, level, y) with ``x`` and ``ratio`` at the crossing.
    """
    rows, pts = [], []
    groups = df.groupby(panel, sort=True) if panel else [((), df)]
    for pv, sub in groups:
        pv = pv if isinstance(pv, tuple) else (pv,)
        grid = sub.groupby([y, x])[metric].mean().unstack(x).sort_index()
        grid = grid.reindex(sorted(grid.columns), axis=1)
        beta = sub.groupby(y)["beta_eff"].agg(["min", "max"]) if "beta_eff" in sub else None
        m = sub["matrices"].iloc[0] if "matrices" in sub else np.nan
        if "matrices" in sub and sub["matrices"].nunique() > 1:
            raise SelectionError(
                f"panel {dict(zip(panel, pv, strict=True))} mixes matrices "
                f"{sorted(sub['matrices'].unique())}; add 'matrices' to --panel"
            )
        for level in levels:
            c = contour_points(grid, level)
            ratio = pd.Series(np.nan, index=c.index)
            if beta is not None and len(c):
                b = beta.loc[c.index]
                if not np.allclose(b["min"], b["max"], rtol=1e-12):
                    raise SelectionError(
                        "runs of one depth have different beta_eff; select one β "
                        "with --where beta=VALUE"
                    )
                ratio = b["min"] * c**m
            s, _, r2 = fit_power_law(c.index, c.values)
            fit = fit_exponent(c.index, ratio.values) if ratio.notna().all() and len(c) else None
            sr = fit.s if fit is not None else np.nan
            key = dict(zip(panel, pv, strict=True))
            rows.append(
                {
                    **key,
                    "level": level,
                    "points": len(c),
                    "slope_alpha": s,
                    "slope_ratio": sr,
                    "slope_ratio_lo": fit.lo if fit is not None else np.nan,
                    "slope_ratio_hi": fit.hi if fit is not None else np.nan,
                    "r2": r2,
                    "depth_min": c.index.min() if len(c) else np.nan,
                    "depth_max": c.index.max() if len(c) else np.nan,
                }
            )
            pts += [
                {**key, "level": level, y: yy, x: xx, "ratio": rr}
                for yy, xx, rr in zip(c.index, c.values, ratio.values, strict=True)
            ]
    slopes = pd.DataFrame(rows).set_index([*panel, "level"])
    points = pd.DataFrame(pts, columns=[*panel, "level", y, x, "ratio"])
    return slopes, points


def _isorank_arguments(p: argparse.ArgumentParser) -> None:
    set_experiment_default(p, ["fig5"], "MLflow experiment(s) (default: fig5)")
    p.add_argument(
        "--metric",
        default="erank_io",
        help="contoured metric (default: erank_io = erank(∂h_L/∂h_0)/d)",
    )
    p.add_argument(
        "--levels",
        type=lambda s: [float(v) for v in s.split(",")],
        default=[0.05, 0.1, 0.2, 0.3, 0.5],
        help="comma-separated contour levels (default: 0.05,0.1,0.2,0.3,0.5)",
    )
    p.add_argument(
        "--panel",
        nargs="*",
        default=[PLACEMENT, "expansion"],
        help=f"one panel per combination (default: {PLACEMENT} expansion)",
    )
    add_where(p)


def _isorank_main(args: argparse.Namespace) -> list[Path]:
    df = load(args, [args.metric, "alpha", "depth", *args.panel])
    warn_mixed(df, ["alpha", "depth", *args.panel], args.experiment)
    slopes, points = isorank_table(df, args.metric, args.levels, args.panel)
    groups = _panels(df, args.panel)
    flat = slopes.reset_index()
    fig, axes = style.panels(len(groups), max_cols=2, aspect=0.8)
    level_colors, _ = style.value_colors(args.levels, "autumn", stop=0.8)
    for ax, (pv, sub) in zip(axes, groups, strict=True):
        pv = pv if isinstance(pv, tuple) else (pv,)
        grid = sub.groupby(["depth", "alpha"])[args.metric].mean().unstack("alpha").sort_index()
        grid = grid.reindex(sorted(grid.columns), axis=1)
        sparse = sparse_grid(grid)
        if sparse:  # a contour sweep (hydra/sweeper=contour): each run where it was measured
            cells = grid.stack().reset_index(name="v")
            im = ax.scatter(cells["alpha"], cells["depth"], c=cells["v"], s=5, cmap="Greys_r",
                            vmin=0, vmax=1, edgecolors="none")
        else:
            a, L = np.meshgrid(grid.columns.to_numpy(float), grid.index.to_numpy(float))
            im = ax.pcolormesh(
                a, L, grid.to_numpy(float), shading="nearest", cmap="Greys_r", vmin=0, vmax=1
            )
        key = dict(zip(args.panel, pv, strict=True))
        sel, sel_s = np.ones(len(points), dtype=bool), np.ones(len(flat), dtype=bool)
        for k, v in key.items():
            sel &= (points[k] == v).to_numpy()
            sel_s &= (flat[k] == v).to_numpy()
        m = float(sub["matrices"].iloc[0]) if "matrices" in sub else 2.0
        for level in args.levels:
            pt = points[sel & (points["level"] == level).to_numpy()]
            color = level_colors[level]
            s = flat.loc[sel_s & (flat["level"] == level).to_numpy(), "slope_ratio"].iloc[0]
            if pt.empty:
                continue
            ax.plot(pt["alpha"], pt["depth"], "o-", color=color, ms=2.5, lw=1.0,
                    label=f"{level:g}: ${s:.2f}$" if np.isfinite(s) else f"{level:g}")
            if len(pt) >= 2:  # the study's law βα^M ∝ L^(−1/2) through the contour's centre
                L = np.geomspace(pt["depth"].min(), pt["depth"].max(), 20)
                a0 = np.exp(np.log(pt["alpha"]).mean())
                L0 = np.exp(np.log(pt["depth"]).mean())
                ax.plot(a0 * (L / L0) ** (-0.5 / m), L, color="0.55", ls="--", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_yticks(grid.index, [str(int(d)) for d in grid.index])
        alphas = grid.columns.to_numpy(float)
        every = 1 if len(alphas) <= 5 else 2  # keep the α labels apart
        if not sparse:  # a grid: its α values as ticks (a contour sweep keeps the log ticks)
            ax.set_xticks(alphas, [style.number(a) if i % every == 0 else ""
                                   for i, a in enumerate(alphas)])
        ax.minorticks_off()
        ax.grid(False)
        ax.set_xlabel(style.name("alpha"))
        ax.set_ylabel(style.name("depth"))
        ax.set_title(", ".join(style.value_label(k, v) for k, v in key.items()))
        if ax is axes[0]:
            ax.plot([], [], color="0.55", ls="--", lw=0.8, label=r"$L^{-1/2}$ (study)")
        ax.legend(loc="lower left", fontsize=5, handlelength=1.2, labelspacing=0.2,
                  frameon=True, framealpha=0.75, edgecolor="none", title=r"$r^*$: $s$",
                  title_fontsize=5)
    style.colorbar(fig, im, axes, args.metric)
    fig.suptitle(rf"Figure 5c: iso-{style.name(args.metric)} contours over $(\alpha, L)$")
    style.caption(fig, df, args.experiment, [
        "grey: mean over seeds",
        r"legend: level $r^*$ and fitted $s = d\log\beta\alpha^M/d\log L$",
        r"dashed: the study's $\beta\alpha^M \propto L^{-1/2}$"])
    md = to_markdown(slopes)
    print(
        f"Iso-rank contour slopes ({', '.join(args.experiment)}, {args.metric}): "
        "slope_alpha = d log α / d log L, slope_ratio = d log(βα^M) / d log L "
        "(study, Table 4: ≈ −0.50 for post)\n"
    )
    print(md)
    out = out_dir(args)
    paths = save(fig, out, f"isorank_{args.metric}", slopes)
    points.to_csv(out / f"isorank_{args.metric}_points.csv", index=False)
    paths += [
        out / f"isorank_{args.metric}_points.csv",
        write_text(out / f"isorank_{args.metric}.md", md + "\n"),
    ]
    return paths


ISORANK_COMMAND = Command(_isorank_arguments, _isorank_main,
                          "Figure 5c/Table 4: iso-rank contours over (α, L) and their power-law slopes")

COMMANDS = {"collapse": COLLAPSE_COMMAND, "isorank": ISORANK_COMMAND}
