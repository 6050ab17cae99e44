"""Mean-field probes of the chapter, measured beside theory: ``correlation`` (215.1–215.4),
``jacobian_spectrum`` (215.7) and ``deep_linear`` (215.8/215.9); the gradient probes are in
:mod:`.gradients`. Theory is overlaid for a :class:`~rankexp.models.plain.PlainNet` without a
norm op (NaN elsewhere). Probe inputs are drawn per member from its seed (``STREAM_INPUT``).
"""

from __future__ import annotations

import logging
import math

import numpy as np
import torch
from torch import Tensor
from torch.func import jvp

from .. import theory
from ..models.plain import PlainNet
from ..result import Measurement
from ..seeding import STREAM_HEAD, STREAM_INPUT, seeded_generator
from .base import ProbeContext
from .gradients import _where
from .jacobian import branch_jacobian, identity_unit, renormalize

log = logging.getLogger(__name__)


def mean_field_point(model) -> tuple[str, float, float, float | None] | None:
    """``(activation, σ_w², σ_b², gain)`` when the chapter's maps describe ``model``, else None:
    a :class:`PlainNet` without a norm op, plain (gain ``None``) or with a skip on every layer (gain β).
    """
    if not isinstance(model, PlainNet) or model.norm_op is not None or model.skip_every > 1:
        return None
    gain = model.beta_eff if model.skip_every == 1 else None
    return model.activation, model.alpha**2, model.sigma_b**2, gain


def correlated_inputs(seeds, width: int, n: int, c0: float, q0: float, *, dtype=torch.float64,
                      device="cpu") -> Tensor:
    """``(E, n, width)`` inputs with exactly ``‖x‖²/width = q0`` and pairwise correlation c0:
    ``x_i ∝ √c0 u + √(1−c0) v_i``, orthonormal directions from each seed's ``STREAM_INPUT``.

    Raises:
        ValueError: n < 2, n ≥ width, |c0| > 1, c0 < 0 with n > 2, or q0 ≤ 0.
    """
    if n < 2 or n >= width or abs(c0) > 1 or (c0 < 0 and n > 2) or not q0 > 0:
        raise ValueError(f"correlated inputs need 2 ≤ n < width={width}, |c0| ≤ 1 (c0 ≥ 0 for "
                         f"n > 2) and q0 > 0; got n={n}, c0={c0}, q0={q0}")
    rows = []
    for s in seeds:
        g = torch.randn(width, n + 1, generator=seeded_generator(s, STREAM_INPUT),
                        dtype=torch.float64)
        basis = torch.linalg.qr(g)[0].T  # (n+1, width), orthonormal rows
        u, v = basis[0], basis[1:]
        if n == 2:
            x = torch.stack([u, c0 * u + math.sqrt(1 - c0 * c0) * v[0]])
        else:
            x = math.sqrt(c0) * u + math.sqrt(1 - c0) * v
        rows.append(x * math.sqrt(width * q0))
    return torch.stack(rows).to(dtype=dtype, device=device)


def _mean_cosine(h: Tensor) -> Tensor:
    """Mean pairwise cosine of the n rows of ``h`` ``(E, n, d)`` → ``(E,)``."""
    u = h / torch.linalg.vector_norm(h, dim=-1, keepdim=True)
    g = u @ u.mT
    n = h.shape[-2]
    return (g.sum((-2, -1)) - g.diagonal(dim1=-2, dim2=-1).sum(-1)) / (n * (n - 1))


def _sigma_prime(layer, x: Tensor) -> Tensor:
    """φ′ at ``N(x)`` elementwise (forward mode on the layer's own φ, any activation)."""
    u = layer.normalize(x)
    return jvp(layer.sigma, (u,), (torch.ones_like(u),))[1]


def layer_chi(layer, x: Tensor, tangents: Tensor | None = None) -> Tensor:
    """``tr(J_aᵀ J_b)/n`` ``(E, B, B)`` for every pair of inputs of ``x`` ``(E, B, n)``: χ₁ on the diagonal
    (215.3), χ_c off it (215.4); exact without a norm op, else estimated over ``tangents``.

    Raises:
        ValueError: a batch-normalized layer, or a norm op without ``tangents``.
    """
    n = x.shape[-1]
    if layer.norm_op is None:
        col2 = layer.w.square().sum(-2)  # (E, n): ‖W_{:,j}‖²
        d = _sigma_prime(layer, x)
        return layer.scale**2 * torch.einsum("eaj,ebj,ej->eab", d, d, col2) / n
    if layer.norm_op == "batchnorm":
        raise ValueError("χ₁ of a batch-normalized layer couples the batch; not measured")
    if tangents is None:
        raise ValueError(f"layer_chi with norm op {layer.norm_op!r} needs tangents (K, E, 1, n)")
    total = torch.zeros(x.shape[:-1] + x.shape[-2:-1], dtype=x.dtype, device=x.device)
    for v in tangents:
        jv = jvp(layer.branch, (x,), (v.expand_as(x),))[1]
        total += jv @ jv.mT
    return total / (len(tangents) * n)


def member_tangents(seeds, width: int, k: int, *, dtype=torch.float64, device="cpu") -> Tensor:
    """k standard Gaussian tangents per member ``(k, E, 1, width)`` from each seed's ``STREAM_HEAD``."""
    rows = [torch.randn(k, 1, width, generator=seeded_generator(s, STREAM_HEAD),
                        dtype=torch.float64) for s in seeds]
    return torch.stack(rows, 1).to(dtype=dtype, device=device)


def fit_depth_scale(layers: np.ndarray, c: np.ndarray) -> tuple[float, float]:
    """Least-squares fit ``c_l = c∞ + A e^{−l/ξ}``: ``(ξ ≤ 10⁴, c∞)``, NaN if it fails."""
    from scipy.optimize import curve_fit

    c = np.asarray(c, dtype=float)
    if c.size < 4 or not np.all(np.isfinite(c)) or np.ptp(c) < 1e-12:
        return math.nan, math.nan
    d, k0 = np.diff(c), 0.1
    if d[0] != 0 and d[-1] / d[0] > 0:
        k0 = float(np.clip(-np.log(abs(d[-1] / d[0])) / max(len(d) - 1, 1), 1e-3, 5.0))
    try:
        (cinf, _, k), _ = curve_fit(lambda l, cinf, a, k: cinf + a * np.exp(-k * l),
                                    layers - layers[0], c, p0=[c[-1], c[0] - c[-1], k0],
                                    bounds=([-1.5, -3.0, 1e-4], [1.5, 3.0, 20.0]), maxfev=20000)
    except (RuntimeError, ValueError):
        return math.nan, math.nan
    return float(min(1.0 / k, 1e4)), float(cinf)


def probe_correlation(ctx: ProbeContext) -> Measurement:
    """q_l and c_l of n inputs through depth vs the iterated maps; χ₁, χ_c and ξ_c.

    The chapter, 215.1–215.4. Options ``n``, ``c0``, ``q0`` (:func:`correlated_inputs`), ``fit_from``,
    ``chi_from`` (default L/2), ``tangents``. ``xi_c`` = −1/ln χ_c (capped at 1e6); ``xi_c_fit`` fits
    ``c_l = c∞ + A e^{−l/ξ}`` (:func:`fit_depth_scale`) beside the same fit of the theory.
    """
    opt = ctx.probe_options("correlation")
    model, L = ctx.model, ctx.model.depth
    n, c0, q0 = int(opt["n"]), float(opt["c0"]), float(opt["q0"])
    x = correlated_inputs(model.seeds, model.width, n, c0, q0, **_where(model))
    tangents = None if model.blocks[0].norm_op is None else member_tangents(
        model.seeds, model.width, int(opt["tangents"]), **_where(model))
    with torch.no_grad():
        hs = model.trajectory(x)
        q = torch.stack([h.square().mean((-2, -1)) for h in hs], 1)  # (E, L+1)
        c = torch.stack([_mean_cosine(h) for h in hs], 1)
        chis = None if getattr(model.blocks[0], "norm_op", None) == "batchnorm" else [
            layer_chi(layer, h, tangents) for layer, h in zip(model.blocks, hs[:-1], strict=True)]
    steps = np.arange(L + 1)
    m = Measurement()
    m.add_seed_series("mf_q", q, steps)
    m.add_seed_series("mf_c", c, steps)
    m.scalars["mf_q0"], m.scalars["mf_c0"] = float(q[:, 0].mean()), float(c[:, 0].mean())
    fit_from = int(opt["fit_from"])
    m.scalars["xi_c_fit"], m.scalars["c_inf"] = fit_depth_scale(
        steps[fit_from:], c.double().cpu().numpy().mean(0)[fit_from:])
    if chis is not None:
        chi_from = int(opt["chi_from"]) if opt["chi_from"] is not None else max(1, (L + 1) // 2)
        eye = torch.eye(n, dtype=torch.bool, device=x.device)
        chi1 = torch.stack([ch.diagonal(dim1=-2, dim2=-1).mean(-1) for ch in chis], 1)
        chic = torch.stack([ch[:, ~eye].mean(-1) for ch in chis], 1)
        m.add_seed_series("mf_chi1", chi1, steps[1:])
        m.add_seed_series("mf_chi_c", chic, steps[1:])
        m.add_seed_stat("chi1", chi1[:, chi_from - 1:].mean(1))
        m.add_seed_stat("chi_c", chic[:, chi_from - 1:].mean(1))
        chi_c = m.scalars["chi_c"]
        m.scalars["xi_c"] = min(theory.depth_scale(chi_c), 1e6) if chi_c > 0 else math.nan
    m.update(_correlation_theory(model, q0, c0, L, fit_from))
    return m


def _correlation_theory(model, q0: float, c0: float, depth: int, fit_from: int) -> Measurement:
    m = Measurement()
    keys = ("chi1_theory", "xi_c_theory", "c_star_theory", "chi_c_theory", "q_star_theory",
            "xi_c_fit_theory")
    m.scalars.update(dict.fromkeys(keys, math.nan))
    point = mean_field_point(model)
    if point is None:
        return m
    act, sw2, sb2, gain = point
    qs, cs = theory.covariance_iterates(q0, c0, depth, act, sw2, sb2, gain=gain)
    steps = np.arange(depth + 1)
    m.series["mf_q_theory"] = (steps, qs)
    m.series["mf_c_theory"] = (steps, cs)
    m.scalars["xi_c_fit_theory"] = fit_depth_scale(steps[fit_from:], cs[fit_from:])[0]
    chi = [(gain**2 if gain is not None else 1.0) * theory.chi_1(act, sw2, v) for v in qs[:-1]]
    m.series["mf_chi1_theory"] = (steps[1:], np.array(chi))
    if gain is not None:
        return m  # residual streams grow; they have no fixed point
    try:
        ds = theory.correlation_depth_scale(act, sw2, sb2)
    except ValueError as e:  # no finite q* (e.g. relu with σ_w² > 2)
        log.info("correlation theory: %s", e)
        return m
    m.scalars.update(chi1_theory=ds.chi_1, xi_c_theory=min(ds.xi_c, 1e6), c_star_theory=ds.c_star,
                     chi_c_theory=ds.chi_c, q_star_theory=ds.q_star)
    return m


def _input_variance(model, option) -> float:
    """q_0 of the spectrum's input: a number, or the length map's fixed point (else 1)."""
    if option != "fixed_point":
        return float(option)
    point = mean_field_point(model)
    if point is None or point[3] is not None:
        return 1.0
    act, sw2, sb2, _ = point
    try:
        return theory.length_fixed_point(act, sw2, sb2)
    except ValueError:
        return 1.0


def io_jacobian(model, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``∂h_L/∂h_0`` at ``x`` ``(E, 1, n)`` as the product of the layer Jacobians ``[I +] g W
    diag(φ′(x))`` (``jacfwd`` with a norm op; 215.7): ``(unit, log_norm, vd)`` with the per-layer
    measured v_D = mean φ′⁴/(mean φ′²)² − 1 ``(E, L)``.

    Raises:
        ValueError: skip_every > 1, or a batch-normalized network.
    """
    if model.skip_every > 1:
        raise ValueError(f"jacobian_spectrum supports skip_every 0 or 1, not {model.skip_every}")
    if getattr(model.blocks[0], "norm_op", None) == "batchnorm":
        raise ValueError("jacobian_spectrum differentiates one input; batchnorm needs a batch")
    (unit, log_norm), n = identity_unit(x), x.shape[-1]
    vd, h = [], x
    for layer in model.blocks:
        dphi = _sigma_prime(layer, h)  # (E, 1, n)
        j = layer.scale * layer.w * dphi if layer.norm_op is None else branch_jacobian(layer, h)
        if layer.has_skip:
            j = j + torch.eye(n, dtype=x.dtype, device=x.device)
        unit, log_norm = renormalize(j @ unit, log_norm)
        d2 = dphi[:, 0].square()
        vd.append(d2.square().mean(-1) / d2.mean(-1).square() - 1.0)
        h = layer(h, h if layer.has_skip else None)
    return unit, log_norm, torch.stack(vd, 1)


def probe_jacobian_spectrum(ctx: ProbeContext) -> Measurement:
    """Spectrum of ``J Jᵀ``, J = ∂h_L/∂h_0, normalized to mean 1, vs free probability (215.7).

    Input ``‖h_0‖²/n = q0`` (``fixed_point``: q*); ``lambda_var_theory`` = Σ_l (v_W + v_D(q_{l−1})),
    ``lambda_zero_fraction_theory`` = P(φ′ = 0).
    """
    opt = ctx.probe_options("jacobian_spectrum")
    model = ctx.model
    q0 = _input_variance(model, opt["q0"])
    x = _scaled_gaussian(model, q0)
    with torch.no_grad():
        unit, log_norm, vd = io_jacobian(model, x)
        s2 = torch.linalg.svdvals(unit).square()
    mean = s2.mean(-1, keepdim=True)
    lam = s2 / mean
    m = Measurement()
    m.add_seed_stat("lambda_var", lam.square().mean(-1) - 1.0)
    m.add_seed_stat("lambda_m2", lam.square().mean(-1))
    m.add_seed_stat("log_lambda_mean", 2 * log_norm + mean[:, 0].log())
    m.add_seed_stat("v_d_measured", vd.mean(1))
    lam = m.arrays["lambda"] = lam.double().cpu().numpy()
    # density of log₁₀ λ over the resolvable λ (above (n ε)² max λ)
    resolved = lam[lam > (lam.shape[-1] * np.finfo(lam.dtype).eps) ** 2 * lam.max(-1, keepdims=True)]
    logs = np.log10(resolved) if resolved.size else np.zeros(1)
    mid = 0.5 * (logs.min() + logs.max())
    m.arrays["log_lambda_hist"], m.arrays["log_lambda_edges"] = np.histogram(
        logs, bins=int(opt["bins"]), range=(min(logs.min(), mid - 0.05), max(logs.max(), mid + 0.05)),
        density=True)
    m.scalars["lambda_zero_fraction"] = 1.0 - resolved.size / lam.size
    m.scalars["spectrum_q0"] = q0
    m.scalars.update(_spectrum_theory(model, q0))
    return m


def _scaled_gaussian(model, q0: float) -> Tensor:
    g = torch.stack([torch.randn(model.width, generator=seeded_generator(s, STREAM_INPUT),
                                 dtype=torch.float64) for s in model.seeds])
    x = g * math.sqrt(q0 * model.width) / torch.linalg.vector_norm(g, dim=-1, keepdim=True)
    return x[:, None, :].to(**_where(model))


def _spectrum_theory(model, q0: float) -> dict[str, float]:
    out = dict.fromkeys(("lambda_var_theory", "v_w_theory", "v_d_theory",
                         "lambda_zero_fraction_theory"), math.nan)
    point = mean_field_point(model)
    if point is None or point[3] is not None:
        return out
    act, sw2, sb2, _ = point
    out["lambda_zero_fraction_theory"] = 1.0 - theory.activation_constants(act, q0).survival_rate
    v_w = 1.0 if model.init == "gaussian" else 0.0
    qs = [q0]
    for _ in range(model.depth - 1):
        qs.append(theory.length_map(qs[-1], act, sw2, sb2))
    out.update(v_w_theory=v_w, v_d_theory=theory.activation_vd(act, q0),
               lambda_var_theory=float(sum(v_w + theory.activation_vd(act, v) for v in qs)))
    return out


def simulate_deep_linear(depth: int, a0: float, s: float, *, width: int = 4, seed: int = 0,
                         rtol: float = 1e-10) -> float:
    """Gradient flow on a real deep linear chain (a linear orthogonal :class:`PlainNet`): the time its
    product reaches s/2, to compare with T(N, a₀, s) of 215.8 (0 when already past halfway).
    """
    from scipy.integrate import solve_ivp

    if a0**depth >= s / 2:
        return 0.0
    chain = PlainNet(width, depth, activation="linear", alpha=a0, init="orthogonal",
                     seeds=[seed])
    params = [layer.w for layer in chain.blocks]
    eye = torch.eye(width, dtype=torch.float64)[None]
    with torch.no_grad():
        target = s * chain(eye)[0] / a0**depth  # s Pᵀ (rows: the chain maps row vectors)
    shapes = [p.shape for p in params]

    def product(theta: np.ndarray):
        ws = torch.as_tensor(theta).split([math.prod(sh) for sh in shapes])
        ws = [w.view(sh).requires_grad_(True) for w, sh in zip(ws, shapes, strict=True)]
        out = eye[0]
        for w in ws:
            out = out @ w[0].mT
        return ws, out

    def rhs(_, theta):
        ws, out = product(theta)
        loss = 0.5 * (target - out).square().sum()
        grads = torch.autograd.grad(loss, ws)
        return -torch.cat([g.reshape(-1) for g in grads]).numpy()

    def halfway(_, theta):
        with torch.no_grad():
            _, out = product(theta)
            return float((out * target).sum() / (s * width)) - s / 2

    halfway.terminal, halfway.direction = True, 1
    theta0 = torch.cat([p.detach().reshape(-1) for p in params]).numpy()
    horizon = 10 * max(theory.deep_linear_time(depth, a0, s), 1.0)
    sol = solve_ivp(rhs, (0.0, horizon), theta0, method="DOP853", events=halfway, rtol=rtol,
                    atol=1e-12)
    if not sol.t_events[0].size:
        raise RuntimeError(f"deep linear chain N={depth}, a0={a0} did not reach s/2 by t={horizon}")
    return float(sol.t_events[0][0])


def probe_deep_linear(ctx: ProbeContext) -> Measurement:
    """Deep-linear learning time T(N, a₀, s) (215.8), its asymptote (215.9), simulated checks.

    Options ``depths``, ``a0``, ``s``, ``simulate`` (``[N, a₀]`` pairs), ``sim_width``; the task's
    network is not used.
    """
    opt = ctx.probe_options("deep_linear")
    s, depths = float(opt["s"]), [int(n) for n in opt["depths"]]
    m = Measurement()
    for a0 in (float(a) for a in opt["a0"]):
        m.series[f"T_quad_a{a0:g}"] = (np.array(depths),
                                       np.array([theory.deep_linear_time(n, a0, s) for n in depths]))
        big = [n for n in depths if n > 2]
        if a0 < 1 and big:
            m.series[f"T_asym_a{a0:g}"] = (
                np.array(big), np.array([theory.deep_linear_time_asymptote(n, a0, s) for n in big]))
    errs = []
    for n, a0 in ((int(p[0]), float(p[1])) for p in opt["simulate"]):
        quad = theory.deep_linear_time(n, a0, s)
        sim = simulate_deep_linear(n, a0, s, width=int(opt["sim_width"]), seed=ctx.model.seeds[0])
        m.scalars[f"T_sim_N{n}_a{a0:g}"], m.scalars[f"T_quad_N{n}_a{a0:g}"] = sim, quad
        if quad > 0:
            errs.append(abs(sim - quad) / quad)
    m.scalars["T_sim_rel_err"] = max(errs) if errs else math.nan
    m.scalars["deep_linear_s"] = s
    return m
