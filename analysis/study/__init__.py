"""The study's core figures and tables: Figures 1–8 and 16, Tables 1, 4–6; and the helpers their
modules share (claims' measures, titled and captioned figures, tables in a given order)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from ..core import style
from ..core.claims import Measured, Runs, seed_std, seedwise
from ..core.select import need, only, ordered


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


def extreme(df: pd.DataFrame, metric: str, note, *, lowest: bool = False,
            absolute: bool = False) -> Measured:
    """The run of ``df`` with the largest ``metric`` (``lowest``: the smallest; ``absolute``: the
    largest ``|metric|``, as its value) ± its ``<metric>_std``; ``note``: a function of the run."""
    v = df[metric].abs() if absolute else df[metric]
    r = df.loc[v.idxmin() if lowest else v.idxmax()]
    return Measured(float(abs(r[metric]) if absolute else r[metric]),
                    float(r.get(f"{metric}_std", math.nan)), note(r))


def worst(dev: dict, what: str, suffix: str = "") -> Measured:
    """The largest value of ``dev`` (activation σ → deviation), named in the note."""
    w = max(dev, key=dev.get)
    return Measured(float(dev[w]), math.nan, f"{what} over σ ∈ {sorted(dev)} (worst: {w}{suffix})")


def publish(fig, title: str, df: pd.DataFrame, experiments: Sequence[str] | str,
            notes: Sequence[str], out: Path, stem: str, table=None) -> list[Path]:
    """``fig`` titled, captioned (:func:`analysis.core.style.caption`) and saved with ``table``."""
    fig.suptitle(title)
    style.caption(fig, df, experiments, notes)
    return style.save(fig, out, stem, table)


def in_order(table: pd.DataFrame, level: str, order: list[str]) -> pd.DataFrame:
    """``table`` sorted by its index, the values of the index level ``level`` in ``order``
    (unknown ones last, :func:`analysis.core.select.ordered`)."""
    rank = {v: i for i, v in enumerate(ordered(table.index.get_level_values(level), order))}
    return table.sort_index(key=lambda s: s.map(rank) if s.name == level else s)
