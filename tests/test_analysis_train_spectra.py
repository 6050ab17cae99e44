"""train_spectra's claims, each made to fail in both directions on a hand-made series table, and
its figure drawn from one (legend per learning rate, log x, init and collapse levels marked)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.core import claims as core
from analysis.core import style
from analysis.core.registry import default
from analysis.study import train_spectra as ts

CLAIMS = {c.id: c for c in default().claims()}
STEPS = [0, 1, 10, 100]


def table(**members) -> pd.DataFrame:
    """``members``: name → (placement, quantity, values at STEPS[, diverged])."""
    rows = []
    for i, (placement, quantity, values, *div) in enumerate(members.values()):
        rows += [(f"r{i}", placement, 1.0, 12, 1e-3, bool(div and div[0]), quantity, s, v)
                 for s, v in zip(STEPS, values, strict=True)]
    return pd.DataFrame(rows, columns=["run_id", ts.PLACEMENT, "alpha", "depth", "lr", "diverged",
                                       "quantity", "step", "value"])


def verdict(cid: str, m) -> str:
    return CLAIMS[cid].check.verdict(m.value, m.spread)


def test_post_stays_collapsed_fails_on_recovery_and_is_not_run_without_collapse():
    stays = table(a=("post", "erank_io", [0.016, 0.016, 0.017, 0.018]))
    assert verdict("train_spectra.post_stays_collapsed", ts.post_recovery(stays)) == core.HOLDS
    recovers = table(a=("post", "erank_io", [0.016, 0.05, 0.1, 0.3]))
    assert verdict("train_spectra.post_stays_collapsed", ts.post_recovery(recovers)) == core.FAILS
    # a diverged member is not counted; a network not collapsed at init is not a case
    diverged = table(a=("post", "erank_io", [0.016, 0.05, 0.1, 0.3], True),
                     b=("post", "erank_io", [0.016, 0.016, 0.016, 0.016]))
    assert verdict("train_spectra.post_stays_collapsed", ts.post_recovery(diverged)) == core.HOLDS
    with pytest.raises(core.NotRun):
        ts.post_recovery(table(a=("post", "erank_io", [0.3, 0.3, 0.3, 0.3])))


def test_pre_floor_fails_when_any_step_dips_below():
    kept = table(a=("pre", "erank_io", [0.6, 0.5, 0.3, 0.21]))
    assert verdict("train_spectra.pre_floor", ts.pre_floor_kept(kept)) == core.HOLDS
    dips = table(a=("pre", "erank_io", [0.6, 0.19, 0.3, 0.4]))  # only in the middle
    assert verdict("train_spectra.pre_floor", ts.pre_floor_kept(dips)) == core.FAILS


def test_longer_paths_fails_when_k_falls_or_stays():
    up = table(a=("pre", "mean_path_order", [3.0, 3.0, 3.5, 4.0]),
               b=("post", "mean_path_order", [2.0, 2.0, 2.1, 2.2]),
               c=("pre", "mean_path_order", [3.0, 3.0, 3.2, 3.3]))
    m = ts.path_order_shift(up)
    assert m.value == pytest.approx(0.3) and verdict("train_spectra.longer_paths", m) == core.HOLDS
    down = table(a=("pre", "mean_path_order", [3.0, 3.0, 2.5, 2.0]))
    assert verdict("train_spectra.longer_paths", ts.path_order_shift(down)) == core.FAILS
    flat = table(a=("pre", "mean_path_order", [3.0, 3.0, 3.0, 3.0]))
    assert verdict("train_spectra.longer_paths", ts.path_order_shift(flat)) == core.FAILS


def test_figure_of_a_cell():
    t = pd.concat([table(a=("pre", q, [0.5, 0.5, 0.4, 0.3]), b=("post", q, [0.016, 0.02, 0.02, 0.02]))
                   for q in ts.QUANTITIES], ignore_index=True)
    t = pd.concat([t, t.assign(lr=1e-2, value=t["value"] * 1.1)], ignore_index=True)
    fig = ts.draw_cell(t)
    axes = np.array(fig.axes).reshape(len(ts.QUANTITIES), 2)
    assert [ax.get_title() for ax in axes[0]] == [style.value_label(ts.PLACEMENT, p) for p in ("pre", "post")]
    assert all(ax.get_xscale() == "log" for ax in axes.flat)
    assert axes[0, 0].get_ylabel() == style.name("erank_io") and "$" in axes[2, 0].get_ylabel()
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["lr = 0.001", "lr = 0.01", "init (step 0)", f"collapse ({ts.COLLAPSE:g})"]
    # the init level is step 0's value; the collapse line only on the erank rows
    levels = {ln.get_label(): ln.get_ydata()[0] for ln in axes[0, 1].lines if ln.get_label()[:4] in ("init", "coll")}
    assert math.isclose(levels["init (step 0)"], 0.016 * 1.05)
    assert not any("collapse" in ln.get_label() for ln in axes[1, 0].lines)
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_the_command_draws_a_publication_ready_figure_per_cell(monkeypatch, tmp_path):
    """``python -m analysis train-spectra`` end to end on a hand-made series table (the store
    stubbed: the every-experiment test reads a real one under -m slow, since it trains), every
    figure through figure_checks."""
    from figure_checks import checked

    t = pd.concat([table(a=("pre", q, [0.5, 0.5, 0.4, 0.3]), b=("post", q, [0.016, 0.02, 0.02, 0.02]))
                   for q in ts.QUANTITIES], ignore_index=True)
    runs = pd.DataFrame({"run_id": ["r0", "r1"], ts.PLACEMENT: ["pre", "post"], "alpha": [1.0, 1.0],
                         "depth": [12, 12], "width": [64, 64], "seeds": [1, 1], "seed": [0, 0]})
    monkeypatch.setattr(ts, "load", lambda args, keys: runs)
    monkeypatch.setattr(ts, "spectra_table", lambda uri, r: t)
    with checked(["train-spectra", "--uri", "sqlite:///unused.db", "--out", str(tmp_path)]) as (rc, figs):
        assert rc == 0 and set(figs) == {"train_spectra_a1_L12"}
