"""Branch Jacobian, Marchenko–Pastur, the activation spike and post-norm's split (Figure 4c/8/9, Table 1/3)."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch

from rankexp import theory as T
from rankexp.models.mlp import ResidualMLP
from rankexp.probes.branch import masked_up_projection, projection_split
from rankexp.probes.jacobian import branch_jacobian, forward_sweep
from rankexp.seeding import gaussian_input
from rankexp.tasks.measure import run_probes


@pytest.mark.parametrize(
    "activation,matrices",
    [("relu", 2), ("gelu", 2), ("swiglu", 2), ("leaky_relu", 2), ("abs", 1), ("tanh", 1)],
)
def test_closed_form_branch_jacobian_matches_forward_mode(activation, matrices):
    """J_f = W_down D W_up (Eq. 9/25) equals torch.func's Jacobian of the module's branch."""
    model = ResidualMLP(
        10, 2, expansion=3, matrices=matrices, activation=activation, placement="none", seeds=[0, 1]
    )
    block = model.blocks[0]
    x = gaussian_input([0, 1], 10)
    a, jf = masked_up_projection(block, x)
    # β = 1 and no norm: J_b = J_f
    torch.testing.assert_close(jf, branch_jacobian(block, x), rtol=1e-12, atol=1e-12)
    assert a.shape == (2, block.hidden, 10)


@functools.cache  # several tests read the same network's measurement
def _branch(activation, expansion, width=256, depth=6, seeds=(0, 1)):
    model = ResidualMLP(width, depth, expansion=expansion, activation=activation, seeds=list(seeds))
    return run_probes(model, ["branch_jacobian"])


@pytest.mark.parametrize("activation,expansion", [("relu", 1), ("relu", 4), ("abs", 1), ("abs", 4)])
def test_marchenko_pastur_fit_at_gamma_pm_over_d(activation, expansion):
    """Gram spectrum of D·W_up is MP at γ = p·m/d for 0/1-type masks (Figure 9)."""
    m = _branch(activation, expansion)
    s, arr = m.scalars, m.arrays
    p = T.activation_constants(activation).survival
    assert s["mp_gamma"] == pytest.approx(p * expansion, rel=1e-6)
    assert s["mp_ks"] < 0.05
    assert s["mp_eig_max"] == pytest.approx(s["mp_edge_upper"], rel=0.08)
    if s["mp_gamma"] != 1:
        assert s["mp_eig_min"] == pytest.approx(s["mp_edge_lower"], abs=0.06)
    assert s["mp_zero_fraction"] == pytest.approx(s["mp_atom_theory"], abs=0.03)
    # the same eigenvalues are far from MP at the naive γ = m/d (the test can fail)
    if activation == "relu":
        naive = T.marchenko_pastur_edges(float(expansion))[1]
        assert abs(s["mp_eig_max"] - naive) / naive > 0.2
    assert arr["mp_hist_density"].shape == arr["mp_theory_density"].shape == (80,)


def test_full_rank_threshold_at_m_over_d_equal_1_over_p():
    """ReLU (p = ½): rank(D W_up)/d = min(1, m/(2d)); full rank from m/d = 1/p = 2."""
    for expansion, expected in ((0.5, 0.25), (1, 0.5), (4, 1.0)):
        s = _branch("relu", expansion).scalars
        assert s["masked_rank_theory"] == pytest.approx(expected)
        assert s["masked_rank"] == pytest.approx(expected, abs=0.04)
    # abs: p = 1, threshold m/d = 1
    assert _branch("abs", 1).scalars["masked_rank"] == pytest.approx(1.0)


@pytest.mark.parametrize("activation,expansion", [("relu", 1), ("relu", 4), ("abs", 2)])
def test_branch_erank_follows_the_gaussian_product(activation, expansion):
    s = _branch(activation, expansion).scalars
    assert s["erank_branch"] == pytest.approx(s["erank_branch_reference"], abs=0.02)


@pytest.mark.parametrize("activation", ["abs", "relu", "gelu", "silu"])
def test_table1_stable_rank_of_sigma_wh_near_spike_bound(activation):
    """stable_rank(σ(W h)) over many inputs ≈ 1/c within 6% (Table 1)."""
    model = ResidualMLP(256, 1, matrices=1, activation=activation, seeds=[0])
    s = run_probes(model, ["activation_spike"], options={"activation_spike": {"n": 4096}}).scalars
    bound = T.activation_constants(activation).spike_bound
    assert s["hidden_stable_rank"] == pytest.approx(bound, rel=0.06)
    assert s["hidden_stable_rank"] < bound  # the bound is approached from below
    assert s["hidden_coherence"] == pytest.approx(1 / bound, rel=0.06)


def test_table1_tanh_has_no_spike():
    model = ResidualMLP(256, 1, matrices=1, activation="tanh", seeds=[0])
    s = run_probes(model, ["activation_spike"], options={"activation_spike": {"n": 4096}}).scalars
    assert s["spike_coherence_theory"] == 0.0
    assert s["hidden_coherence"] < 1e-3
    assert s["hidden_stable_rank"] > 20  # bulk-limited, not 1/c


@pytest.mark.parametrize(
    "activation,expansion,matrices", [("swiglu", 2, 2), ("leaky_relu", 2, 2), ("leaky_relu", 1, 1)]
)
def test_every_probe_runs_for_the_extra_activations(activation, expansion, matrices):
    model = ResidualMLP(
        24,
        4,
        expansion=expansion,
        matrices=matrices,
        activation=activation,
        placement="post",
        seeds=[0, 1],
    )
    opts = {
        "representation": {"n": 32},
        "backward_representation": {"n": 32},
        "activation_spike": {"n": 64},
    }
    m = run_probes(
        model,
        [
            "io_jacobian",
            "path_order",
            "representation",
            "backward_representation",
            "branch_jacobian",
            "activation_spike",
            "projection_split",
        ],
        options=opts,
    )
    assert all(math.isfinite(v) for v in m.scalars.values())
    assert m.scalars["path_reconstruction_error"] < 1e-12


# --------------------------------------------------------------------------- Figure 4c / Table 3
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_projection_split_against_independent_networks(activation):
    seeds = [0, 1]
    d = 64
    kw = dict(expansion=2, alpha=1.5, activation=activation, seeds=seeds)
    post = ResidualMLP(d, 16, placement="post", **kw)
    h0 = gaussian_input(seeds, d)
    out = projection_split(post, h0)

    def erank(model):
        return forward_sweep(model, h0).erank[:, -1] / d

    # the full Post-Norm product is the forward sweep's input–output Jacobian
    torch.testing.assert_close(out["erank_post"], erank(post), rtol=1e-9, atol=0)
    # the detached op's Jacobian is post-norm's without the projection (same forward)
    det = ResidualMLP(d, 16, placement="post", norm_op="detached", **kw)
    torch.testing.assert_close(out["erank_post_noproj"], erank(det), rtol=1e-9, atol=0)
    # the references are the Pre-Norm and the no-norm networks with the same weights
    pre = ResidualMLP(d, 16, placement="pre", **kw)
    torch.testing.assert_close(out["erank_prenorm"], erank(pre), rtol=1e-9, atol=0)
    none = ResidualMLP(d, 16, placement="none", **kw)
    torch.testing.assert_close(out["erank_unnormalized"], erank(none), rtol=1e-9, atol=0)
    if activation == "relu":  # positively homogeneous: R's rescaling changes no direction
        torch.testing.assert_close(
            out["erank_unnormalized"], out["erank_post_noproj"], rtol=1e-9, atol=0
        )
    torch.testing.assert_close(
        out["rank_removed_total"],
        out["rank_removed_by_projection"] + out["rank_removed_by_rescaling"],
    )
    # Figure 4: the projection's share is about one direction (≤ 0.4% of width at d = 256 in
    # the study; at d = 64 a strongly collapsed gelu product moves by up to ~2); the
    # rescaling's share (vs the same op placed pre) is many directions
    proj, resc = out["rank_removed_by_projection"], out["rank_removed_by_rescaling"]
    assert (resc * d > 10).all()
    assert proj.mean().abs() < 0.1 * resc.mean()
    if activation == "relu":
        assert (proj.abs() * d).max() < 1.5


def test_projection_products_of_known_ops():
    h0 = gaussian_input([0], 16)
    det = projection_split(ResidualMLP(16, 6, placement="post", norm_op="detached", seeds=[0]), h0)
    assert float(det["erank_projection_product"]) == pytest.approx(1.0, abs=1e-12)  # J_R ∝ I
    assert float(det["rank_removed_by_projection"]) == pytest.approx(0.0, abs=1e-12)
    ms = projection_split(ResidualMLP(16, 6, placement="post", norm_op="meansub", seeds=[0]), h0)
    # (I − 11ᵀ/d)^L = I − 11ᵀ/d: exactly one direction removed
    assert float(ms["erank_projection_product"]) == pytest.approx(15 / 16, abs=1e-10)
    with pytest.raises(ValueError, match="placement='post'"):
        projection_split(ResidualMLP(16, 2, seeds=[0]), h0)
    assert run_probes(ResidualMLP(16, 2, seeds=[0]), ["projection_split"]).scalars == {}


def test_projection_split_probe_reports_random_walk_reference():
    model = ResidualMLP(64, 24, expansion=2, placement="post", seeds=[0, 1])
    s = run_probes(model, ["projection_split"]).scalars
    assert 0 < s["projection_step"] < 2
    assert 0.9 < s["erank_projection_product_rw"] <= 1.0
    assert s["erank_projection_product"] == pytest.approx(
        s["erank_projection_product_rw"], abs=0.03
    )
    assert np.isfinite(list(s.values())).all()
