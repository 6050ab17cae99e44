"""Path-order decomposition (Eq. 5/11/12) against autograd and closed forms."""

from __future__ import annotations

import math
import resource
import time

import numpy as np
import pytest
import torch
from torch.func import jacrev

from rankexp import theory as T
from rankexp.models.mlp import ResidualMLP
from rankexp.probes.jacobian import forward_sweep, layer_jacobians
from rankexp.probes.paths import path_orders
from rankexp.seeding import gaussian_input
from rankexp.tasks.measure import run_probes


def autograd_io_jacobian(model: ResidualMLP, h0: torch.Tensor) -> torch.Tensor:
    """``∂h_L/∂h_0`` per member by reverse mode on the whole forward (the independent oracle)."""
    out = []
    for e in range(model.members):

        def fe(x, e=e):
            xs = torch.cat([h0[:e], x[None, None], h0[e + 1 :]])
            return model(xs)[e, 0]

        out.append(jacrev(fe)(h0[e, 0]))
    return torch.stack(out)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((torch.linalg.matrix_norm(a - b) / torch.linalg.matrix_norm(b)).max())


CASES = [
    ("pre", "relu", 2),
    ("pre", "gelu", 1),
    ("pre", "swiglu", 2),
    ("pre", "leaky_relu", 2),
    ("post", "relu", 2),
    ("post", "tanh", 1),
    ("post", "swiglu", 2),
    ("output", "silu", 2),
    ("peri", "abs", 2),
    ("none", "relu", 1),
    ("none", "swiglu", 2),
]


@pytest.mark.parametrize("placement,activation,matrices", CASES)
def test_reconstruction_matches_autograd(placement, activation, matrices):
    seeds = [3, 4]
    model = ResidualMLP(
        8,
        7,
        expansion=2,
        matrices=matrices,
        activation=activation,
        placement=placement,
        alpha=1.3,
        beta=0.8,
        seeds=seeds,
    )
    h0 = gaussian_input(seeds, 8)
    po = path_orders(model, h0, chunk=3)
    unit, log = po.reconstruct()
    assert po.complete
    assert rel_err(unit * log.exp()[:, None, None], autograd_io_jacobian(model, h0)) <= 1e-12


@pytest.mark.parametrize("norm_op", ["layernorm", "detached", "meansub"])
def test_reconstruction_post_norm_ops(norm_op):
    model = ResidualMLP(8, 5, expansion=2, placement="post", norm_op=norm_op, alpha=1.5, seeds=[0])
    h0 = gaussian_input([0], 8)
    unit, log = path_orders(model, h0).reconstruct()
    assert rel_err(unit * log.exp()[:, None, None], autograd_io_jacobian(model, h0)) <= 1e-12


def test_first_and_last_orders_are_sum_and_product():
    """T_1 = Σ_m βJ_m and T_L = βJ_L ⋯ βJ_1 (identity skips, R = I)."""
    model = ResidualMLP(10, 6, expansion=2, alpha=1.2, beta=0.6, seeds=[1, 2])
    h0 = gaussian_input([1, 2], 10)
    js = [lj.branch for lj in layer_jacobians(model, h0)]
    po = path_orders(model, h0)
    terms = po.units * po.log_mu.exp()[..., None, None]
    assert rel_err(terms[:, 1], sum(js)) < 1e-13
    prod = js[0]
    for j in js[1:]:
        prod = j @ prod
    assert rel_err(terms[:, -1], prod) < 1e-13
    assert rel_err(terms[:, 0], torch.eye(10, dtype=torch.float64).expand(2, 10, 10)) < 1e-15


def test_orders_are_the_polynomial_coefficients_in_beta():
    """Linear branches, no norm: ∂h_L/∂h_0(β) = Σ β^k S_k exactly, with S_k independent of β."""
    seeds = [5]
    h0 = gaussian_input(seeds, 6)
    base = ResidualMLP(
        6, 5, matrices=2, expansion=2, activation="linear", placement="none", beta=1.0, seeds=seeds
    )
    po = path_orders(base, h0)
    s_k = po.units * po.log_s_norm().exp()[..., None, None]
    for beta in (0.37, 2.5):
        other = ResidualMLP(
            6,
            5,
            matrices=2,
            expansion=2,
            activation="linear",
            placement="none",
            beta=beta,
            seeds=seeds,
        )
        poly = sum(beta**k * s_k[:, k] for k in range(6))
        assert rel_err(poly, autograd_io_jacobian(other, h0)) < 1e-12


def test_chunking_and_truncation_do_not_change_kept_orders():
    model = ResidualMLP(8, 9, expansion=2, placement="post", seeds=[0, 1])
    h0 = gaussian_input([0, 1], 8)
    full = path_orders(model, h0, chunk=64)
    one = path_orders(model, h0, chunk=1)
    torch.testing.assert_close(one.log_mu, full.log_mu, rtol=0, atol=1e-12)
    cut = path_orders(model, h0, max_order=3)
    assert not cut.complete and cut.log_mu.shape == (2, 4)
    torch.testing.assert_close(cut.log_mu, full.log_mu[:, :4], rtol=0, atol=1e-12)
    torch.testing.assert_close(cut.units, full.units[:, :4], rtol=0, atol=1e-12)


def test_deep_and_large_gain_stays_finite():
    """L = 160 at α = 3: μ_k spans > 40 decades; log-norm storage keeps it exact."""
    model = ResidualMLP(6, 160, expansion=2, placement="pre", alpha=3.0, seeds=[0])
    h0 = gaussian_input([0], 6)
    po = path_orders(model, h0)
    assert torch.isfinite(po.log_mu).all()
    assert float(po.log_mu.max() - po.log_mu.min()) > 100  # > 43 decades apart
    sw = forward_sweep(model, h0)
    unit, log = po.reconstruct()
    assert float(log - sw.log_gain[:, -1]).__abs__() < 1e-10
    assert rel_err(unit, sw.io_unit) < 1e-10


def test_uncorrelated_paths_follow_the_binomial():
    """Linear M = 1 branches, no norm: E μ_k² ∝ C(L,k) ρ^k with ρ = α², so ⟨k⟩ = Lρ/(1+ρ)."""
    seeds = list(range(8))
    model = ResidualMLP(
        64, 12, matrices=1, activation="linear", placement="none", alpha=0.8, seeds=seeds
    )
    po = path_orders(model, gaussian_input(seeds, 64))
    energy = po.profile(power=2).mean(0).numpy()
    expected = T.path_order_distribution(12, 0.64)
    assert float(po.mean_order(power=2).mean()) == pytest.approx(12 * 0.64 / 1.64, rel=0.03)
    np.testing.assert_allclose(energy, expected, atol=0.02)


def test_probe_keys_and_consistency():
    model = ResidualMLP(16, 10, expansion=2, seeds=[0, 1])
    m = run_probes(model, ["io_jacobian", "path_order"], options={"path_order": {"chunk": 4}})
    assert m.scalars["path_reconstruction_error"] < 1e-12
    steps, prof = m.series["path_profile"]
    assert list(steps) == list(range(11)) and prof.sum() == pytest.approx(1.0)
    assert 0 < m.scalars["mean_path_order"] < 10
    assert m.scalars["mean_path_order_energy"] == pytest.approx(
        m.scalars["mean_path_order_uncorrelated"], rel=0.25
    )
    with pytest.raises(ValueError, match="unknown key"):
        run_probes(model, ["path_order"], options={"path_order": {"orders": 3}})


def test_spaced_skips_are_rejected():
    model = ResidualMLP(8, 8, skip_every=4, seeds=[0])
    with pytest.raises(ValueError, match="skip_every=4"):
        path_orders(model, gaussian_input([0], 8))


@pytest.mark.slow
def test_full_size_L384_d256():
    """Figure-3 scale: L = 384, d = 256, m/d = 4, one seed; exact reconstruction, time and memory."""
    model = ResidualMLP(256, 384, expansion=4, seeds=[0])
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    m = run_probes(model, ["path_order"])
    dt = time.perf_counter() - t
    rss = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    print(f"path_order L=384 d=256: {dt:.1f} s, peak RSS +{rss:.0f} MB")
    assert m.scalars["path_reconstruction_error"] < 1e-12
    assert math.isfinite(m.scalars["mean_path_order"])
