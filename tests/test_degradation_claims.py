"""The degradation replication's gradient-growth claim (analysis/degradation/claims.py) on
crafted runs: the fitted growth factor per conv layer is the closed form of geometric data,
its seed spread the closed form of a two-point line, and the claim fails in both directions —
below the tolerance (a slow, still monotone growth the old check let pass) and above it (the
fully-connected mean-field rate) — and is inconclusive where the seed interval straddles it."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.core import claims as core
from analysis.degradation import degradation
from analysis.degradation.degradation import conv_steps, gradient_ratio_table
from rankexp import theory

CLAIM = next(c for c in degradation.DEGRADATION if c.id == "degradation.plain_grad_ratio_grows")
DEPTHS = (20, 32, 44, 56, 110)


def runs(growth: float, rel_spread: float = 0.5, depths=DEPTHS, offset: float = 3.0) -> pd.DataFrame:
    """Runs whose plain ratio is ``offset · growth^(6n−1)`` (``offset``: the stage changes),
    seed s.d. ``rel_spread`` × ratio, and ResNets at ratio 2, as ``load_runs`` gives them."""
    rows = []
    for d in depths:
        plain = offset * growth ** float(conv_steps(d))
        rows += [{"residual": False, "depth": d, "grad_ratio": plain, "grad_ratio_std": rel_spread * plain},
                 {"residual": True, "depth": d, "grad_ratio": 2.0, "grad_ratio_std": 0.2}]
    return pd.DataFrame(rows)


def verdict(table: pd.DataFrame) -> tuple[str, core.Measured]:
    m = degradation.plain_growth_per_conv(gradient_ratio_table(table))
    return CLAIM.check.verdict(m.value, m.spread), m


def test_the_fit_is_the_growth_of_geometric_data_whatever_the_stage_changes():
    for growth in (1.05, 1.13, 1.211):
        for offset in (0.1, 3.0):
            m = degradation.plain_growth_per_conv(gradient_ratio_table(runs(growth, offset=offset)))
            assert m.value == pytest.approx(growth, rel=1e-12)
    # the seed spread of a two-point line: Var k = (σ₁² + σ₂²)/(x₂ − x₁)² in ln units
    m = degradation.plain_growth_per_conv(gradient_ratio_table(runs(1.13, 0.3, depths=(20, 56))))
    dx = float(conv_steps(56) - conv_steps(20))
    assert m.spread == pytest.approx(1.13 * math.sqrt(2 * 0.3**2) / dx, rel=1e-9)
    # no seed spread logged: an unweighted fit, no spread
    bare = gradient_ratio_table(runs(1.13)).drop(columns=["plain_std"])
    m = degradation.plain_growth_per_conv(bare)
    assert m.value == pytest.approx(1.13, rel=1e-12) and math.isnan(m.spread)


@pytest.mark.parametrize("growth,expected", [
    (1.13, core.HOLDS),                       # the replication's rate
    (1.143, core.HOLDS),                      # the README's size=cpu table, fitted
    (1.05, core.FAILS),                       # below: monotone growth, too slow
    (1.02, core.FAILS),
    (theory.BN_RELU_GRADIENT_GROWTH, core.FAILS),  # above: the fully-connected mean-field rate
    (1.30, core.FAILS),
])
def test_the_claim_fails_in_both_directions(growth, expected):
    got, m = verdict(runs(growth, rel_spread=0.1))
    assert got == expected, (growth, m)
    assert "tolerance ±0.04" in m.note and "1.211" in m.note


def test_the_old_monotone_check_passed_what_the_quantitative_one_refuses():
    """1.02 per conv grows at every depth (the old claim: holds) but is no BN explosion."""
    r = gradient_ratio_table(runs(1.02))["plain"]
    assert (np.diff(np.log(r.to_numpy())) > 0).all()
    assert verdict(runs(1.02))[0] == core.FAILS


def test_a_seed_interval_across_the_edge_is_inconclusive_and_one_depth_is_not_run():
    got, m = verdict(runs(1.13 + 0.04, rel_spread=1.0, depths=(20, 32)))
    assert got == core.INCONCLUSIVE and m.spread > 0.01, m
    with pytest.raises(core.NotRun):
        degradation.plain_growth_per_conv(gradient_ratio_table(runs(1.13, depths=(8,))))
    assert CLAIM.size == "cpu" and CLAIM.check.region == pytest.approx((1.09, 1.17))
