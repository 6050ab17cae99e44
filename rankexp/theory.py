"""Closed forms and quadrature references the probes are compared against (deterministic NumPy).

``E_{z~N(0,1)}[g(z)]`` uses Gauss–Legendre on ``[−12, 0] ∪ [0, 12]`` times the normal density
(exact for kinked σ); Gauss–Hermite (``rule="hermite"``) is for smooth g.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.polynomial.hermite_e import hermegauss
from numpy.polynomial.legendre import leggauss

from .models.spec import ACTIVATIONS, LEAKY_SLOPE


def _special():  # scipy is slow to import; every job imports this module
    from scipy import special

    return special


_HERMITE_NODES = 160
_LEGENDRE_NODES = 160
_TRUNCATION = 12.0


@functools.cache
def _legendre(n: int) -> tuple[np.ndarray, np.ndarray]:
    y, v = leggauss(n)
    y.flags.writeable = v.flags.writeable = False
    return y, v


@functools.cache
def _split_rule(n: int = _LEGENDRE_NODES, t: float = _TRUNCATION) -> tuple[np.ndarray, np.ndarray]:
    y, v = _legendre(n)
    half = 0.5 * t * (y + 1.0)  # nodes on (0, t)
    x = np.concatenate([-half[::-1], half])
    w = np.concatenate([v[::-1], v]) * 0.5 * t * np.exp(-0.5 * x**2) / math.sqrt(2 * math.pi)
    x.flags.writeable = w.flags.writeable = False
    return x, w


def gaussian_expectation(g: Callable[[np.ndarray], np.ndarray], *, rule: str = "split") -> float:
    """``E_{z~N(0,1)}[g(z)]``; ``rule`` is ``split`` (default) or ``hermite`` (smooth g only).
    Raises ValueError: unknown ``rule``."""
    if rule not in ("split", "hermite"):
        raise ValueError(f"rule={rule!r} is not one of split, hermite")
    if rule == "split":
        x, w = _split_rule()
    else:
        x, w = hermegauss(_HERMITE_NODES)
        w = w / math.sqrt(2 * math.pi)
    return float(np.dot(w, g(x)))


def _elementwise(fn: Callable[[float], float], x):
    """``fn`` at each value of ``x``: a float for a scalar, else a 1-D array."""
    out = np.array([fn(v) for v in np.atleast_1d(np.asarray(x, dtype=float))])
    return out if np.ndim(x) else float(out[0])


def _moment(f: Callable, q: float, power: int = 1) -> float:
    s = math.sqrt(q)
    return gaussian_expectation(lambda z: f(s * z) ** power)


_SILU = (lambda x: x * _special().expit(x),
         lambda x: _special().expit(x) * (1.0 + x * (1.0 - _special().expit(x))))

#: name → (σ, σ′) as NumPy functions (σ′ at the kink: right derivative, a null set).
_SIGMA: dict[str, tuple[Callable, Callable]] = {
    "relu": (lambda x: np.maximum(x, 0.0), lambda x: (x > 0).astype(float)),
    "abs": (np.abs, np.sign),
    "leaky_relu": (lambda x: np.where(x > 0, x, LEAKY_SLOPE * x),
                   lambda x: np.where(x > 0, 1.0, LEAKY_SLOPE)),
    "gelu": (lambda x: x * _special().ndtr(x),
             lambda x: _special().ndtr(x) + x * np.exp(-0.5 * x**2) / math.sqrt(2 * math.pi)),
    "silu": _SILU,
    "tanh": (np.tanh, lambda x: 1.0 - np.tanh(x) ** 2),
    "linear": (lambda x: x, np.ones_like),
    "swiglu": _SILU,  # the gate
}


def sigma_numpy(name: str
) -> tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]:
    """NumPy ``(σ, σ′)`` for activation ``name`` (the scalar gate for ``swiglu``).
    Raises ValueError: unknown ``name``."""
    if name not in _SIGMA:
        raise ValueError(f"activation={name!r} is not one of {', '.join(ACTIVATIONS)}")
    return _SIGMA[name]


@dataclass(frozen=True)
class ActivationConstants:
    """Gaussian constants at ``z ~ N(0, q)`` (Table 1): ``mean`` E[σ], ``kappa`` κ = E[σ²] (Eq. 22),
    ``coherence`` c = E[σ]²/κ, ``spike_bound`` 1/c, ``survival`` p = E[σ′²] (Eq. 9/25),
    ``survival_rate`` P(σ′ ≠ 0)."""

    name: str
    q: float
    mean: float
    kappa: float
    coherence: float
    spike_bound: float
    survival: float
    survival_rate: float


def activation_constants(name: str, q: float = 1.0) -> ActivationConstants:
    """Table 1 constants of σ = ``name`` at ``z ~ N(0, q)`` by quadrature (``swiglu``: approximate,
    independent gate and value). Raises ValueError: unknown activation, or ``q ≤ 0``."""
    if not q > 0:
        raise ValueError(f"q={q} must be > 0 (a preactivation variance)")
    sig, dsig = sigma_numpy(name)
    kappa, p = _moment(sig, q, 2), _moment(dsig, q, 2)
    if name == "swiglu":
        mean, kappa, p, rate = 0.0, kappa * q, q * p + kappa, 1.0
    else:
        mean, rate = _moment(sig, q), _moment(lambda x: (dsig(x) != 0).astype(float), q)
    c = mean**2 / kappa if kappa > 0 else 0.0
    if c < 1e-14:  # symmetric σ: the quadrature's rounding is not a spike
        c = 0.0
    return ActivationConstants(name=name, q=float(q), mean=mean, kappa=kappa, coherence=c,
                               spike_bound=math.inf if c == 0 else 1.0 / c, survival=p,
                               survival_rate=rate)


def prenorm_branch_ratio(layer, nominal_ratio: float, kappa: float):
    """Pre-Norm branch-to-skip ratio (Eq. 22) ``βα^M / sqrt(1 + κ(βα^M)²(l−1))`` at ``layer`` l ≥ 1
    (scalar or array, shape kept); the measured ratio (Eq. 4) is ``√p`` times it."""
    l = np.asarray(layer, dtype=float)
    return nominal_ratio / np.sqrt(1.0 + kappa * nominal_ratio**2 * (l - 1.0))


def prenorm_stream_rms(layer, nominal_ratio: float, kappa: float):
    """Pre-Norm stream scale ``rms(h_l) = sqrt(1 + κ(βα^M)² l)`` for ``rms(h_0) = 1`` (Figure 11)."""
    l = np.asarray(layer, dtype=float)
    return np.sqrt(1.0 + kappa * nominal_ratio**2 * l)


def marchenko_pastur_edges(gamma: float) -> tuple[float, float]:
    """Bulk edges ``((1−1/√γ)², (1+1/√γ)²)`` of ``G = (D W_up)ᵀ(D W_up)`` over ``tr(G)/d`` (Figure 9).
    Raises ValueError: γ ≤ 0."""
    if not gamma > 0:
        raise ValueError(f"gamma={gamma} must be > 0 (γ = p·m/d)")
    r = 1.0 / math.sqrt(gamma)
    return (1.0 - r) ** 2, (1.0 + r) ** 2


def marchenko_pastur_atom(gamma: float) -> float:
    """Mass of the zero eigenvalue, ``max(0, 1 − γ)`` (γ < 1: fewer surviving rows than d)."""
    return max(0.0, 1.0 - gamma)


def marchenko_pastur_density(x, gamma: float):
    """Continuous MP density (aspect ratio 1/γ, mean 1) at ``x``; integrates to ``1 − atom``."""
    a, b = marchenko_pastur_edges(gamma)
    x = np.asarray(x, dtype=float)
    inside = (x > a) & (x < b) & (x > 0)
    xs = np.where(inside, x, 1.0)
    return np.where(
        inside, np.sqrt(np.clip((b - xs) * (xs - a), 0, None)) * gamma / (2 * np.pi * xs), 0.0)


def marchenko_pastur_cdf(x, gamma: float, grid: int = 20001):
    """MP cumulative distribution (atom included) at ``x``, accurate to ~1e−8."""
    a, b = marchenko_pastur_edges(gamma)
    theta = np.linspace(0.0, np.pi, grid)
    xt = 0.5 * (a + b) - 0.5 * (b - a) * np.cos(theta)
    half = 0.5 * (b - a)
    integrand = np.where(xt > 0,
                         (half * np.sin(theta)) ** 2 * gamma / (2 * np.pi * np.maximum(xt, 1e-300)),
                         half * gamma / np.pi)
    cum = np.concatenate(
        [[0.0], np.cumsum(0.5 * (integrand[1:] + integrand[:-1]) * np.diff(theta))])
    cum *= (1.0 - marchenko_pastur_atom(gamma)) / cum[-1]  # exact total mass
    x = np.asarray(x, dtype=float)
    return np.where(
        x < 0, 0.0, marchenko_pastur_atom(gamma) + np.interp(x, xt, cum, left=0.0, right=cum[-1]))


def marchenko_pastur_ks(eigenvalues, gamma: float, zero_tol: float = 1e-9) -> float:
    """KS distance ∈ [0, 1] between normalized eigenvalues and MP(γ); those below
    ``zero_tol · max`` count as the atom at 0."""
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


def gaussian_product_erank(width: int, inner: int, *, draws: int = 4, seed: int = 0) -> float:
    """Reference for ``erank(J_f)/d`` (Figure 8): mean erank/d of ``G₂ G₁``, ``G₁ ∈ R^{inner×d}``,
    over ``draws`` seeded draws; 0 when ``inner == 0``."""
    if inner <= 0:
        return 0.0
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(draws):
        prod = rng.standard_normal((width, inner)) @ rng.standard_normal((inner, width))
        s = np.linalg.svd(prod, compute_uv=False)
        out.append(math.exp(_special().entr(s / s.sum()).sum()) / width)
    return float(np.mean(out))


def uncorrelated_path_profile(rho) -> np.ndarray:
    """Energy profile ``(L+1,)`` over path order if paths are uncorrelated (Eq. 5/11):
    Poisson-binomial with success ``ρ_l/(1+ρ_l)`` for ``rho`` ``(L,)`` = ``r_l²``."""
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
    from scipy.stats import binom

    return binom.pmf(np.arange(n + 1), n, rho / (1.0 + rho))


def length_map(q, activation: str, sigma_w2: float, sigma_b2: float = 0.0):
    """Mean-field length map ``q ↦ σ_w² E[φ(√q z)²] + σ_b²`` (scalar or array ``q > 0``)."""
    sig, _ = sigma_numpy(activation)
    return _elementwise(lambda v: sigma_w2 * _moment(sig, v, 2) + sigma_b2, q)


def length_fixed_point(activation: str, sigma_w2: float, sigma_b2: float = 0.0, *, q0: float = 1.0,
                       iters: int = 10_000, tol: float = 1e-13) -> float:
    """Fixed point ``q*`` of :func:`length_map` by iteration from ``q0``.
    Raises ValueError: the iteration diverges or does not settle within ``iters`` steps."""
    q = q0
    for _ in range(iters):
        nq = length_map(q, activation, sigma_w2, sigma_b2)
        if nq > 1e12 or not math.isfinite(nq):
            raise ValueError(
                f"length map of {activation} at σ_w²={sigma_w2}, σ_b²={sigma_b2} diverges")
        if abs(nq - q) <= tol * max(1.0, abs(q)):
            return float(nq)
        q = nq
    raise ValueError(
        f"length map of {activation} at σ_w²={sigma_w2} did not converge in {iters} steps")


def chi_1(activation: str, sigma_w2: float, q_star: float) -> float:
    """χ₁ = ``σ_w² E[φ′(√q* z)²]``: slope of the correlation map at c = 1 (order/chaos: χ₁ ≶ 1)."""
    return sigma_w2 * _moment(sigma_numpy(activation)[1], q_star, 2)


def _polar_rule(c: float, n_angle: int = 48, n_radius: int = 96
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Polar Gauss–Legendre ``(z₁, z₂, w)`` for a 2-D normal, angles split at the kinks of c."""
    s = math.sqrt(max(0.0, 1.0 - c * c))
    phi = math.atan2(s, c)
    cuts = np.sort(
        np.mod([0.5 * np.pi, 1.5 * np.pi, phi + 0.5 * np.pi, phi - 0.5 * np.pi], 2 * np.pi))
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


def _pair_expectation(f: Callable, g: Callable, c: float, s_a: float, s_b: float) -> float:
    """``E[f(s_a z₁) g(s_b (c z₁ + √(1−c²) z₂))]``, z standard 2-D normal (:func:`_polar_rule`)."""
    z1, z2, ww = _polar_rule(float(c))
    u2 = c * z1 + math.sqrt(max(0.0, 1 - c * c)) * z2
    return float(np.sum(ww * f(s_a * z1) * g(s_b * u2)))


def correlation_map(c, activation: str, sigma_w2: float, sigma_b2: float, q_star: float):
    """Mean-field correlation map ``c ↦ (σ_w² E[φ(u₁)φ(u₂)] + σ_b²)/q*``, ``u`` of variance q*
    and correlation c."""
    sig, _ = sigma_numpy(activation)
    s = math.sqrt(q_star)
    return _elementwise(
        lambda v: (sigma_w2 * _pair_expectation(sig, sig, v, s, s) + sigma_b2) / q_star, c)


def depth_scale(chi: float) -> float:
    """Correlation depth scale ``ξ_c = −1/log χ_c`` (layers); ∞ for χ_c ≥ 1.
    Raises ValueError: χ_c ≤ 0."""
    if not chi > 0:
        raise ValueError(f"chi={chi} must be > 0")
    return math.inf if chi >= 1 else -1.0 / math.log(chi)


def relu_correlation_map(c):
    """Critical ReLU correlation map (σ_w² = 2, σ_b = 0): ``f(c) = (√(1−c²) + (π − arccos c) c)/π``."""
    c = np.clip(np.asarray(c, dtype=float), -1.0, 1.0)
    return (np.sqrt(1.0 - c * c) + (np.pi - np.arccos(c)) * c) / np.pi


def _iterates(f: Callable[[float], float], x0: float, steps: int) -> np.ndarray:
    out = np.empty(steps + 1)
    out[0] = x0
    for l in range(steps):
        out[l + 1] = f(out[l])
    return out


def relu_correlation_iterates(c0: float, layers: int) -> np.ndarray:
    """``c_0, c_1 = f(c_0), …, c_layers`` under :func:`relu_correlation_map`, ``(layers+1,)``."""
    return _iterates(relu_correlation_map, c0, layers)


def relu_correlation_gap(layer):
    """Asymptote of the critical ReLU map: ``1 − c_l ≈ 9π²/(2 l²)`` for large l."""
    l = np.asarray(layer, dtype=float)
    return 9 * np.pi**2 / (2 * l**2)


def residual_variance(alpha: float, depth: int, q0: float = 1.0) -> float:
    """Un-normalized residual stream variance ``q0 (1+α²)^L`` (each block adds α² of the current q)."""
    return q0 * (1.0 + alpha**2) ** depth


def random_walk_projection_product(width: int, depth: int, step: float, *, seed: int = 0
) -> np.ndarray:
    """Singular values ``(d,)``, descending, of ``Q_L = Π (I − u_l u_lᵀ)`` (Table 3), unit normals
    on a random walk ``u_l ∝ u_{l−1} + step·g_l/√d`` (``step = βα^M``)."""
    rng = np.random.default_rng(seed)
    u = rng.standard_normal(width)
    u /= np.linalg.norm(u)
    q = np.eye(width)
    for _ in range(depth):
        u = u + step * rng.standard_normal(width) / math.sqrt(width)
        u /= np.linalg.norm(u)
        q = q - np.outer(u, u @ q)
    return np.linalg.svd(q, compute_uv=False)


def covariance_map(q_a: float, q_b: float, c: float, activation: str, sigma_w2: float,
                   sigma_b2: float = 0.0) -> tuple[float, float, float]:
    """One layer of the two-input mean-field maps (215.1/215.2): ``(q_a', q_b', c')``.
    Raises ValueError: ``q_a`` or ``q_b`` ≤ 0, or ``|c| > 1``."""
    if not (q_a > 0 and q_b > 0) or abs(c) > 1:
        raise ValueError(f"q_a={q_a}, q_b={q_b} must be > 0 and |c|={abs(c)} ≤ 1")
    sig, _ = sigma_numpy(activation)
    qa = length_map(q_a, activation, sigma_w2, sigma_b2)
    qb = length_map(q_b, activation, sigma_w2, sigma_b2)
    qab = sigma_w2 * _pair_expectation(sig, sig, c, math.sqrt(q_a), math.sqrt(q_b)) + sigma_b2
    return qa, qb, float(np.clip(qab / math.sqrt(qa * qb), -1.0, 1.0))


def covariance_iterates(q0: float, c0: float, layers: int, activation: str, sigma_w2: float,
                        sigma_b2: float = 0.0, *, gain: float | None = None
                        ) -> tuple[np.ndarray, np.ndarray]:
    """``(q_l, c_l)``, two ``(layers+1,)`` arrays, from length q0 and correlation c0 under
    :func:`covariance_map`; with ``gain`` g, residual: ``q_l = q_{l−1} + g² q'``."""
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
    """The stable fixed point c* of :func:`correlation_map` at q* (215.2); 1 in the ordered phase.
    Raises ValueError: no finite q*, or no convergence."""
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
    """q*, χ₁ (215.3), c*, χ_c (slope at c*) and ξ_c = −1/log χ_c (215.4) of one operating point."""

    q_star: float
    chi_1: float
    c_star: float
    chi_c: float
    xi_c: float


def correlation_depth_scale(activation: str, sigma_w2: float, sigma_b2: float = 0.0) -> DepthScale:
    """:class:`DepthScale` of ``activation`` at ``(σ_w², σ_b²)`` (215.1–215.4).
    Raises ValueError: no finite q* (e.g. relu with σ_w² > 2)."""
    q = length_fixed_point(activation, sigma_w2, sigma_b2)
    chi = chi_1(activation, sigma_w2, q)
    c = correlation_fixed_point(activation, sigma_w2, sigma_b2)
    if c >= 1.0:
        chic = chi
    else:
        _, dsig = sigma_numpy(activation)
        chic = sigma_w2 * _pair_expectation(dsig, dsig, c, math.sqrt(q), math.sqrt(q))
    return DepthScale(q, chi, c, chic, depth_scale(chic) if chic > 0 else 0.0)


def tanh_critical_point(q_star: float) -> tuple[float, float]:
    """``(σ_w², σ_b²)`` on the tanh critical line χ₁ = 1 with fixed point q* (215.1/215.3).
    Raises ValueError: q* ≤ 0."""
    if not q_star > 0:
        raise ValueError(f"q_star={q_star} must be > 0")
    s = math.sqrt(q_star)
    sw2 = 1.0 / gaussian_expectation(lambda z: (1.0 - np.tanh(s * z) ** 2) ** 2)
    sb2 = q_star - sw2 * gaussian_expectation(lambda z: np.tanh(s * z) ** 2)
    return sw2, max(sb2, 0.0)


def tanh_critical_line(sigma_b2) -> np.ndarray | float:
    """σ_w² on the tanh critical line χ₁ = 1 at bias variance σ_b² (scalar or array); 1 at 0.
    Raises ValueError: σ_b² < 0."""
    from scipy.optimize import brentq

    if (np.asarray(sigma_b2) < 0).any():
        raise ValueError(f"sigma_b2 must be ≥ 0, got {np.min(sigma_b2)}")

    def line(target: float) -> float:
        if target == 0:
            return 1.0
        hi = 1.0
        while tanh_critical_point(hi)[1] < target:
            hi *= 2.0
        q = brentq(lambda v: tanh_critical_point(v)[1] - target, 1e-12, hi, xtol=1e-14, rtol=1e-13)
        return tanh_critical_point(q)[0]

    return _elementwise(line, sigma_b2)


def activation_vd(activation: str, q: float = 1.0) -> float:
    """v_D (215.7) = ``E[φ′(√q z)⁴] / E[φ′(√q z)²]² − 1`` (0 linear, 1 relu).
    Raises ValueError: q ≤ 0, or φ′ vanishes almost surely."""
    if not q > 0:
        raise ValueError(f"q={q} must be > 0 (a preactivation variance)")
    _, dsig = sigma_numpy(activation)
    m2, m4 = _moment(dsig, q, 2), _moment(dsig, q, 4)
    if not m2 > 0:
        raise ValueError(f"{activation}: E[φ′²] = 0 at q={q}")
    return max(m4 / m2**2 - 1.0, 0.0)  # ≥ 0 by Jensen; rounding can dip below


def jacobian_spectrum_variance(depth: int, activation: str, init: str, q: float = 1.0) -> float:
    """Var(λ) = L (v_W + v_D) of the squared singular values of ∂h_L/∂h_0 (215.7).

    v_W = 1 (gaussian) or 0 (orthogonal). Raises ValueError: unknown ``init``."""
    v_w = {"gaussian": 1.0, "orthogonal": 0.0}.get(init)
    if v_w is None:
        raise ValueError(f"init={init!r} is not one of gaussian, orthogonal")
    return depth * (v_w + activation_vd(activation, q))


def residual_relu_correlation(c0: float, depth: int, gain: float) -> np.ndarray:
    """``(depth+1,)`` correlations ``c_l = (c_{l−1} + g² f(c_{l−1})) / (1 + g²)`` of a residual
    ReLU net with branch gain g, f = :func:`relu_correlation_map`."""
    g2 = gain * gain
    return _iterates(lambda c: (c + g2 * relu_correlation_map(c)) / (1.0 + g2), c0, depth)


def residual_relu_correlation_ode(c0: float, t, tau: float) -> np.ndarray:
    """Continuous-depth limit ``dc/dt = τ (f(c) − c)``, τ = g² L, at times ``t`` (DOP853)."""
    from scipy.integrate import solve_ivp

    ts = np.atleast_1d(np.asarray(t, dtype=float))
    order = np.argsort(ts)
    sol = solve_ivp(lambda _, c: tau * (relu_correlation_map(c) - c), (0.0, max(ts.max(), 0.0)),
                    [c0], method="DOP853", t_eval=ts[order], rtol=1e-11, atol=1e-13)
    out = np.empty_like(ts)
    out[order] = sol.y[0]
    return out if np.ndim(t) else float(out[0])


def deep_linear_time(depth: int, a0: float, s: float = 1.0) -> float:
    """Time ``∫_{a₀}^{(s/2)^{1/N}} da / (a^{N−1} (s − a^N))`` to s/2 of the deep-linear plateau
    (215.8), N = ``depth``; 0 if already past. Raises ValueError: N < 1, a₀ ≤ 0 or s ≤ 0."""
    from scipy.integrate import quad

    if depth < 1 or not a0 > 0 or not s > 0:
        raise ValueError(f"need depth ≥ 1, a0 > 0, s > 0 (got {depth}, {a0}, {s})")
    a_half = (s / 2.0) ** (1.0 / depth)
    if a0 >= a_half:
        return 0.0
    return float(quad(lambda a: 1.0 / (a ** (depth - 1) * (s - a**depth)), a0, a_half,
                      epsabs=0.0, epsrel=1e-13, limit=200)[0])


def deep_linear_time_asymptote(depth: int, a0: float, s: float = 1.0) -> float:
    """Small-start asymptote of :func:`deep_linear_time` (215.9): ``a₀^{−(N−2)} / (s (N−2))``.
    Raises ValueError: N ≤ 2."""
    if depth <= 2:
        raise ValueError(f"the asymptote 215.9 needs N > 2, got N={depth}")
    return a0 ** (-(depth - 2)) / (s * (depth - 2))


#: per-layer growth toward the input of a batch-normalized ReLU net's weight-gradient norms
#: at initialization (Yang et al. 2019, "A Mean Field Theory of Batch Normalization")
BN_RELU_GRADIENT_GROWTH = math.sqrt(math.pi / (math.pi - 1))
