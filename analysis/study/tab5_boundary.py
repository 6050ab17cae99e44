"""Table 5 by root finding: the max stable learning rate traced by hydra/sweeper=contour: the
claims and the registry entry."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..core.claims import Claim, Measured, NotRun, Runs, at_least, at_most, below, near
from ..core.registry import Experiment, Needs
from ..core.select import PLACEMENT, need
from .fig6_train import post_lr_shrink_error, post_table5_error, table5

#: the boundary sweep's reading: each cell's boundary is bisected to half a decade, its
#: midpoint ±0.25 decades (conf/experiment/tab5_boundary.yaml: tol = ln 10^0.5)
BOUNDARY_READING = 0.25


def boundary_cells(df: pd.DataFrame) -> pd.Series:
    """One-rate runs of ``experiment=tab5_boundary`` as each (placement, depth, α) cell's
    max stable LR (:func:`analysis.study.fig6_train.table5`: the bisection's midpoint; NaN where
    no rate was stable), a Series indexed by (placement, depth, α)."""

    need(df, "max_stable_lr", "lr")
    wide = table5(df).drop(columns="max over alpha")
    wide.columns = [float(c.split("=", 1)[1]) for c in wide.columns]
    cells = wide.stack(future_stack=True)
    cells.index = cells.index.set_names([PLACEMENT, "depth", "alpha"])
    return cells


def _log10(v: float) -> float:
    return math.log10(v) if np.isfinite(v) and v > 0 else -math.inf


def pre_top_lr(cells: pd.Series) -> Measured:
    """log10 of Pre-Norm's smallest (over depths) max-over-α boundary (Table 5: 1e-2, the LR
    range's top, at every depth); −∞ when a depth has no stable rate."""
    if "pre" not in cells.index.get_level_values(0):
        raise NotRun("no Pre-Norm cell")
    by_depth = cells.xs("pre", level=0).groupby(level="depth").max()
    return Measured(min(_log10(v) for v in by_depth), math.nan,
                    f"min over L ∈ {[int(d) for d in by_depth.index]} of log10 max over α")


def pre_above_post(cells: pd.Series) -> Measured:
    """The smallest log10(Pre-Norm / Post-Norm) boundary over the (depth, α) cells both have
    (Table 5: Pre-Norm 1e-2 everywhere, Post-Norm at or below it); a Post-Norm cell with no
    stable rate is +∞ (Pre above), a Pre-Norm one −∞."""
    if not {"pre", "post"} <= set(cells.index.get_level_values(0)):
        raise NotRun("needs Pre- and Post-Norm cells")
    pre, post = cells.xs("pre", level=0), cells.xs("post", level=0)
    both = pre.index.intersection(post.index)
    if both.empty:
        raise NotRun("no (depth, α) cell with both placements")
    gaps = [_log10(pre[k]) - _log10(post[k]) if np.isfinite(_log10(post[k])) else math.inf for k in both]
    return Measured(float(min(gaps)), math.nan,
                    f"min over {len(both)} (L, α) cells of log10(Pre / Post max stable LR)")


def post_narrows_with_alpha(cells: pd.Series) -> Measured:
    """Post-Norm's fall of log10 boundary from the shallowest to the deepest depth at the
    largest α minus that at the smallest α (Table 5: the stable range narrows faster at larger
    α: negative); −∞ when the larger α has nothing stable at the deepest depth."""
    post = cells.xs("post", level=0) if "post" in cells.index.get_level_values(0) else cells.iloc[:0]
    alphas = sorted(set(post.index.get_level_values("alpha")))
    depths = sorted(set(post.index.get_level_values("depth")))
    if len(alphas) < 2 or len(depths) < 2:
        raise NotRun("needs Post-Norm cells at two α and two depths")

    def fall(a: float) -> float:
        first, last = post.get((depths[0], a), math.nan), post.get((depths[-1], a), math.nan)
        if not np.isfinite(_log10(first)):
            raise NotRun(f"Post-Norm α = {a:g}: no stable rate even at L = {depths[0]}")
        return _log10(last) - _log10(first)

    small, large = fall(alphas[0]), fall(alphas[-1])
    return Measured(large - small, math.nan,
                    f"Δ log10 LR from L = {depths[0]} to {depths[-1]}: α = {alphas[-1]:g} {large:.3g} "
                    f"vs α = {alphas[0]:g} {small:.3g}")


def _on_cells(fn):
    """``fn`` of the boundary cells (:func:`boundary_cells`) of the store's tab5_boundary runs."""
    return lambda runs: fn(boundary_cells(runs("tab5_boundary")))


def _post_half(runs: Runs) -> pd.Series:
    cells = boundary_cells(runs("tab5_boundary"))
    post = cells[[p == "post" and math.isclose(float(a), 0.5) for p, _, a in cells.index]]
    if post.empty:
        raise NotRun("no Post-Norm α = 0.5 cell")
    return post.droplevel([0, 2]).sort_index()


TAB5_BOUNDARY = (
    Claim("tab5_boundary.pre_top", "Table 5 by root finding: Pre-Norm's max stable LR is 1e-2 "
          "(the LR range's top) at every depth (log10, the boundary's reading ±0.25 decades)",
          "the study, tab5", "−2 (1e-2)", at_least(-2.0 - BOUNDARY_READING),
          _on_cells(pre_top_lr), size="cpu"),
    Claim("tab5_boundary.pre_above_post", "Table 5 by root finding: Pre-Norm's max stable LR is at "
          "least Post-Norm's in every (L, α) cell (log10 ratio; two readings of ±0.25 decades)",
          "the study, tab5", "≥ 0 (1e-2 vs ≤ 1e-2)", at_least(-2 * BOUNDARY_READING),
          _on_cells(pre_above_post), size="cpu"),
    Claim("tab5_boundary.post_lr_shrinks", "Table 5 by root finding: Post-Norm's max stable LR "
          "shrinks with depth as Table 5 says (α = 0.5; measured − Table 5 fall in decades, ± half "
          "a decade: the bisection's bracket)", "the study, fig6, tab5", "Table 5's fall",
          near(0.0, 2 * BOUNDARY_READING), lambda runs: post_lr_shrink_error(_post_half(runs)),
          size="full"),
    Claim("tab5_boundary.post_alpha_half", "Table 5 by root finding: Post-Norm α = 0.5, max stable "
          "LR 10^{−2, −2, −2.5, −3, −3.5, −4.5} at L = 12…384 (max |Δ log10|)", "the study, tab5",
          "Table 5", at_most(2 * BOUNDARY_READING),
          lambda runs: post_table5_error(_post_half(runs)), size="full"),
    Claim("tab5_boundary.post_narrows_with_alpha", "Table 5 by root finding: Post-Norm's stable LR "
          "range narrows faster with depth at larger α (fall at the largest α − fall at the "
          "smallest, decades)", "the study, tab5", "< 0", below(0.0),
          _on_cells(post_narrows_with_alpha), size="full"))

EXPERIMENTS = (
    Experiment(
        "tab5_boundary",
        "Table 5 by root finding: the max stable learning rate traced by hydra/sweeper=contour",
        "the study, tab5", analyses=("table5 --experiment tab5_boundary",), claims=TAB5_BOUNDARY,
        needs=Needs(cifar10=True, train=True, gpu_full=True)),)
