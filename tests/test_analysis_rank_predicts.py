"""``python -m analysis rank-predicts`` (analysis/study/rank_predicts.py) on synthetic tables.

Spearman ρ against scipy and closed forms (a monotone map: 1; reversed: −1; ties: average
ranks), ROC-AUC = Mann–Whitney U/(n₁n₀), the seeded bootstrap, the join on architecture knobs,
and the central claim made to hold and to fail on tables built for it.  The end to end at
smoke size is the every-experiment test (tests/test_analysis_experiments.py).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import mannwhitneyu, spearmanr

from analysis.core import claims
from analysis.core.select import SelectionError
from analysis.study import rank_predicts as rp


def test_spearman_is_scipys_and_its_closed_forms():
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 5, 40).astype(float), rng.normal(size=40)  # ties in x
    assert math.isclose(float(rp.spearman(x, y)), spearmanr(x, y).statistic, rel_tol=1e-12)
    z = rng.normal(size=30)
    assert float(rp.spearman(z, np.exp(3 * z))) == pytest.approx(1.0, abs=1e-12)
    assert float(rp.spearman(z, -z**3)) == pytest.approx(-1.0, abs=1e-12)
    # ties share the mean rank: ranks (1.5, 1.5, 3) against (1, 2, 3) → ρ = √3/2
    assert float(rp.spearman(np.array([1., 1., 2.]), np.array([1., 2., 3.]))) == pytest.approx(
        math.sqrt(3) / 2, abs=1e-12)
    assert math.isnan(float(rp.spearman(np.ones(5), z[:5])))  # a constant: undefined
    # ±∞ (an overflowed log synflow) ranks at the end
    assert float(rp.spearman(np.array([1., 2., np.inf]), np.array([0., 1., 2.]))) == 1.0


def test_roc_auc_is_mann_whitney_u_over_n1_n0():
    rng = np.random.default_rng(1)
    score = rng.integers(0, 6, 50).astype(float)
    label = rng.random(50) < 0.4
    u = mannwhitneyu(score[label], score[~label]).statistic
    assert float(rp.roc_auc(score, label)) == pytest.approx(u / (label.sum() * (~label).sum()), rel=1e-12)
    s = np.array([0.1, 0.2, 0.3, 0.4])
    assert float(rp.roc_auc(s, np.array([0, 0, 1, 1]))) == 1.0
    assert float(rp.roc_auc(s, np.array([1, 1, 0, 0]))) == 0.0
    assert float(rp.roc_auc(np.ones(4), np.array([1, 0, 1, 0]))) == 0.5  # all tied: ½
    # positives {2, 4} against negatives {1, 3}: one of the 2 × 2 pairs misordered, 3/4
    assert float(rp.roc_auc(np.array([1., 2., 3., 4.]), np.array([0, 1, 0, 1]))) == 0.75
    assert math.isnan(float(rp.roc_auc(s, np.ones(4, bool))))


def test_bootstrap_interval_is_seeded_and_collapses_on_a_monotone_relation():
    rng = np.random.default_rng(2)
    x = rng.normal(size=25)
    y = x + rng.normal(size=25)
    a = rp.bootstrap_interval(rp.spearman, x, y, resamples=500, seed=3)
    assert a == rp.bootstrap_interval(rp.spearman, x, y, resamples=500, seed=3)
    assert a != rp.bootstrap_interval(rp.spearman, x, y, resamples=500, seed=4)
    assert a[0] < float(rp.spearman(x, y)) < a[1]
    # every resample of a monotone relation has ρ = 1 (one-value resamples are left out)
    assert rp.bootstrap_interval(rp.spearman, x, np.exp(x), resamples=300) == (1.0, 1.0)


def _configs(n: int, sign: float = 1.0, seed: int = 0) -> pd.DataFrame:
    """n joined configs whose erank_io rises (sign = 1) or falls (−1) with the max stable LR;
    a third of them untrainable (max stable LR NaN, the lowest ranks)."""
    rng = np.random.default_rng(seed)
    erank = np.sort(rng.uniform(0.01, 1.0, n))
    lr = 10 ** np.linspace(-4, -2, n)
    lr[: n // 3] = np.nan
    df = pd.DataFrame({"erank_io": erank if sign > 0 else erank[::-1], "max_stable_lr": lr,
                       "best_test_accuracy": np.linspace(0.1, 0.55, n), "grid": "fig6_train"})
    for q in rp.QUANTITIES:
        if q not in df:
            df[q] = rng.normal(size=n)
    return df


def test_the_central_claim_holds_on_rising_rank_and_fails_on_falling_rank():
    claim = {c.id: c for c in rp.RANK_PREDICTS}["rank_predicts.erank_lr"]
    df = _configs(30)
    up = rp.measured(df, "erank_io", "rho:max_stable_lr")
    # the 10 untrainable configs count as max stable LR 0: tied ranks, ρ = scipy's, < 1
    rho = spearmanr(df["erank_io"], df["max_stable_lr"].fillna(0.0)).statistic
    assert up.value == pytest.approx(rho, rel=1e-12) and 0.9 < rho < 1
    assert claim.check.verdict(up.value, up.spread) == claims.HOLDS
    down = rp.measured(_configs(30, -1.0), "erank_io", "rho:max_stable_lr")
    assert down.value == pytest.approx(-rho, rel=1e-12)
    assert claim.check.verdict(down.value, down.spread) == claims.FAILS
    # noise: the interval straddles 0 — inconclusive, not a pass
    noisy = _configs(30)
    noisy["erank_io"] = np.random.default_rng(5).permutation(noisy["erank_io"].to_numpy())
    m = rp.measured(noisy, "erank_io", "rho:max_stable_lr")
    assert m.value - m.spread < 0 and claim.check.verdict(m.value, m.spread) != claims.HOLDS
    auc = {c.id: c for c in rp.RANK_PREDICTS}["rank_predicts.erank_auc"]
    a_up = rp.measured(_configs(30), "erank_io", "auc:trainable", none=0.5)
    a_down = rp.measured(_configs(30, -1.0), "erank_io", "auc:trainable", none=0.5)
    assert (a_up.value, a_down.value) == (1.0, 0.0)
    assert auc.check.verdict(a_up.value, a_up.spread) == claims.HOLDS
    assert auc.check.verdict(a_down.value, a_down.spread) == claims.FAILS
    with pytest.raises(claims.NotRun, match="needs ≥ 6"):
        rp.measured(_configs(5), "erank_io", "rho:max_stable_lr")
    assert claim.size == "cpu"  # smoke runs: not judged at this size


def test_the_table_has_every_quantity_and_statistic_and_nan_below_min_configs():
    df = pd.concat([_configs(12), _configs(4, seed=1).assign(grid="fig16")], ignore_index=True)
    t = rp.prediction_table(df, resamples=200)
    assert set(t.index.get_level_values("grid")) == {"all", "fig6_train", "fig16"}
    assert len(t) == 3 * len(rp.QUANTITIES) * len(rp.STATISTICS)
    assert t.loc[("fig16", "erank_io", "rho:max_stable_lr"), "n"] == 4
    assert t.loc[("fig16", "erank_io", "rho:max_stable_lr")].drop(["n", "n_trainable"]).isna().all()
    row = t.loc[("fig6_train", "erank_io", "rho:max_stable_lr")]
    assert row["value"] > 0.9 and row["lo"] <= row["value"] <= row["hi"]


def test_join_matches_architecture_knobs_and_keeps_what_the_trained_run_logged():
    arch = {"model.name": "mlp", "width": 16, "expansion": 1.0, "matrices": 2, "beta": 1.0,
            "norm.placement": "pre"}
    train = pd.DataFrame([{**arch, "depth": 2, "alpha": 1.0, "best_test_accuracy": 0.3},
                          {**arch, "depth": 4, "alpha": 1.0, "best_test_accuracy": 0.2},
                          {**arch, "depth": 8, "alpha": 1.0, "best_test_accuracy": 0.1,
                           "jacob_cov": -7.0}])
    init = pd.DataFrame([{**arch, "depth": 2, "alpha": 1.0, "seeds": 2, "erank_io": 0.5,
                          "jacob_cov": -3.0},
                         {**arch, "depth": 2, "alpha": 1.0, "seeds": 4, "erank_io": 0.7,
                          "jacob_cov": -5.0},
                         {**arch, "depth": 4, "alpha": 2.0, "erank_io": 0.1},  # another α
                         {**arch, "depth": 8, "alpha": 1.0, "erank_io": 0.2, "jacob_cov": -1.0}])
    out = rp.join_init(train, init)
    assert out["init_runs"].tolist() == [2, 0, 1]
    # a knob both lack (NaN in both tables) still matches: NaN ≠ NaN is not a mismatch
    assert rp.join_init(train.assign(bias=np.nan), init.assign(bias=np.nan))["init_runs"].tolist() \
        == [2, 0, 1]
    assert out.loc[0, "erank_io"] == pytest.approx(0.6) and out.loc[0, "jacob_cov"] == -4.0
    assert math.isnan(out.loc[1, "erank_io"])
    assert out.loc[2, "jacob_cov"] == -7.0 and out.loc[2, "erank_io"] == 0.2  # its own value kept


def test_the_trained_grids_come_from_the_registry():
    found = rp.trained_experiments()
    assert {"fig6_train", "fig13_train", "fig16", "mf_trainability"} <= set(found)
    assert rp.INIT_EXPERIMENT not in found and "fig6" not in found
    assert set(rp.ARCH_KEYS) >= {"depth", "width", "alpha", "norm.placement", "model.name"}
    assert not {"seeds", "seed", "dtype", "task.probes"} & set(rp.ARCH_KEYS)


def test_a_store_without_trained_runs_is_a_selection_error(monkeypatch):
    monkeypatch.setattr(rp, "_load", lambda name, uri: pd.DataFrame())  # an empty store
    with pytest.raises(SelectionError, match="no trained runs"):
        rp.joined_configs("sqlite:///nowhere.db")


def test_the_command_writes_table_and_a_publication_ready_figure(monkeypatch, tmp_path):
    """``python -m analysis rank_predicts`` end to end on joined configs of two grids (the store
    stubbed: the every-experiment test reads a real one, under -m slow since it trains)."""
    from figure_checks import checked

    df = pd.concat([_configs(12).assign(width=16, depth=4, seeds=1), _configs(8, seed=1).assign(
        grid="fig16", width=16, depth=8, seeds=1)], ignore_index=True)
    monkeypatch.setattr(rp, "joined_configs", lambda uri, experiments=None: df)
    with checked(["rank_predicts", "--uri", "sqlite:///unused.db", "--out", str(tmp_path),
                  "--resamples", "200"]) as (rc, figs):
        assert rc == 0 and set(figs) == {"rank_predicts"}
        axes = figs["rank_predicts"].axes
        assert [a.get_xlabel() for a in axes] == ["Spearman ρ", "Spearman ρ", "ROC-AUC"]
        assert "n = 20" in axes[0].get_title()
    md = (tmp_path / "rank_predicts" / "rank_predicts.md").read_text()
    assert "B = 200, seed 0" in md and "| fig16 | erank_io | rho:max_stable_lr |" in md
    csv = pd.read_csv(tmp_path / "rank_predicts" / "rank_predicts.csv")
    assert len(csv) == 3 * len(rp.QUANTITIES) * len(rp.STATISTICS)
