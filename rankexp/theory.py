"""Closed forms and quadrature references the probes are compared against.

Everything here is deterministic NumPy on scalars or small arrays: Gaussian
activation constants (Table 1), the Pre-Norm ratio and stream growth (Eq. 21/22),
the Marchenko–Pastur law of the masked up-projection
(Figure 9/17), the Gaussian-product reference for ``erank(J_f)`` (Figure 8), the
uncorrelated path-order profile (Eq. 5/11), and the mean-field companions
(length map, χ₁, depth scale, ReLU correlation map, residual variance,
effective path distribution) from the textbook chapter "Why Deeper Is Not
Always Better".

Gaussian expectations ``E_{z~N(0,1)}[g(z)]`` are computed by Gaussian
quadrature.  The default rule is Gauss–Legendre on each half-line ``[−T, 0]``
and ``[0, T]`` with ``T = 12`` (tail mass ``< 1e−32``) times the normal
density: it converges to machine precision for every activation here, including
those with a kink or jump at 0 (relu, abs, leaky_relu and their step-function
derivatives), where probabilists' Gauss–Hermite
(:func:`numpy.polynomial.hermite_e.hermegauss`, ``rule="hermite"``) converges
only like ``1/n``, and tanh, whose poles at ``±iπ/2`` limit Gauss–Hermite to
~1e−10 at 160 nodes.  Gauss–Hermite remains available and agrees to ~1e−13 for
gelu and silu (tested).
"""

from __future__ import annotations

import functools
import importlib.util
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import numpy as np
from numpy.polynomial.hermite_e import hermegauss
from numpy.polynomial.legendre import leggauss

from .models.activations import ACTIVATIONS, LEAKY_SLOPE


def _lazy_module(name: str) -> ModuleType:
    """``name`` imported on first attribute access (:class:`importlib.util.LazyLoader`)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# every job imports this module (probes → theory); scipy.stats alone costs ~0.5 s (seconds on a
# loaded machine), so scipy's special functions and distributions load when first used
special = _lazy_module("scipy.special")
stats = _lazy_module("scipy.stats")

# --------------------------------------------------------------------------- quadrature
_HERMITE_NODES = 160
_LEGENDRE_NODES = 160
_TRUNCATION = 12.0


def _hermite_rule(n: int = _HERMITE_NODES) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights with ``Σ w g(x) ≈ E_{z~N(0,1)} g(z)`` (weights sum to 1)."""
    x, w = hermegauss(n)
    return x, w / math.sqrt(2 * math.pi)


@functools.cache
def _legendre(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss–Legendre nodes and weights on [−1, 1], computed once per n (read-only arrays;
    numpy's ``leggauss`` solves an n×n eigenproblem, ~20 ms at n = 160)."""
    y, v = leggauss(n)
    y.flags.writeable = v.flags.writeable = False
    return y, v


@functools.cache
def _split_rule(n: int = _LEGENDRE_NODES, t: float = _TRUNCATION) -> tuple[np.ndarray, np.ndarray]:
    """Gauss–Legendre on ``[−t, 0] ∪ [0, t]`` times the standard normal density."""
    y, v = _legendre(n)
    half = 0.5 * t * (y + 1.0)  # nodes on (0, t)
    x = np.concatenate([-half[::-1], half])
    w = np.concatenate([v[::-1], v]) * 0.5 * t * np.exp(-0.5 * x**2) / math.sqrt(2 * math.pi)
    x.flags.writeable = w.flags.writeable = False  # cached: shared by every caller
    return x, w


def gaussian_expectation(g: Callable[[np.ndarray], np.ndarray], *, rule: str = "split") -> float:
    """``E_{z~N(0,1)}[g(z)]`` by Gaussian quadrature.

    Args:
        g: vectorized function of a NumPy array.
        rule: ``split`` (Gauss–Legendre on ``[−12, 0] ∪ [0, 12]``; default, exact to
            ~1e−15 for piecewise-analytic g with pieces meeting at 0) or ``hermite``
            (160-node Gauss–Hermite; only for smooth g).

    Raises:
        ValueError: unknown ``rule``.
    """
    if rule not in ("split", "hermite"):
        raise ValueError(f"rule={rule!r} is not one of split, hermite")
    x, w = _split_rule() if rule == "split" else _hermite_rule()
    return float(np.dot(w, g(x)))


# --------------------------------------------------------------------------- activations
def _silu(x):
    return x * special.expit(x)


def _silu_prime(x):
    s = special.expit(x)
    return s * (1.0 + x * (1.0 - s))


def _gelu(x):
    return x * special.ndtr(x)


def _gelu_prime(x):
    return special.ndtr(x) + x * np.exp(-0.5 * x**2) / math.sqrt(2 * math.pi)


#: name → (σ, σ′) as NumPy functions (σ′ at the kink: right derivative, a null set).
_SIGMA: dict[str, tuple[Callable, Callable]] = {
    "relu": (lambda x: np.maximum(x, 0.0), lambda x: (x > 0).astype(float)),
    "abs": (np.abs, np.sign),
    "leaky_relu": (
        lambda x: np.where(x > 0, x, LEAKY_SLOPE * x),
        lambda x: np.where(x > 0, 1.0, LEAKY_SLOPE),
    ),
    "gelu": (_gelu, _gelu_prime),
    "silu": (_silu, _silu_prime),
    "tanh": (np.tanh, lambda x: 1.0 - np.tanh(x) ** 2),
    "linear": (lambda x: x, np.ones_like),
    "swiglu": (_silu, _silu_prime),  # the gate; see activation_constants for the gated unit
}


def sigma_numpy(
    name: str,
) -> tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]:
    """NumPy ``(σ, σ′)`` for activation ``name`` (the scalar gate for ``swiglu``).

    Raises:
        ValueError: ``name`` is not in :data:`rankexp.models.activations.ACTIVATIONS`.
    """
    if name not in _SIGMA:
        raise ValueError(f"activation={name!r} is not one of {', '.join(ACTIVATIONS)}")
    return _SIGMA[name]


@dataclass(frozen=True)
class ActivationConstants:
    """Gaussian constants of one activation at preactivation variance ``q`` (Table 1).

    Attributes:
        name: activation.
        q: preactivation variance, ``z ~ N(0, q)``.
        mean: ``E[σ(z)]``.
        kappa: κ = ``E[σ(z)²]`` (stream growth, Eq. 22; ½ for ReLU at q = 1).
        coherence: c = ``E[σ]² / E[σ²]`` — the energy fraction of the mean (all-ones)
            direction in ``σ(W h)``; 0 when κ = 0.
        spike_bound: ``1/c``, the stable rank ``σ(W h)`` approaches when its mean
            spike dominates (∞ for c = 0).
        survival: p = ``E[σ′(z)²]`` — mean squared diagonal of the mask D (Eq. 9/25);
            the effective surviving fraction in γ = p·m/d.
        survival_rate: ``P(σ′(z) ≠ 0)`` — the fraction of nonzero mask entries.
    """

    name: str
    q: float
    mean: float
    kappa: float
    coherence: float
    spike_bound: float
    survival: float
    survival_rate: float


def activation_constants(name: str, q: float = 1.0) -> ActivationConstants:
    """Table 1 constants of σ = ``name`` for ``z ~ N(0, q)`` by quadrature.

    Closed forms at q = 1 (tests): relu c = 1/π, p = κ = ½, rate ½; abs c = 2/π,
    p = rate = 1, κ = 1; leaky_relu (slope a) c = (1−a)²/(π(1+a²)), p = κ = (1+a²)/2;
    linear c = 0, p = κ = 1; tanh c = 0 by symmetry.

    ``swiglu`` (gated unit ``h = silu(g)·u`` with independent ``g, u ~ N(0, q)``) is
    a documented approximation: mean 0 and c = 0 exactly (u is symmetric),
    κ = ``E[silu(g)²]·q``, and p is the expected squared norm per hidden unit of
    the gated Jacobian row ``silu′(g) u w_g + silu(g) w_u`` relative to ``‖w‖²``,
    ``p = q·E[silu′(g)²] + E[silu(g)²]``.  The gated hidden Jacobian is a
    row-scaled Gaussian, not a 0/1 mask times ``W_up``, so Marchenko–Pastur at
    γ = p·m/d is only approximate for it (as it is for gelu and silu).

    Raises:
        ValueError: unknown activation, or ``q ≤ 0``.
    """
    if not q > 0:
        raise ValueError(f"q={q} must be > 0 (a preactivation variance)")
    sig, dsig = sigma_numpy(name)
    s = math.sqrt(q)
    if name == "swiglu":
        e_s2 = gaussian_expectation(lambda z: sig(s * z) ** 2)
        e_d2 = gaussian_expectation(lambda z: dsig(s * z) ** 2)
        mean, kappa, p, rate = 0.0, e_s2 * q, q * e_d2 + e_s2, 1.0
    else:
        mean = gaussian_expectation(lambda z: sig(s * z))
        kappa = gaussian_expectation(lambda z: sig(s * z) ** 2)
        p = gaussian_expectation(lambda z: dsig(s * z) ** 2)
        rate = gaussian_expectation(lambda z: (dsig(s * z) != 0).astype(float))
    c = mean**2 / kappa if kappa > 0 else 0.0
    if c < 1e-14:  # symmetric σ: the quadrature's rounding is not a spike
        c = 0.0
    return ActivationConstants(
        name=name,
        q=float(q),
        mean=mean,
        kappa=kappa,
        coherence=c,
        spike_bound=math.inf if c == 0 else 1.0 / c,
        survival=p,
        survival_rate=rate,
    )


# --------------------------------------------------------------------------- Eq. 21/22
def prenorm_branch_ratio(layer, nominal_ratio: float, kappa: float):
    """Pre-Norm branch-to-skip ratio (Eq. 22): ``r̃_l = βα^M / sqrt(1 + κ(βα^M)²(l−1))``.

    This is the nominal ratio ``βα^M √d/‖h_{l−1}‖`` (Eq. 21) with the Pre-Norm stream
    of :func:`prenorm_stream_rms` and ``rms(h_0) = 1``.  The measured Frobenius ratio
    ``‖βJ_l‖_F/‖I‖_F`` (Eq. 4) carries one more factor ``√p``, p = E[σ′(z)²]
    (:func:`activation_constants`), because ``‖D W‖_F² = p ‖W‖_F²`` for the mask
    ``D = diag(σ′)``: measured ``r_l ≈ √p · r̃_l`` (tested for ReLU, M = 2).

    Args:
        layer: l ≥ 1 (scalar or array).
        nominal_ratio: βα^M (Eq. 21 at ‖h‖ = √d); post-norm holds ``r_l`` at this value.
        kappa: κ = E[σ(z)²] (:func:`activation_constants`).

    Returns:
        ``r̃_l``, same shape as ``layer``, dimensionless.
    """
    l = np.asarray(layer, dtype=float)
    return nominal_ratio / np.sqrt(1.0 + kappa * nominal_ratio**2 * (l - 1.0))


def prenorm_stream_rms(layer, nominal_ratio: float, kappa: float):
    """Pre-Norm stream scale ``rms(h_l) = sqrt(1 + κ(βα^M)² l)`` for ``rms(h_0) = 1`` (Figure 11).

    Each Pre-Norm branch sees a unit-rms input and adds ``κ(βα^M)²`` of mean-square
    energy, uncorrelated with the stream; at L = 384, βα^M = 1, κ = 0.51 this is ≈ 14.
    """
    l = np.asarray(layer, dtype=float)
    return np.sqrt(1.0 + kappa * nominal_ratio**2 * l)


# --------------------------------------------------------------------------- Marchenko–Pastur
def marchenko_pastur_edges(gamma: float) -> tuple[float, float]:
    """Bulk edges ``((1−1/√γ)², (1+1/√γ)²)`` of the normalized Gram spectrum (Figure 9).

    Normalization (used throughout): ``G = (D W_up)ᵀ (D W_up)`` (``d×d``) divided
    by its mean eigenvalue ``tr(G)/d``.  For a 0/1 mask with ``n = γ d`` surviving
    Gaussian rows this is the sample covariance of ``n`` standard samples in
    dimension ``d`` (aspect ratio λ = d/n = 1/γ), whose limit law is MP with
    these edges, mean 1, and an atom of mass ``1 − γ`` at 0 when γ < 1.

    Raises:
        ValueError: γ ≤ 0.
    """
    if not gamma > 0:
        raise ValueError(f"gamma={gamma} must be > 0 (γ = p·m/d)")
    r = 1.0 / math.sqrt(gamma)
    return (1.0 - r) ** 2, (1.0 + r) ** 2


def marchenko_pastur_atom(gamma: float) -> float:
    """Mass of the zero eigenvalue, ``max(0, 1 − γ)`` (γ < 1: fewer surviving rows than d)."""
    return max(0.0, 1.0 - gamma)


def marchenko_pastur_density(x, gamma: float):
    """Continuous part of the MP density at ``x`` for aspect ratio λ = 1/γ, mean 1.

    ``ρ(x) = sqrt((b−x)(x−a)) / (2π λ x)`` on ``[a, b]`` (:func:`marchenko_pastur_edges`),
    0 elsewhere; it integrates to ``1 − atom`` (:func:`marchenko_pastur_atom`).
    """
    a, b = marchenko_pastur_edges(gamma)
    x = np.asarray(x, dtype=float)
    inside = (x > a) & (x < b) & (x > 0)
    xs = np.where(inside, x, 1.0)
    return np.where(
        inside, np.sqrt(np.clip((b - xs) * (xs - a), 0, None)) * gamma / (2 * np.pi * xs), 0.0
    )


def marchenko_pastur_cdf(x, gamma: float, grid: int = 20001):
    """MP cumulative distribution (atom included) at ``x``, accurate to ~1e−8.

    The bulk is integrated on ``x(θ) = (a+b)/2 − (b−a)/2 cos θ``, which removes the
    square-root edges, by the cumulative trapezoid rule.
    """
    a, b = marchenko_pastur_edges(gamma)
    theta = np.linspace(0.0, np.pi, grid)
    xt = 0.5 * (a + b) - 0.5 * (b - a) * np.cos(theta)
    half = 0.5 * (b - a)
    # density · dx/dθ = half² sin²θ γ / (2π x); at γ = 1 (a = 0) its limit at θ = 0 is half γ/π
    integrand = np.where(
        xt > 0,
        (half * np.sin(theta)) ** 2 * gamma / (2 * np.pi * np.maximum(xt, 1e-300)),
        half * gamma / np.pi,
    )
    cum = np.concatenate(
        [[0.0], np.cumsum(0.5 * (integrand[1:] + integrand[:-1]) * np.diff(theta))]
    )
    cum *= (1.0 - marchenko_pastur_atom(gamma)) / cum[-1]  # exact total mass
    x = np.asarray(x, dtype=float)
    return np.where(
        x < 0, 0.0, marchenko_pastur_atom(gamma) + np.interp(x, xt, cum, left=0.0, right=cum[-1])
    )


def marchenko_pastur_ks(eigenvalues, gamma: float, zero_tol: float = 1e-9) -> float:
    """Kolmogorov–Smirnov distance between normalized eigenvalues and MP(γ).

    Args:
        eigenvalues: eigenvalues of ``G / (tr G / d)`` (any shape; pooled), ≥ 0.
        gamma: γ = p·m/d.
        zero_tol: eigenvalues below ``zero_tol · max`` count as the atom at 0.

    Returns:
        ``sup_x |F_emp(x) − F_MP(x)|`` ∈ [0, 1], including the jump at 0.
    """
    ev = np.sort(np.asarray(eigenvalues, dtype=float).ravel())
    n = ev.size
    ev = np.where(ev < zero_tol * ev[-1], 0.0, ev)
    zeros = int((ev == 0).sum())
    d0 = abs(zeros / n - marchenko_pastur_atom(gamma))
    pos = ev[zeros:]
    if pos.size == 0:
        return d0
    f = marchenko_pastur_cdf(pos, gamma)
    j = np.arange(zeros + 1, n + 1)
    return float(max(d0, np.max(j / n - f), np.max(f - (j - 1) / n)))


# --------------------------------------------------------------------------- J_f reference
def gaussian_product_erank(width: int, inner: int, *, draws: int = 4, seed: int = 0) -> float:
    """Reference for ``erank(J_f)/d`` (Figure 8): erank/d of a Gaussian product ``G₂ G₁``.

    ``G₁ ∈ R^{k×d}``, ``G₂ ∈ R^{d×k}`` i.i.d. standard normal, ``k = inner``.  For a
    0/1 mask with k = p·m survivors this *is* ``J_f = W_down D W_up`` in law (up to
    the rank-one dependence of the mask on ``W_up x``); for smooth σ it is the
    reference at the same γ = k/d.  Monte Carlo mean over ``draws`` seeded draws
    (deterministic for a given ``seed``; standard error ≈ 1e−3 at d = 256).

    Returns:
        erank/d ∈ (0, 1]; 0 when ``inner == 0``.
    """
    if inner <= 0:
        return 0.0
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(draws):
        prod = rng.standard_normal((width, inner)) @ rng.standard_normal((inner, width))
        s = np.linalg.svd(prod, compute_uv=False)
        p = s / s.sum()
        p = p[p > 0]
        out.append(math.exp(-(p * np.log(p)).sum()) / width)
    return float(np.mean(out))


# --------------------------------------------------------------------------- path orders
def uncorrelated_path_profile(rho) -> np.ndarray:
    """Energy profile over path order k if paths are uncorrelated (Eq. 5/11).

    With squared branch-to-skip ratios ``ρ_l = r_l²`` (Eq. 4) and independent
    isotropic branch Jacobians, ``E‖β^k S_k‖_F² ∝ e_k(ρ_1…ρ_L)`` (elementary
    symmetric polynomial), so ``μ_k² / Σ_j μ_j²`` is Poisson-binomial with success
    probabilities ``ρ_l/(1+ρ_l)``; for constant ρ it is Binomial(L, ρ/(1+ρ)), the
    effective path distribution of the mean-field chapter.

    Args:
        rho: ``(L,)`` non-negative.

    Returns:
        ``(L+1,)`` probabilities over k = 0…L (sum 1).
    """
    rho = np.asarray(rho, dtype=float)
    pk = np.zeros(rho.size + 1)
    pk[0] = 1.0
    for t, r in enumerate(rho, start=1):
        s = r / (1.0 + r)
        pk[1 : t + 1] = pk[1 : t + 1] * (1 - s) + pk[:t] * s
        pk[0] *= 1 - s
    return pk


def path_order_distribution(n: int, rho: float) -> np.ndarray:
    """Effective path distribution Binomial(n, ρ/(1+ρ)) over k = 0…n (mean-field chapter)."""
    return stats.binom.pmf(np.arange(n + 1), n, rho / (1.0 + rho))


# --------------------------------------------------------------------------- mean field
def length_map(q, activation: str, sigma_w2: float, sigma_b2: float = 0.0):
    """Mean-field length map ``q ↦ σ_w² E[φ(√q z)²] + σ_b²`` (scalar or array ``q > 0``)."""
    sig, _ = sigma_numpy(activation)
    qs = np.atleast_1d(np.asarray(q, dtype=float))
    out = np.array(
        [sigma_w2 * gaussian_expectation(lambda z, v=v: sig(math.sqrt(v) * z) ** 2) for v in qs]
    )
    out = out + sigma_b2
    return out if np.ndim(q) else float(out[0])


def length_fixed_point(
    activation: str,
    sigma_w2: float,
    sigma_b2: float = 0.0,
    *,
    q0: float = 1.0,
    iters: int = 10_000,
    tol: float = 1e-13,
) -> float:
    """Fixed point ``q*`` of :func:`length_map` by iteration from ``q0``.

    Raises:
        ValueError: the iteration grows past 1e12 (no finite fixed point, e.g.
            relu with σ_w² > 2) or does not settle within ``iters`` steps.
    """
    q = q0
    for _ in range(iters):
        nq = length_map(q, activation, sigma_w2, sigma_b2)
        if nq > 1e12 or not math.isfinite(nq):
            raise ValueError(
                f"length map of {activation} at σ_w²={sigma_w2}, σ_b²={sigma_b2} diverges"
            )
        if abs(nq - q) <= tol * max(1.0, abs(q)):
            return float(nq)
        q = nq
    raise ValueError(
        f"length map of {activation} at σ_w²={sigma_w2} did not converge in {iters} steps"
    )


def chi_1(activation: str, sigma_w2: float, q_star: float) -> float:
    """χ₁ = ``σ_w² E[φ′(√q* z)²]``: slope of the correlation map at c = 1 (order/chaos: χ₁ ≶ 1)."""
    _, dsig = sigma_numpy(activation)
    s = math.sqrt(q_star)
    return sigma_w2 * gaussian_expectation(lambda z: dsig(s * z) ** 2)


def _polar_rule(
    c: float, n_angle: int = 48, n_radius: int = 96
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Nodes ``(z₁, z₂)`` and weights for ``E[g(z₁, z₂)]``, z standard 2-D normal.

    Polar coordinates with the angle split where ``z₁ = 0`` or
    ``c z₁ + √(1−c²) z₂ = 0`` (the kinks of a kinked φ along rays), Gauss–Legendre
    on every angular piece and on the radius ``[0, 12]`` with density ``r e^{−r²/2}``.
    Each piece is smooth along rays for piecewise-linear φ and for smooth φ, so
    the rule is accurate to ~1e−13 for every activation here.
    """
    s = math.sqrt(max(0.0, 1.0 - c * c))
    phi = math.atan2(s, c)
    cuts = np.sort(
        np.mod([0.5 * np.pi, 1.5 * np.pi, phi + 0.5 * np.pi, phi - 0.5 * np.pi], 2 * np.pi)
    )
    edges = np.concatenate([cuts, [cuts[0] + 2 * np.pi]])
    y, v = _legendre(n_angle)
    th, wt = [], []
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        if hi - lo < 1e-15:
            continue
        th.append(lo + 0.5 * (hi - lo) * (y + 1))
        wt.append(0.5 * (hi - lo) * v / (2 * np.pi))
    th, wt = np.concatenate(th), np.concatenate(wt)
    yr, vr = _legendre(n_radius)
    r = 0.5 * _TRUNCATION * (yr + 1)
    wr = 0.5 * _TRUNCATION * vr * r * np.exp(-0.5 * r * r)
    rr, tt = np.meshgrid(r, th, indexing="ij")
    return rr * np.cos(tt), rr * np.sin(tt), np.outer(wr, wt)


def correlation_map(c, activation: str, sigma_w2: float, sigma_b2: float, q_star: float):
    """Mean-field correlation map ``c ↦ (σ_w² E[φ(u₁)φ(u₂)] + σ_b²)/q*``.

    ``u₁ = √q* z₁``, ``u₂ = √q* (c z₁ + √(1−c²) z₂)``, integrated with the polar
    rule split at the kinks (:func:`_polar_rule`), accurate to ≲1e−12 for every
    activation; at σ_w² = 2, σ_b = 0, q* = 1, relu this equals
    :func:`relu_correlation_map`.
    """
    sig, _ = sigma_numpy(activation)
    s = math.sqrt(q_star)
    cs = np.atleast_1d(np.asarray(c, dtype=float))
    out = []
    for v in cs:
        z1, z2, ww = _polar_rule(float(v))
        u2 = v * z1 + math.sqrt(max(0.0, 1 - v * v)) * z2
        out.append((sigma_w2 * np.sum(ww * sig(s * z1) * sig(s * u2)) + sigma_b2) / q_star)
    out = np.array(out)
    return out if np.ndim(c) else float(out[0])


def depth_scale(chi: float) -> float:
    """Correlation depth scale ``ξ_c = −1/log χ_c`` (layers); ∞ for χ_c ≥ 1 (no exponential approach).

    Raises:
        ValueError: χ_c ≤ 0.
    """
    if not chi > 0:
        raise ValueError(f"chi={chi} must be > 0")
    return math.inf if chi >= 1 else -1.0 / math.log(chi)


def relu_correlation_map(c):
    """Critical ReLU correlation map (σ_w² = 2, σ_b = 0): ``f(c) = (√(1−c²) + (π − arccos c) c)/π``."""
    c = np.clip(np.asarray(c, dtype=float), -1.0, 1.0)
    return (np.sqrt(1.0 - c * c) + (np.pi - np.arccos(c)) * c) / np.pi


def relu_correlation_iterates(c0: float, layers: int) -> np.ndarray:
    """``c_0, c_1 = f(c_0), …, c_layers`` under :func:`relu_correlation_map`, ``(layers+1,)``."""
    out = np.empty(layers + 1)
    out[0] = c0
    for l in range(layers):
        out[l + 1] = relu_correlation_map(out[l])
    return out


def relu_correlation_gap(layer):
    """Asymptote of the critical ReLU map: ``1 − c_l ≈ 9π²/(2 l²)`` for large l."""
    l = np.asarray(layer, dtype=float)
    return 9 * np.pi**2 / (2 * l**2)


def residual_variance(alpha: float, depth: int, q0: float = 1.0) -> float:
    """Un-normalized residual stream variance ``q0 (1+α²)^L`` (each block adds α² of the current q)."""
    return q0 * (1.0 + alpha**2) ** depth


# --------------------------------------------------------------------------- Table 3
def random_walk_projection_product(
    width: int, depth: int, step: float, *, seed: int = 0
) -> np.ndarray:
    """Singular values of the random-walk projection product (our reading of Table 3).

    ``Q_L = Π_{l=1}^{L} (I − u_l u_lᵀ)`` with unit normals following a random
    walk ``u_l = (u_{l−1} + step·g_l/√d) / ‖·‖``, ``g_l ~ N(0, I_d)``,
    ``u_0`` uniform on the sphere.  This is the projection part of the Post-Norm
    Jacobian ``J_R = (√d/‖s‖)(I − ŝŝᵀ)`` (Table 2) when the stream direction
    ``ŝ_l`` moves by a relative step ``step`` per block (``step = βα^M`` at
    nominal ratio).  The rank it can remove is bounded by the dimension of
    ``span(u_1…u_L)``; compare its erank with the measured projection product
    along the real trajectory (probe ``projection_split``).

    Returns:
        ``(d,)`` singular values, descending.
    """
    rng = np.random.default_rng(seed)
    u = rng.standard_normal(width)
    u /= np.linalg.norm(u)
    q = np.eye(width)
    for _ in range(depth):
        u = u + step * rng.standard_normal(width) / math.sqrt(width)
        u /= np.linalg.norm(u)
        q = q - np.outer(u, u @ q)
    return np.linalg.svd(q, compute_uv=False)


# --------------------------------------------------------------------------- mean-field lab
# The textbook chapter's signal-propagation theory beyond the maps above (science.md §5):
# two-input covariance maps off the fixed point, the stable correlation fixed point and its
# slope χ_c, the tanh critical line, v_D of the Jacobian spectrum (215.7), the residual ReLU
# correlation trajectory and its depth limit, and the deep-linear learning time (215.8/215.9).
def covariance_map(q_a: float, q_b: float, c: float, activation: str, sigma_w2: float,
                   sigma_b2: float = 0.0) -> tuple[float, float, float]:
    """One layer of the two-input mean-field maps (215.1/215.2) off the fixed point.

    With ``u_a = √q_a z₁``, ``u_b = √q_b (c z₁ + √(1−c²) z₂)``:
    ``q_a' = σ_w² E[φ(u_a)²] + σ_b²`` (same for b) and
    ``q_ab' = σ_w² E[φ(u_a)φ(u_b)] + σ_b²``; returns ``(q_a', q_b', c' = q_ab'/√(q_a' q_b'))``.
    At ``q_a = q_b = q*`` this is :func:`length_map` and :func:`correlation_map`.

    Raises:
        ValueError: ``q_a`` or ``q_b`` ≤ 0, or ``|c| > 1``.
    """
    if not (q_a > 0 and q_b > 0) or abs(c) > 1:
        raise ValueError(f"q_a={q_a}, q_b={q_b} must be > 0 and |c|={abs(c)} ≤ 1")
    sig, _ = sigma_numpy(activation)
    z1, z2, ww = _polar_rule(float(c))
    u_a = math.sqrt(q_a) * z1
    u_b = math.sqrt(q_b) * (c * z1 + math.sqrt(max(0.0, 1 - c * c)) * z2)
    qa = sigma_w2 * gaussian_expectation(lambda z: sig(math.sqrt(q_a) * z) ** 2) + sigma_b2
    qb = sigma_w2 * gaussian_expectation(lambda z: sig(math.sqrt(q_b) * z) ** 2) + sigma_b2
    qab = sigma_w2 * float(np.sum(ww * sig(u_a) * sig(u_b))) + sigma_b2
    return qa, qb, float(np.clip(qab / math.sqrt(qa * qb), -1.0, 1.0))


def covariance_iterates(q0: float, c0: float, layers: int, activation: str, sigma_w2: float,
                        sigma_b2: float = 0.0, *, gain: float | None = None
                        ) -> tuple[np.ndarray, np.ndarray]:
    """``(q_l, c_l)`` for l = 0…layers from two inputs of length q0 and correlation c0.

    Plain (``gain=None``): :func:`covariance_map` iterated.  Residual with branch gain g
    (``h_l = h_{l−1} + g (W φ(h_{l−1}) + b)``, W independent of the stream): every second
    moment adds, ``q_l = q_{l−1} + g² (σ_w² E[φ²] + σ_b²)`` and
    ``q_ab,l = q_ab,l−1 + g² (σ_w² E[φ_a φ_b] + σ_b²)``.  Both inputs have length q0 (as the
    probe ``correlation`` draws them), so they keep equal lengths.

    Returns:
        two ``(layers+1,)`` arrays.
    """
    q, c = np.empty(layers + 1), np.empty(layers + 1)
    q[0], c[0] = q0, c0
    for l in range(layers):
        qn, _, cn = covariance_map(q[l], q[l], c[l], activation, sigma_w2, sigma_b2)
        if gain is None:
            q[l + 1], c[l + 1] = qn, cn
        else:
            g2 = gain * gain
            q[l + 1] = q[l] + g2 * qn
            c[l + 1] = (c[l] * q[l] + g2 * cn * qn) / q[l + 1]
    return q, c


def correlation_fixed_point(activation: str, sigma_w2: float, sigma_b2: float = 0.0, *,
                            iters: int = 20_000, tol: float = 1e-13) -> float:
    """The stable fixed point c* of :func:`correlation_map` at q* (215.2).

    Ordered phase (χ₁ ≤ 1, to 1e-9 so that quadrature rounding at a critical point such as
    relu at σ_w² = 2 counts as critical): c* = 1.  Chaotic phase (χ₁ > 1): c = 1 is unstable
    and c* < 1 is the root of ``f(c) − c`` on ``[0, 1 − 10⁻⁶]`` (``f(0) = σ_b²/q* ≥ 0``,
    ``f(1 − δ) < 1 − δ``; Brent's method), or — where the bracket fails, a hair from the
    critical line — the limit of the iteration from c = 0.

    Raises:
        ValueError: no finite q* (:func:`length_fixed_point`), or no convergence.
    """
    from scipy.optimize import brentq

    q = length_fixed_point(activation, sigma_w2, sigma_b2)
    if chi_1(activation, sigma_w2, q) <= 1.0 + 1e-9:
        return 1.0

    def gap(c: float) -> float:
        return correlation_map(c, activation, sigma_w2, sigma_b2, q) - c

    hi = 1.0 - 1e-6
    if gap(0.0) >= 0 > gap(hi):
        return float(brentq(gap, 0.0, hi, xtol=tol, rtol=4 * np.finfo(float).eps))
    c = 0.0
    for _ in range(iters):
        nc = c + gap(c)
        if abs(nc - c) <= tol:
            return float(nc)
        c = nc
    raise ValueError(f"correlation map of {activation} at σ_w²={sigma_w2}, σ_b²={sigma_b2} "
                     f"did not settle in {iters} steps")


@dataclass(frozen=True)
class DepthScale:
    """The correlation depth scale of one operating point (215.4).

    Attributes:
        q_star: length fixed point q*.
        chi_1: χ₁ = σ_w² E[φ′(√q* z)²] (215.3); order χ₁ < 1, chaos χ₁ > 1.
        c_star: stable correlation fixed point (1 in the ordered phase).
        chi_c: slope of the correlation map at c*, ``σ_w² E[φ′(u₁)φ′(u₂)]`` (χ₁ when c* = 1).
        xi_c: ξ_c = −1/log χ_c in layers (∞ at criticality).
    """

    q_star: float
    chi_1: float
    c_star: float
    chi_c: float
    xi_c: float


def correlation_depth_scale(activation: str, sigma_w2: float, sigma_b2: float = 0.0) -> DepthScale:
    """q*, χ₁, c*, χ_c and ξ_c (215.1–215.4) of ``activation`` at ``(σ_w², σ_b²)``.

    ``|c_l − c*| ∝ exp(−l/ξ_c)`` at large l; Schoenholz et al. (2017): networks train when
    L ≲ 6 ξ_c.

    Raises:
        ValueError: no finite q* (e.g. relu with σ_w² > 2).
    """
    q = length_fixed_point(activation, sigma_w2, sigma_b2)
    chi = chi_1(activation, sigma_w2, q)
    c = correlation_fixed_point(activation, sigma_w2, sigma_b2)
    if c >= 1.0:
        chic = chi
    else:
        _, dsig = sigma_numpy(activation)
        z1, z2, ww = _polar_rule(c)
        s = math.sqrt(q)
        u2 = c * z1 + math.sqrt(max(0.0, 1 - c * c)) * z2
        chic = sigma_w2 * float(np.sum(ww * dsig(s * z1) * dsig(s * u2)))
    return DepthScale(q, chi, c, chic, depth_scale(chic) if chic > 0 else 0.0)


def tanh_critical_point(q_star: float) -> tuple[float, float]:
    """The point ``(σ_w², σ_b²)`` of the tanh critical line χ₁ = 1 whose fixed point is q*.

    χ₁ = σ_w² E[sech⁴(√q* z)] = 1 gives ``σ_w² = 1/E[φ′(√q* z)²]``, and the length map's
    fixed point gives ``σ_b² = q* − σ_w² E[tanh²(√q* z)]`` (215.1/215.3).  q* → 0 is the
    point (1, 0); the textbook's critical tanh spectrum (215.7) sits at q* = 1/64.

    Raises:
        ValueError: q* ≤ 0.
    """
    if not q_star > 0:
        raise ValueError(f"q_star={q_star} must be > 0")
    s = math.sqrt(q_star)
    sw2 = 1.0 / gaussian_expectation(lambda z: (1.0 - np.tanh(s * z) ** 2) ** 2)
    sb2 = q_star - sw2 * gaussian_expectation(lambda z: np.tanh(s * z) ** 2)
    return sw2, max(sb2, 0.0)


def tanh_critical_line(sigma_b2) -> np.ndarray | float:
    """σ_w² on the tanh critical line χ₁ = 1 at bias variance σ_b² (scalar or array, ≥ 0).

    Solves ``σ_b²(q*) = σ_b²`` of :func:`tanh_critical_point` for q* (σ_b² grows
    monotonically with q*) and returns its σ_w²; 1 at σ_b² = 0.  Left of the line (smaller
    σ_w²) is the ordered phase, right of it the chaotic phase.

    Raises:
        ValueError: σ_b² < 0.
    """
    from scipy.optimize import brentq

    sb = np.atleast_1d(np.asarray(sigma_b2, dtype=float))
    if (sb < 0).any():
        raise ValueError(f"sigma_b2 must be ≥ 0, got {sb.min()}")
    out = []
    for target in sb:
        if target == 0:
            out.append(1.0)
            continue
        hi = 1.0
        while tanh_critical_point(hi)[1] < target:
            hi *= 2.0
        q = brentq(lambda v, t=target: tanh_critical_point(v)[1] - t, 1e-12, hi, xtol=1e-14,
                   rtol=1e-13)
        out.append(tanh_critical_point(q)[0])
    out = np.array(out)
    return out if np.ndim(sigma_b2) else float(out[0])


def activation_vd(activation: str, q: float = 1.0) -> float:
    """v_D of the Jacobian spectrum (215.7): the variance of ``φ′(√q z)²`` normalized to mean 1.

    ``v_D = E[φ′(√q z)⁴] / E[φ′(√q z)²]² − 1`` — 0 for linear, 1 for relu (a ½-Bernoulli
    mask), and for tanh at a critical point (χ₁ = 1) equal to the chapter's
    ``σ_w⁴ E[φ′(√q* z)⁴] − 1`` (→ 0 as q* → 0).

    Raises:
        ValueError: q ≤ 0, or φ′ vanishes almost surely.
    """
    if not q > 0:
        raise ValueError(f"q={q} must be > 0 (a preactivation variance)")
    _, dsig = sigma_numpy(activation)
    s = math.sqrt(q)
    m2 = gaussian_expectation(lambda z: dsig(s * z) ** 2)
    m4 = gaussian_expectation(lambda z: dsig(s * z) ** 4)
    if not m2 > 0:
        raise ValueError(f"{activation}: E[φ′²] = 0 at q={q}")
    return max(m4 / m2**2 - 1.0, 0.0)  # ≥ 0 by Jensen; rounding can dip below


def jacobian_spectrum_variance(depth: int, activation: str, init: str, q: float = 1.0) -> float:
    """Var(λ) = L (v_W + v_D) of the squared singular values of ∂h_L/∂h_0, each of the L
    factors ``W D`` normalized to mean 1 (215.7, free multiplicative convolution: the
    variances of mean-1 free factors add).  v_W = 1 for Gaussian, 0 for orthogonal weights;
    v_D from :func:`activation_vd` at the preactivation variance q (= q* at the fixed point).

    Raises:
        ValueError: unknown ``init``.
    """
    v_w = {"gaussian": 1.0, "orthogonal": 0.0}.get(init)
    if v_w is None:
        raise ValueError(f"init={init!r} is not one of gaussian, orthogonal")
    return depth * (v_w + activation_vd(activation, q))


def residual_relu_correlation(c0: float, depth: int, gain: float) -> np.ndarray:
    """Correlation trajectory of a residual ReLU network with branch gain g (the chapter).

    ``h_l = h_{l−1} + g W relu(h_{l−1})`` with W ~ N(0, 2/n), σ_b = 0: lengths grow by
    ``1 + g²`` per layer (:func:`residual_variance`) and
    ``c_l = (c_{l−1} + g² f(c_{l−1})) / (1 + g²)``, f = :func:`relu_correlation_map`.

    Returns:
        ``(depth+1,)`` array c_0 … c_L.
    """
    out = np.empty(depth + 1)
    out[0] = c0
    g2 = gain * gain
    for l in range(depth):
        out[l + 1] = (out[l] + g2 * relu_correlation_map(out[l])) / (1.0 + g2)
    return out


def residual_relu_correlation_ode(c0: float, t, tau: float) -> np.ndarray:
    """Continuous-depth limit of :func:`residual_relu_correlation`: ``dc/dt = τ (f(c) − c)``.

    With g² = τ/L and t = l/L the discrete map's step is ``(τ/L)(f(c) − c) + O(L⁻²)``, so
    ``c_{tL} → c(t)`` as L → ∞ at fixed τ = g² L (g = 1/√L: τ = 1); the lengths follow
    ``q(t) = q_0 e^{τ t}`` (the limit of (1 + τ/L)^{tL}, e for τ = t = 1).  Integrated with
    scipy's DOP853 at rtol 1e-11.

    Args:
        c0: c(0) ∈ [−1, 1].
        t: times ≥ 0 (scalar or array, any order).
        tau: τ = g² L ≥ 0.
    """
    from scipy.integrate import solve_ivp

    ts = np.atleast_1d(np.asarray(t, dtype=float))
    order = np.argsort(ts)
    sol = solve_ivp(lambda _, c: tau * (relu_correlation_map(c) - c), (0.0, max(ts.max(), 0.0)),
                    [c0], method="DOP853", t_eval=ts[order], rtol=1e-11, atol=1e-13)
    out = np.empty_like(ts)
    out[order] = sol.y[0]
    return out if np.ndim(t) else float(out[0])


def deep_linear_time(depth: int, a0: float, s: float = 1.0) -> float:
    """Learning time of the deep-linear plateau (215.8) by quadrature.

    N scalar layers from the balanced start ``a_i(0) = a₀`` under gradient flow on
    ``½(s − Π a_i)²`` keep ``a_i = a`` and ``u = a^N`` obeys ``u̇ = N u^{2−2/N}(s − u)``; the
    time to reach s/2 is ``T = ∫_{u₀}^{s/2} du / (N u^{2−2/N}(s − u))``, u₀ = a₀^N.  Integrated
    in the layer variable a (u = a^N), where it is smooth:
    ``T = ∫_{a₀}^{(s/2)^{1/N}} da / (a^{N−1} (s − a^N))`` (adaptive Gauss–Kronrod,
    rtol 1e-13).  Returns 0 when u₀ ≥ s/2 (already past halfway).

    Args:
        depth: N ≥ 1 layers.
        a0: initial scale of every layer, > 0 (1 = the identity start).
        s: target singular value, > 0.

    Raises:
        ValueError: N < 1, a₀ ≤ 0 or s ≤ 0.
    """
    from scipy.integrate import quad

    if depth < 1 or not a0 > 0 or not s > 0:
        raise ValueError(f"need depth ≥ 1, a0 > 0, s > 0 (got {depth}, {a0}, {s})")
    a_half = (s / 2.0) ** (1.0 / depth)
    if a0 >= a_half:
        return 0.0
    n = depth
    val, _ = quad(lambda a: 1.0 / (a ** (n - 1) * (s - a**n)), a0, a_half,
                  epsabs=0.0, epsrel=1e-13, limit=200)
    return float(val)


def deep_linear_time_asymptote(depth: int, a0: float, s: float = 1.0) -> float:
    """Small-start asymptote of :func:`deep_linear_time` (215.9): ``a₀^{−(N−2)} / (s (N−2))``.

    The plateau near u₀ dominates the integral: its ratio to the quadrature → 1 as N grows
    at fixed a₀ < 1 (and as a₀ → 0 at fixed N > 2).

    Raises:
        ValueError: N ≤ 2 (no plateau: T stays finite as a₀ → 0 only for N > 2).
    """
    if depth <= 2:
        raise ValueError(f"the asymptote 215.9 needs N > 2, got N={depth}")
    return a0 ** (-(depth - 2)) / (s * (depth - 2))


#: per-layer growth toward the input of a batch-normalized ReLU net's weight-gradient norms at
#: initialization, √(π/(π−1)) ≈ 1.211 (Yang et al. 2019, "A Mean Field Theory of Batch
#: Normalization"; the chapter's BN paradox, science.md §5)
BN_RELU_GRADIENT_GROWTH = math.sqrt(math.pi / (math.pi - 1))
