"""Table 5's claims on ``experiment=tab5_boundary`` (one-rate runs of the boundary sweep): each
measured on synthetic one-rate tables whose boundaries are known, and each made to fail in both
directions (the study, tab5: Pre-Norm 1e-2 everywhere; Post-Norm α = 0.5
10^{−2, −2, −2.5, −3, −3.5, −4.5}, narrowing faster at larger α)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis.core import claims as core
from analysis.core.registry import default
from analysis.core.select import PLACEMENT
from analysis.study import fig6_train, tab5_boundary

CLAIMS = {c.id: c for c in default().claims()}
RATES = [10 ** (-4.5 + 0.5 * k) for k in range(6)]  # 3e-5 … 1e-2, half a decade apart


def runs(boundary: dict) -> pd.DataFrame:
    """One-rate runs at RATES for each (placement, depth, α) → log10 boundary: a rate is stable
    (max_stable_lr = its rate) at or below 10^boundary, NaN above (None: nothing stable)."""
    rows = [{PLACEMENT: p, "depth": d, "alpha": a, "lr": lr,
             "max_stable_lr": lr if b is not None and math.log10(lr) <= b + 1e-9 else math.nan}
            for (p, d, a), b in boundary.items() for lr in RATES]
    return pd.DataFrame(rows)


def verdict(cid: str, boundary: dict) -> str:
    claim = CLAIMS[cid]
    m = claim.measure(lambda name: runs(boundary) if name == "tab5_boundary" else pd.DataFrame())
    return claim.check.verdict(m.value, m.spread)


def table(pre: float | None, post: dict) -> dict:
    """Pre-Norm at ``pre`` at every depth and α of ``post`` ({(depth, α): log10 boundary})."""
    return {**{("pre", d, a): pre for d, a in post}, **{("post", d, a): b for (d, a), b in post.items()}}


TABLE5 = {(d, 0.5): v for d, v in fig6_train.TABLE5_POST.items() if d <= 192}


def test_the_tab5_boundary_claims_are_registered_on_its_runs():
    ids = {c.id for c in CLAIMS.values() if c.experiment == "tab5_boundary"}
    assert ids == {c.id for c in tab5_boundary.TAB5_BOUNDARY} and len(ids) == 5


def test_pre_top_holds_at_1e_2_and_fails_below_or_with_nothing_stable():
    assert verdict("tab5_boundary.pre_top", table(-2.0, TABLE5)) == core.HOLDS
    # stable at 10^-2.5, not at 1e-2: the midpoint 10^-2.25 is 1e-2 within the reading …
    assert verdict("tab5_boundary.pre_top", table(-2.5, TABLE5)) == core.HOLDS
    assert verdict("tab5_boundary.pre_top", table(-3.0, TABLE5)) == core.FAILS  # … 10^-2.75 is not
    none = {**table(-2.0, TABLE5), ("pre", 48, 0.5): None}
    assert verdict("tab5_boundary.pre_top", none) == core.FAILS


def test_pre_above_post_fails_when_post_is_above_and_holds_when_post_is_unstable():
    assert verdict("tab5_boundary.pre_above_post", table(-2.0, TABLE5)) == core.HOLDS
    assert verdict("tab5_boundary.pre_above_post", table(-3.0, {(12, 0.5): -2.0})) == core.FAILS
    assert verdict("tab5_boundary.pre_above_post", table(-2.0, {(12, 0.5): None})) == core.HOLDS
    assert verdict("tab5_boundary.pre_above_post", table(None, {(12, 0.5): -3.0})) == core.FAILS


def test_post_shrinks_and_table5_hold_on_table5_and_fail_too_flat_or_too_steep():
    for cid in ("tab5_boundary.post_lr_shrinks", "tab5_boundary.post_alpha_half"):
        assert verdict(cid, table(-2.0, TABLE5)) == core.HOLDS, cid
        flat = table(-2.0, {k: -2.0 for k in TABLE5})  # no fall: Table 5 falls 1.5 decades
        steep = table(-2.0, {k: v - (1.0 if k[0] == 192 else 0.0) for k, v in TABLE5.items()})
        assert verdict(cid, flat) == core.FAILS and verdict(cid, steep) == core.FAILS, cid


def test_post_narrows_faster_at_larger_alpha_or_fails():
    # boundaries off the range's top (the top reads as itself, the others as midpoints)
    faster = {(12, 0.5): -2.5, (192, 0.5): -3.5, (12, 4.0): -2.5, (192, 4.0): -4.0}
    same = {(12, 0.5): -2.5, (192, 0.5): -3.5, (12, 4.0): -3.0, (192, 4.0): -4.0}
    slower = {(12, 0.5): -2.5, (192, 0.5): -3.5, (12, 4.0): -3.0, (192, 4.0): -3.5}
    gone = {**faster, (192, 4.0): None}  # nothing stable at the deepest: narrowed past the range
    cid = "tab5_boundary.post_narrows_with_alpha"
    assert verdict(cid, table(-2.0, faster)) == core.HOLDS and verdict(cid, table(-2.0, gone)) == core.HOLDS
    assert verdict(cid, table(-2.0, same)) == core.FAILS and verdict(cid, table(-2.0, slower)) == core.FAILS
    with pytest.raises(core.NotRun):
        CLAIMS[cid].measure(lambda name: runs(table(-2.0, {(12, 0.5): -2.0, (12, 4.0): -2.5})))
