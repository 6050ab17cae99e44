"""Theory references (rankexp.theory) against closed forms and independent integrators."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate

from rankexp import theory as T
from rankexp.models.activations import ACTIVATIONS, LEAKY_SLOPE, activation_fn
from rankexp.models.mlp import ResidualMLP
from rankexp.probes.jacobian import forward_sweep
from rankexp.seeding import gaussian_input


def test_relu_abs_linear_closed_forms():
    relu = T.activation_constants("relu")
    assert relu.coherence == pytest.approx(1 / math.pi, abs=1e-13)
    assert relu.survival == pytest.approx(0.5, abs=1e-13)
    assert relu.kappa == pytest.approx(0.5, abs=1e-13)
    assert relu.survival_rate == pytest.approx(0.5, abs=1e-13)
    assert relu.spike_bound == pytest.approx(math.pi, rel=1e-12)
    ab = T.activation_constants("abs")
    assert ab.coherence == pytest.approx(2 / math.pi, abs=1e-13)
    assert ab.survival == pytest.approx(1.0, abs=1e-13)
    assert ab.kappa == pytest.approx(1.0, abs=1e-13)
    lin = T.activation_constants("linear")
    assert (lin.coherence, lin.survival, lin.kappa) == (0.0, pytest.approx(1.0), pytest.approx(1.0))
    a = LEAKY_SLOPE
    lk = T.activation_constants("leaky_relu")
    assert lk.coherence == pytest.approx((1 - a) ** 2 / (math.pi * (1 + a * a)), abs=1e-13)
    assert lk.survival == pytest.approx((1 + a * a) / 2, abs=1e-13)


def test_table1_smooth_activations():
    gelu, silu, tanh = (T.activation_constants(n) for n in ("gelu", "silu", "tanh"))
    assert gelu.coherence == pytest.approx(0.187, abs=5e-4)
    assert silu.coherence == pytest.approx(0.120, abs=5e-4)
    assert tanh.coherence == 0.0 and math.isinf(tanh.spike_bound)
    assert gelu.survival == pytest.approx(0.46, abs=5e-3)
    assert silu.survival == pytest.approx(0.38, abs=5e-3)


@pytest.mark.parametrize("name", ["gelu", "silu", "tanh", "relu"])
def test_quadrature_matches_adaptive_integration(name):
    """Gauss–Hermite / split Gauss–Legendre against scipy's adaptive quad (independent)."""
    sig, dsig = T.sigma_numpy(name)
    phi = lambda z: math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)  # noqa: E731

    def quad(g):
        return sum(
            integrate.quad(lambda z: g(np.array(z)) * phi(z), a, b, epsabs=1e-14, epsrel=1e-13)[0]
            for a, b in ((-40, 0), (0, 40))
        )

    k = T.activation_constants(name, q=1.7)
    s = math.sqrt(1.7)
    assert k.mean == pytest.approx(quad(lambda z: sig(s * z)), abs=1e-11)
    assert k.kappa == pytest.approx(quad(lambda z: sig(s * z) ** 2), abs=1e-11)
    assert k.survival == pytest.approx(quad(lambda z: dsig(s * z) ** 2), abs=1e-11)


@pytest.mark.parametrize("name", ["gelu", "silu"])
def test_hermite_and_split_rules_agree_on_smooth_activations(name):
    sig, dsig = T.sigma_numpy(name)
    for g in (sig, lambda z: sig(z) ** 2, lambda z: dsig(z) ** 2):
        assert T.gaussian_expectation(g, rule="hermite") == pytest.approx(
            T.gaussian_expectation(g), abs=1e-13
        )


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_numpy_activations_match_the_model(name):
    """The quadrature's σ, σ′ equal the model's σ and its autograd derivative."""
    x = torch.linspace(-4, 4, 801, dtype=torch.float64)[1:]  # avoid the kink at exactly 0
    x = x[x.abs() > 1e-9].requires_grad_(True)
    y = activation_fn(name)(x)
    (dy,) = torch.autograd.grad(y.sum(), x)
    sig, dsig = T.sigma_numpy(name)
    xn = x.detach().numpy()
    np.testing.assert_allclose(sig(xn), y.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(dsig(xn), dy.numpy(), atol=1e-12)


def test_swiglu_constants_are_the_documented_approximation():
    k, silu = T.activation_constants("swiglu"), T.activation_constants("silu")
    assert k.coherence == 0.0
    assert k.survival == pytest.approx(silu.survival + silu.kappa, rel=1e-12)


def test_unknown_activation_and_bad_q():
    with pytest.raises(ValueError, match="activation='softsign'"):
        T.activation_constants("softsign")
    with pytest.raises(ValueError, match="q=0"):
        T.activation_constants("relu", q=0)


# --------------------------------------------------------------------------- MP
@pytest.mark.parametrize("gamma", [0.5, 1.0, 2.0, 4.0])
def test_marchenko_pastur_normalization(gamma):
    a, b = T.marchenko_pastur_edges(gamma)
    mass = integrate.quad(lambda x: T.marchenko_pastur_density(x, gamma), a, b, limit=200)[0]
    mean = integrate.quad(lambda x: x * T.marchenko_pastur_density(x, gamma), a, b, limit=200)[0]
    assert mass == pytest.approx(1 - T.marchenko_pastur_atom(gamma), abs=1e-7)
    assert mean == pytest.approx(1.0, abs=1e-7)  # tr(G)/d normalization
    assert T.marchenko_pastur_cdf(b + 1e-9, gamma) == pytest.approx(1.0, abs=1e-9)
    mid = 0.5 * (a + b)
    cdf_mid = (
        T.marchenko_pastur_atom(gamma)
        + integrate.quad(lambda x: T.marchenko_pastur_density(x, gamma), a, mid)[0]
    )
    assert T.marchenko_pastur_cdf(mid, gamma) == pytest.approx(cdf_mid, abs=1e-7)


def test_marchenko_pastur_ks_on_a_wishart_sample_and_a_wrong_gamma():
    rng = np.random.default_rng(1)
    d, n = 400, 200  # γ = n/d = 0.5
    x = rng.standard_normal((n, d))
    ev = np.linalg.eigvalsh(x.T @ x)
    ev = ev / ev.mean()
    assert T.marchenko_pastur_ks(ev, 0.5) < 0.03
    assert T.marchenko_pastur_ks(ev, 1.0) > 0.3  # the test can fail


def test_gaussian_product_reference_limits():
    assert T.gaussian_product_erank(64, 0) == 0.0
    narrow = T.gaussian_product_erank(64, 16, draws=2)
    assert narrow < 16 / 64 + 1e-12  # rank ≤ inner
    # k ≫ d: G₂G₁ is a sum of k rank-one terms → (CLT) a square Gaussian matrix
    wide = T.gaussian_product_erank(64, 8192, draws=4)
    rng = np.random.default_rng(7)
    sv = [np.linalg.svd(rng.standard_normal((64, 64)), compute_uv=False) for _ in range(16)]
    square = np.mean([np.exp(-((s / s.sum()) * np.log(s / s.sum())).sum()) / 64 for s in sv])
    assert wide == pytest.approx(square, abs=0.015)


# --------------------------------------------------------------------------- Eq. 22 / Figure 11
def test_prenorm_stream_and_ratio_match_a_network():
    """rms(h_l)² = 1 + κ(βα^M)² l and r_l = √p · r̃_l (Eq. 22) on a real Pre-Norm ReLU net.

    The tolerances are 4 s.d. of a mean over the seeds: at d = 128 one seed's rms(h_l) and r_l
    scatter by up to 6.7 % and 7.7 % (s.d. over 960 seeds, the worst layer; the theory's own bias
    ≤ 0.3 %), so 96 seeds put rtol 0.05 at 7 s.d. and 0.1 at 12, and the layer-averaged ratio's
    s.d. (0.005) under 0.02/4.  (6 seeds, v1's, left ≈ 30 % of draws outside these bounds.)"""
    seeds = list(range(96))
    model = ResidualMLP(128, 32, expansion=2, alpha=1.0, beta=1.0, seeds=seeds)
    h0 = gaussian_input(seeds, 128)
    h0 = h0 * (128**0.5 / h0.norm(dim=-1, keepdim=True))  # rms(h_0) = 1 exactly, as Eq. 22 assumes
    sw = forward_sweep(model, h0)
    k = T.activation_constants("relu")
    layers = np.arange(0, 33)
    rms = sw.rms.mean(0).numpy()
    np.testing.assert_allclose(
        rms, T.prenorm_stream_rms(layers, model.nominal_ratio, k.kappa), rtol=0.05
    )
    r = sw.branch_ratio.mean(0).numpy()
    pred = math.sqrt(k.survival) * T.prenorm_branch_ratio(layers[1:], model.nominal_ratio, k.kappa)
    np.testing.assert_allclose(r, pred, rtol=0.1)  # per layer: finite-d noise
    assert (r / pred).mean() == pytest.approx(1.0, abs=0.02)
    assert (
        np.abs(r / T.prenorm_branch_ratio(layers[1:], model.nominal_ratio, k.kappa) - 1).mean()
        > 0.2
    )


# --------------------------------------------------------------------------- mean field
def test_relu_correlation_map_closed_form_and_fixed_point():
    cs = np.linspace(-0.99, 1.0, 9)
    generic = T.correlation_map(cs, "relu", 2.0, 0.0, 1.0)
    np.testing.assert_allclose(generic, T.relu_correlation_map(cs), atol=1e-12)
    assert T.relu_correlation_map(1.0) == pytest.approx(1.0, abs=1e-15)
    assert T.chi_1("relu", 2.0, 1.0) == pytest.approx(1.0, abs=1e-13)  # critical
    assert math.isinf(T.depth_scale(1.0))


def test_relu_correlation_gap_law():
    """1 − c_l ≈ 9π²/(2l²): the ratio approaches 1 from below (log corrections)."""
    c = T.relu_correlation_iterates(0.0, 10_000)
    ratio = (1 - c[[100, 1000, 10_000]]) / T.relu_correlation_gap(np.array([100, 1000, 10_000]))
    assert np.all(np.diff(ratio) > 0)
    assert ratio[-1] == pytest.approx(1.0, abs=0.01)
    assert abs(ratio[0] - 1) > 0.1  # not true at small depth: the law is asymptotic


def test_length_map_and_depth_scale():
    # tanh at σ_w² = 1.5, σ_b² = 0.05: q* solves the length map; ordered phase χ₁ < 1
    q = T.length_fixed_point("tanh", 1.5, 0.05)
    assert T.length_map(q, "tanh", 1.5, 0.05) == pytest.approx(q, rel=1e-12)
    chi = T.chi_1("tanh", 1.5, q)
    # χ₁ is the slope of the correlation map at c = 1
    slope = (
        T.correlation_map(1.0, "tanh", 1.5, 0.05, q)
        - T.correlation_map(1 - 1e-5, "tanh", 1.5, 0.05, q)
    ) / 1e-5
    assert slope == pytest.approx(chi, rel=1e-3)
    assert T.depth_scale(0.5) == pytest.approx(1 / math.log(2))
    with pytest.raises(ValueError, match="diverges"):
        T.length_fixed_point("relu", 2.5)


def test_path_distributions():
    pmf = T.path_order_distribution(12, 0.64)
    assert pmf.sum() == pytest.approx(1.0)
    assert (pmf * np.arange(13)).sum() == pytest.approx(12 * 0.64 / 1.64)
    np.testing.assert_allclose(T.uncorrelated_path_profile(np.full(12, 0.64)), pmf, atol=1e-14)
    assert T.residual_variance(1.0, 10) == pytest.approx(2.0**10)


def test_random_walk_projection_product():
    sv = T.random_walk_projection_product(32, 1, 0.5)
    np.testing.assert_allclose(sv, [1.0] * 31 + [0.0], atol=1e-12)  # one projection: one direction
    frozen = T.random_walk_projection_product(32, 20, 0.0)
    np.testing.assert_allclose(frozen, [1.0] * 31 + [0.0], atol=1e-12)  # the same projection 20×
    moving = T.random_walk_projection_product(32, 20, 1.0)
    assert np.sum(moving < 1e-9) == 1  # generic product of rank-(d−1) projections: rank d−1
    assert np.sum(moving**2) < 31 - 1  # but it contracts further directions
