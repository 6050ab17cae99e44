"""Matrix-free spectra (``rankexp.instruments.matfree``): Hutchinson, Lanczos and stochastic
Lanczos quadrature against the exact singular values.

Truths checked: Gauss quadrature from k Lanczos steps is exact for polynomials of degree < 2k;
a scaled identity is recovered exactly (one step, zero error); on matrices of the study's kinds
(a ReLU branch Jacobian ``W₂ D W₁``, a residual block ``I + J_f``, a Gaussian matrix, a product)
every estimate lies within a few stated standard errors of the exact value, and over repeated
probe seeds the stated error is honest in both directions: about 95 % of the estimates lie
within two errors, and the typical |error|/stated error is near the Gaussian 0.67 (neither
over- nor under-stated).
"""

from __future__ import annotations

import math

import pytest
import torch

from rankexp.instruments.matfree import (
    MatrixFree,
    _quadrature,
    dense_spectrum,
    lanczos,
    rademacher,
    slq_spectrum,
)
from rankexp.spectra import erank, stable_rank

F64 = torch.float64


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matrices: one thread (two fight over the shared cores, ~10× slower under load)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def matrices(d: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(d, d, generator=g, dtype=F64) / math.sqrt(d)
    w2 = torch.randn(d, d, generator=g, dtype=F64) / math.sqrt(d)
    x = torch.randn(d, generator=g, dtype=F64)
    branch = w2 @ ((w1 @ x > 0).to(F64)[:, None] * w1)  # J_f = W₂ diag(relu′) W₁ (Eq. 9)
    eye = torch.eye(d, dtype=F64)
    return {"branch": branch, "block": eye + branch, "gaussian": w1,
            "product": (eye + branch) @ (eye + 2 * w2 @ w1)}


def estimate(j: torch.Tensor, seed: int, **kw):
    return slq_spectrum(lambda v: (v @ j.T) @ j, j.shape[1], settings=MatrixFree(seed=seed, **kw))


def zscores(est, exact) -> dict[str, float]:
    return {k: (getattr(est, k) - getattr(exact, k)) / getattr(est, f"{k}_err")
            for k in ("erank", "stable_rank", "frobenius_sq")}


def test_dense_spectrum_is_the_study_definitions():
    j = matrices(40)["product"]
    s = dense_spectrum(j)
    assert s.erank == pytest.approx(float(erank(j)), rel=1e-12)
    assert s.stable_rank == pytest.approx(float(stable_rank(j)), rel=1e-12)
    assert s.frobenius_sq == pytest.approx(float(j.square().sum()), rel=1e-12)
    assert s.ratio == pytest.approx(float(j.norm() / math.sqrt(40)), rel=1e-12)
    assert (s.erank_err, s.stable_rank_err, s.ratio_err) == (0.0, 0.0, 0.0)


def test_gauss_quadrature_is_exact_for_low_degree_polynomials():
    """k Lanczos steps integrate λ^q exactly for q < 2k: vᵀA^q v = ‖v‖² Σ τ_j² θ_j^q."""
    a = matrices(50)["gaussian"]
    a = a.T @ a
    v = rademacher(3, 50, seed=1, dtype=F64, device="cpu")
    lz = lanczos(lambda x: x @ a, v, 4)
    theta, w, _ = lz.nodes_weights()
    for q in range(8):
        direct = torch.einsum("pi,ij,pj->p", v, torch.linalg.matrix_power(a, q), v)
        assert torch.allclose(50 * (w * theta**q).sum(1), direct, rtol=1e-10), q
    # degree 2k is not integrated exactly (the check can fail)
    direct = torch.einsum("pi,ij,pj->p", v, torch.linalg.matrix_power(a, 8), v)
    assert not torch.allclose(50 * (w * theta**8).sum(1), direct, rtol=1e-6)


def test_scaled_identity_is_exact_with_zero_error():
    est = estimate(3.0 * torch.eye(64, dtype=F64), seed=0)
    assert est.erank == pytest.approx(64, rel=1e-12)
    assert est.stable_rank == pytest.approx(64, rel=1e-12)
    assert est.frobenius_sq == pytest.approx(9 * 64, rel=1e-12)
    assert est.erank_err < 1e-9 and est.frobenius_sq_err < 1e-9
    assert est.steps == MatrixFree().check  # an invariant subspace after one step; stops at the first check


@pytest.mark.parametrize("kind", ["branch", "block", "gaussian", "product"])
def test_estimates_within_their_stated_error(kind):
    j = matrices(160)[kind]
    exact, est = dense_spectrum(j), estimate(j, seed=3)
    assert est.method == "matrix_free" and est.vectors == MatrixFree().vectors
    z = zscores(est, exact)
    assert all(abs(v) < 4 for v in z.values()), z
    assert est.top_sq <= exact.top_sq * (1 + 1e-12)  # a Ritz value never exceeds λ_max
    assert abs(est.top_sq - exact.top_sq) <= 3 * est.top_sq_err + 1e-12 * exact.top_sq


@pytest.mark.parametrize("kind", ["branch", "product"])
def test_stated_error_is_honest_over_seeds(kind):
    """Over 40 probe seeds: |z| ≤ 2 for ≈ 95 % (t₁₅: 94 %), and the median |z| near 0.67."""
    j = matrices(96)[kind]
    exact = dense_spectrum(j)
    zs = {k: [] for k in ("erank", "stable_rank", "frobenius_sq")}
    for seed in range(40):
        for k, v in zscores(estimate(j, seed), exact).items():
            zs[k].append(abs(v))
    for k, v in zs.items():
        z = torch.tensor(v)
        covered, median = float((z <= 2).to(F64).mean()), float(z.median())
        assert covered >= 0.8, (k, covered)  # errors not understated
        assert 0.3 <= median <= 1.3, (k, median)  # nor overstated


def test_more_vectors_shrink_the_error():
    j = matrices(128)["branch"]
    few, many = estimate(j, 0, vectors=4), estimate(j, 0, vectors=32)
    assert many.erank_err < few.erank_err / 1.8  # ∝ 1/√vectors: ≈ 1/2.8


def test_quadrature_error_enters_when_lanczos_is_cut_short():
    """Two steps cannot resolve the spectrum: the stated error then includes the quadrature's
    change, and still covers the (large) bias."""
    j = matrices(128)["branch"]
    exact = dense_spectrum(j)
    short = estimate(j, 0, steps=4, check=2, tol=0.0)
    assert short.steps == 4
    assert abs(short.erank - exact.erank) <= 2 * short.erank_err
    long = estimate(j, 0)
    assert long.erank_err < short.erank_err


def test_settings_are_checked():
    with pytest.raises(ValueError, match="vectors"):
        MatrixFree(vectors=1)
    with pytest.raises(ValueError, match="steps"):
        MatrixFree(steps=1)
    lz = lanczos(lambda x: x, torch.ones(2, 5, dtype=F64), 3)
    q = _quadrature(lz, 5)
    assert q.top == pytest.approx(1.0)
