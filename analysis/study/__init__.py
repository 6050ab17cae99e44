"""The study's core figures and tables: Figures 1–8 and 16, Tables 1, 4–6."""

from __future__ import annotations

import pandas as pd

from ..core.claims import Measured, Runs, seed_std, seedwise
from ..core.select import need, only


def mean_of(experiment: str, metric: str, note="", **where):
    """A claim's measure: mean ``metric`` over the runs of ``experiment`` that match ``where``
    (:func:`analysis.core.select.only`) ± its seed s.d.; ``note``: text or a function of them."""

    def measure(runs: Runs) -> Measured:
        df = only(runs(experiment), **where)
        need(df, metric)
        return Measured(float(df[metric].mean()), seed_std(df, metric),
                        note(df) if callable(note) else note)

    return measure


def mean_ratio(runs: Runs, top: pd.DataFrame, bottom: pd.DataFrame, metric: str,
               note: str) -> Measured:
    """Mean ``metric`` of the runs ``top`` ÷ that of ``bottom``, ± its s.d. over seeds."""
    both = pd.concat([top.assign(_g=0), bottom.assign(_g=1)], ignore_index=True)

    def ratio(d):
        return d[d["_g"] == 0][metric].mean() / d[d["_g"] == 1][metric].mean()

    return Measured(ratio(both), seedwise(runs, both, [metric], ratio), note)
