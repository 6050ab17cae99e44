"""Figure 13 (ranks): branch-output norm on the fig6 grid: the claims and the registry entry."""

from __future__ import annotations

import math

from ..core.claims import Claim, Measured, Runs, at_least
from ..core.registry import Experiment
from ..core.select import need


def _fig13_rank(runs: Runs) -> Measured:
    df = runs("fig13")
    need(df, "erank_io")
    i = df["erank_io"].idxmin()
    return Measured(float(df.loc[i, "erank_io"]), float(df.loc[i].get("erank_io_std", math.nan)),
                    f"lowest cell: α = {df.loc[i, 'alpha']:g}, L = {int(df.loc[i, 'depth'])}")


FIG13 = (Claim("fig13.rank_floor", "Output norm: the rank stays above collapse at every α "
               "and L, like Pre-Norm", "the study, fig13", "above collapse (≫ 0.02)",
               at_least(0.1), _fig13_rank),)

EXPERIMENTS = (
    Experiment("fig13", "Figure 13 (ranks): branch-output norm on the fig6 grid",
               "the study, fig13", analyses=("heatmap --experiment fig13",), claims=FIG13),)
