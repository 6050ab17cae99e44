"""The mean-field lab's theory additions against independent computations: closed forms, an
independent ODE integration, direct quadrature, and the chapter's printed claims."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf
from scipy.integrate import solve_ivp

from rankexp import theory

REPO = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- deep linear
def ode_learning_time(depth: int, a0: float, s: float) -> float:
    """T(N, a₀, s) by integrating u̇ = N u^{2−2/N}(s − u) (215.8) to the event u = s/2 —
    independent of the quadrature (other variable, other method)."""
    def rhs(_, u):
        return depth * u ** (2 - 2 / depth) * (s - u)

    def half(_, u):
        return u[0] - s / 2

    half.terminal, half.direction = True, 1
    u0 = a0**depth
    sol = solve_ivp(rhs, (0, 1e9), [u0], method="DOP853", events=half, rtol=1e-13, atol=1e-300)
    return float(sol.t_events[0][0])


@pytest.mark.parametrize(("depth", "a0", "s"), [(1, 0.3, 1.0), (2, 0.5, 1.0), (3, 0.7, 1.0),
                                                (4, 0.5, 1.0), (8, 0.5, 1.0), (12, 0.5, 1.0),
                                                (12, 0.9, 1.0), (8, 1.0, 4.0), (6, 0.7, 2.5)])
def test_deep_linear_quadrature_matches_an_independent_ode(depth, a0, s):
    quad = theory.deep_linear_time(depth, a0, s)
    assert quad == pytest.approx(ode_learning_time(depth, a0, s), rel=1e-6)


def test_deep_linear_closed_forms_for_one_and_two_layers():
    # N = 1: u̇ = s − u; N = 2: logistic u̇ = 2u(s − u)
    a0, s = 0.3, 1.5
    assert theory.deep_linear_time(1, a0, s) == pytest.approx(math.log((s - a0) / (s / 2)), rel=1e-12)
    u0 = a0**2
    logistic = math.log((s / 2) * (s - u0) / (u0 * (s - s / 2))) / (2 * s)
    assert theory.deep_linear_time(2, a0, s) == pytest.approx(logistic, rel=1e-12)
    assert theory.deep_linear_time(4, 0.9, 1.0) == 0.0  # u₀ = 0.656 already past s/2


@pytest.mark.parametrize("a0", [0.5, 0.7, 0.9])
def test_deep_linear_asymptote_ratio_tends_to_one(a0):
    ratio = {n: theory.deep_linear_time_asymptote(n, a0) / theory.deep_linear_time(n, a0)
             for n in (20, 40, 160)}
    assert abs(ratio[160] - 1) < 1e-3
    assert abs(ratio[160] - 1) < abs(ratio[20] - 1)
    with pytest.raises(ValueError, match="N > 2"):
        theory.deep_linear_time_asymptote(2, a0)


def test_simulated_chain_reaches_halfway_at_the_quadrature_time():
    from rankexp.probes.meanfield import simulate_deep_linear

    for depth, a0, s in ((4, 0.5, 1.0), (8, 1.0, 4.0)):
        assert simulate_deep_linear(depth, a0, s) == pytest.approx(
            theory.deep_linear_time(depth, a0, s), rel=1e-6)


# --------------------------------------------------------------------------- critical ReLU
def test_critical_relu_gap_approaches_nine_pi_squared_over_two_l_squared():
    c = theory.relu_correlation_iterates(0.0, 10_000)
    ratio = [(1 - c[l]) / theory.relu_correlation_gap(l) for l in (10, 100, 1000, 10_000)]
    assert all(b > a for a, b in zip(ratio, ratio[1:], strict=False))  # approaches from below
    assert abs(ratio[-1] - 1) < 0.01 and abs(ratio[0] - 1) > 0.5


# --------------------------------------------------------------------------- maps
def test_covariance_map_at_the_fixed_point_is_the_length_and_correlation_maps():
    sw2, sb2 = 1.7, 0.1
    q = theory.length_fixed_point("tanh", sw2, sb2)
    qa, qb, c = theory.covariance_map(q, q, 0.4, "tanh", sw2, sb2)
    assert qa == pytest.approx(q, rel=1e-12) and qb == pytest.approx(q, rel=1e-12)
    assert c == pytest.approx(theory.correlation_map(0.4, "tanh", sw2, sb2, q), abs=1e-12)


def test_residual_iterates_equal_the_closed_form_relu_trajectory():
    # quadrature of the general residual maps vs the arc-cosine closed form, gain g
    for gain in (1.0, 0.3):
        q, c = theory.covariance_iterates(1.0, 0.2, 12, "relu", 2.0, 0.0, gain=gain)
        assert np.allclose(c, theory.residual_relu_correlation(0.2, 12, gain), atol=1e-11)
        assert np.allclose(q, (1 + gain**2) ** np.arange(13), rtol=1e-11)


def test_residual_trajectory_converges_to_its_ode_limit():
    c1 = theory.residual_relu_correlation_ode(0.3, 1.0, 1.0)
    errs = [abs(theory.residual_relu_correlation(0.3, n, 1 / math.sqrt(n))[-1] - c1)
            for n in (16, 64, 256)]
    assert errs[2] < errs[1] < errs[0] and errs[2] < 2e-3
    assert errs[0] / errs[1] == pytest.approx(4, rel=0.3)  # first order in 1/L


def test_depth_scale_in_both_phases():
    ordered = theory.correlation_depth_scale("tanh", 1.5, 0.05)
    assert ordered.c_star == 1.0 and ordered.chi_c == ordered.chi_1 < 1
    assert ordered.xi_c == pytest.approx(-1 / math.log(ordered.chi_1))
    chaotic = theory.correlation_depth_scale("tanh", 3.0, 0.05)
    assert chaotic.chi_1 > 1 and 0 < chaotic.c_star < 1 and chaotic.chi_c < 1
    # c* is a fixed point and χ_c the map's slope there (finite difference)
    f = lambda c: theory.correlation_map(c, "tanh", 3.0, 0.05, chaotic.q_star)  # noqa: E731
    assert f(chaotic.c_star) == pytest.approx(chaotic.c_star, abs=1e-12)
    h = 1e-5
    assert (f(chaotic.c_star + h) - f(chaotic.c_star - h)) / (2 * h) == pytest.approx(chaotic.chi_c, rel=1e-6)


def test_tanh_critical_line():
    for sb2 in (0.01, 0.05, 0.2):
        sw2 = theory.tanh_critical_line(sb2)
        q = theory.length_fixed_point("tanh", sw2, sb2)
        assert theory.chi_1("tanh", sw2, q) == pytest.approx(1.0, abs=1e-9)
    # the phase diagram's familiar point: σ_b² = 0.05 → σ_w² ≈ 1.76 (Schoenholz et al.)
    assert theory.tanh_critical_line(0.05) == pytest.approx(1.76, abs=0.01)
    assert theory.tanh_critical_line(0.0) == 1.0


def test_vd_closed_forms_and_the_chapters_critical_formula():
    assert theory.activation_vd("relu") == pytest.approx(1.0, abs=1e-12)
    assert theory.activation_vd("linear") == 0.0
    sw2, sb2 = theory.tanh_critical_point(1 / 64)
    d4 = theory.gaussian_expectation(lambda z: (1 - np.tanh(z / 8) ** 2) ** 4)
    assert theory.activation_vd("tanh", 1 / 64) == pytest.approx(sw2**2 * d4 - 1, rel=1e-10)
    assert theory.activation_vd("tanh", 1e-6) < 1e-5  # → 0 as q* → 0
    assert theory.jacobian_spectrum_variance(32, "relu", "orthogonal") == pytest.approx(32)


def test_spectrum_experiment_sits_on_the_critical_line():
    tanh = OmegaConf.load(REPO / "conf" / "experiment" / "mf_spectrum.yaml").hydra.sweeper.grids.tanh
    sw2, sb2 = theory.tanh_critical_point(1 / 64)
    assert tanh.activation == "tanh"
    assert float(tanh.alpha) ** 2 == pytest.approx(sw2, rel=1e-13)
    assert float(tanh.bias) ** 2 == pytest.approx(sb2, rel=1e-11)
    trained = OmegaConf.load(REPO / "conf" / "experiment" / "mf_trainability.yaml")
    assert trained.bias**2 == pytest.approx(0.05, rel=1e-15)
