"""The branch Jacobian and its masked up-projection vs Marchenko–Pastur (Eq. 9/25, Figure
8/9/17), the activation spike (Table 1), and the rank a Post-Norm removes by rescaling vs
projection (Figure 4c, Table 3).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator

import numpy as np
import torch
from torch import Tensor

from ..models.activations import ACTIVATION_DERIVATIVES
from ..models.mlp import Block, ResidualMLP
from ..models.norms import NORM_FNS, NormJacobian
from ..result import Measurement
from ..spectra import erank_from_sv, gram_eigenvalues
from ..theory import (
    activation_constants,
    gaussian_product_erank,
    marchenko_pastur_atom,
    marchenko_pastur_density,
    marchenko_pastur_edges,
    marchenko_pastur_ks,
    random_walk_projection_product,
)
from .base import ProbeContext
from .jacobian import (
    OWN_PRE,
    advance,
    identity_unit,
    layer_jacobians,
    linearize_branch,
    member_jacobian,
    renormalize,
)

log = logging.getLogger(__name__)


def _sigma_prime(block: Block, z: Tensor) -> Tensor:
    """σ′(z) elementwise: the closed form, else forward mode on the block's σ."""
    if block.activation in ACTIVATION_DERIVATIVES:
        return ACTIVATION_DERIVATIVES[block.activation](z)
    return torch.func.jvp(block.sigma, (z,), (torch.ones_like(z),))[1]


def masked_up_projection(block: Block, x: Tensor) -> tuple[Tensor, Tensor]:
    """``A`` ``(E, m, d)`` = ``∂hidden/∂x`` and ``J_f`` ``(E, d, d)`` = ``∂f/∂x`` (Eq. 9/25; no β, no norm
    ops) at branch inputs ``x`` = ``P(h_{l−1})`` ``(E, 1, d)``.
    """
    xv = x[:, 0]  # (E, d)
    if block.matrices == 1:
        z = torch.einsum("emd,ed->em", block.w, xv)
        a = _sigma_prime(block, z)[..., None] * block.w
        return a, a
    u = torch.einsum("emd,ed->em", block.w_up, xv)
    if block.gated:
        g = torch.einsum("emd,ed->em", block.w_gate, xv)
        gate_gain, up_gain = _sigma_prime(block, g) * u, block.sigma(g)
        a = gate_gain[..., None] * block.w_gate + up_gain[..., None] * block.w_up
    else:
        a = _sigma_prime(block, u)[..., None] * block.w_up
    return a, block.w_down @ a


def _at_layers(model: ResidualMLP, h0: Tensor, probe: str, layers
               ) -> Iterator[tuple[int, Block, Tensor]]:
    """``(l, block, h_{l−1})`` in order at the 1-based ``task.options.<probe>.layers``, checked
    against the depth, from one walk of the stream."""
    chosen = {int(v) for v in layers}
    if not chosen:
        raise ValueError(f"task.options.{probe}.layers: list at least one layer")
    bad = [l for l in chosen if not 1 <= l <= model.depth]
    if bad:
        raise ValueError(f"task.options.{probe}.layers: {bad} outside 1…{model.depth}")
    h = h0
    for l, h_next in model.states(h0, max(chosen)):
        if l in chosen:
            yield l, model.blocks[l - 1], h
        h = h_next


def probe_branch_jacobian(ctx: ProbeContext) -> Measurement:
    """Branch Jacobian rank and the masked up-projection vs Marchenko–Pastur (Figure 8/9/17).

    Options ``layers`` (1-based, default all), ``reference_draws``; pooled values in
    :func:`reduce_branch_jacobian`.
    """
    opt = ctx.probe_options("branch_jacobian")
    model, d = ctx.model, ctx.width
    layers = range(1, model.depth + 1) if opt["layers"] is None else opt["layers"]
    er, eigs, qs, rank, surv, steps = [], [], [], [], [], []
    tol = 1e-10 if ctx.h0.dtype == torch.float64 else 1e-5
    with torch.no_grad():
        for l, block, h in _at_layers(model, ctx.h0, "branch_jacobian", layers):
            x = block.pre_norm(h)
            a, jf = masked_up_projection(block, x)
            er.append(erank_from_sv(torch.linalg.svdvals(jf)) / d)
            ev = gram_eigenvalues(a, smaller=False)
            ev = ev / ev.mean(-1, keepdim=True)  # tr(G)/d = 1: the MP normalization
            eigs.append(ev)
            rank.append((ev > tol * ev.amax(-1, keepdim=True)).sum(-1).to(ev.dtype) / d)
            w = block.w if block.matrices == 1 else block.w_up
            z = torch.einsum("emd,ed->em", w, x[:, 0])
            qs.append(z.square().mean(-1))
            if not block.gated:
                surv.append(_sigma_prime(block, z).square().mean(-1))
            steps.append(l)
    er_t, ev_t = torch.stack(er, 1), torch.stack(eigs, 1)  # (E, n), (E, n, d)
    m = Measurement()
    m.add_seed_series("erank_branch_profile", er_t, steps)
    m.add_seed_stat("erank_branch", er_t.mean(1))
    nz = ev_t > tol * ev_t.amax(-1, keepdim=True)
    m.add_seed_stat("mp_eig_max", ev_t.amax(-1).mean(1))
    m.add_seed_stat("mp_eig_min", torch.where(nz, ev_t, math.inf).amin(-1).mean(1))
    m.add_seed_stat("mp_zero_fraction", (~nz).to(ev_t.dtype).mean((1, 2)))
    m.add_seed_stat("masked_rank", torch.stack(rank, 1).mean(1))
    if surv:
        m.add_seed_stat("survival_measured", torch.stack(surv, 1).mean(1))
    m.add_seed_array("mp_preact_var", torch.stack(qs, 1))
    m.add_seed_array(_EIGENVALUES, ev_t)  # pooled by reduce_branch_jacobian, then dropped
    return m


_EIGENVALUES = "_mp_eigenvalues"


def reduce_branch_jacobian(m: Measurement, ctx: ProbeContext) -> None:
    """Pooled over seeds: γ at the mean preactivation variance, the MP fit (KS, edges, atom, histogram) and the Gaussian-product reference."""
    opt = ctx.probe_options("branch_jacobian")
    model, d = ctx.model, ctx.width
    tol = 1e-10 if ctx.h0.dtype == torch.float64 else 1e-5
    ev_np = m.arrays.pop(_EIGENVALUES)
    m.seed_arrays.discard(_EIGENVALUES)
    k = activation_constants(model.activation, float(m.arrays["mp_preact_var"].mean()))
    gamma = k.survival * model.blocks[0].hidden / d  # p·m/d
    lo, hi = marchenko_pastur_edges(gamma)
    m.scalars["erank_branch_reference"] = gaussian_product_erank(
        d, int(round(gamma * d)), draws=int(opt["reference_draws"]), seed=0)
    m.scalars.update(mp_gamma=gamma, mp_ks=marchenko_pastur_ks(ev_np, gamma, zero_tol=tol),
                     mp_edge_lower=lo, mp_edge_upper=hi,
                     mp_atom_theory=marchenko_pastur_atom(gamma),
                     masked_rank_theory=min(1.0, k.survival_rate * model.blocks[0].hidden / d),
                     survival_theory=k.survival)
    top = max(hi, float(ev_np.max())) * 1.02
    counts, edges = np.histogram(ev_np[ev_np > tol * ev_np.max()], bins=80, range=(0.0, top))
    centers = 0.5 * (edges[1:] + edges[:-1])
    m.arrays["mp_hist_centers"] = centers
    m.arrays["mp_hist_density"] = counts / (ev_np.size * np.diff(edges))
    m.arrays["mp_theory_density"] = marchenko_pastur_density(centers, gamma)


def probe_activation_spike(ctx: ProbeContext) -> Measurement:
    """Stable rank of ``σ(W h)`` over n probe inputs vs the spike bound ``1/c`` (Table 1).

    The mean ``E[σ]`` is a rank-one spike holding a fraction c of the energy (deeper layers share
    the stream's mean and drop below 1/c). Options ``n``, ``layers`` (default ``[1]``).
    """
    model = ctx.model
    opt = ctx.probe_options("activation_spike")
    h0 = ctx.probe_inputs(int(opt["n"]))
    sr, coh, qs, steps = [], [], [], []
    with torch.no_grad():
        for l, block, x in _at_layers(model, h0, "activation_spike", opt["layers"]):
            z = block.preactivation(x)  # σ(W P(h)), gated: silu(W_g P(h)) ⊙ W_up P(h)
            a = (block.sigma(block.pre_norm(x) @ block.w_gate.mT) * z if block.gated
                 else block.sigma(z))
            ev = gram_eigenvalues(a)
            sr.append(ev.sum(-1) / ev.amax(-1))
            coh.append(a.mean((-2, -1)).square() / a.square().mean((-2, -1)))
            qs.append(z.square().mean((-2, -1)))
            steps.append(l)
    sr_t, coh_t = torch.stack(sr, 1), torch.stack(coh, 1)
    m = Measurement()
    m.add_seed_series("hidden_stable_rank_profile", sr_t, steps)
    m.add_seed_series("hidden_coherence_profile", coh_t, steps)
    m.add_seed_stat("hidden_stable_rank", sr_t[:, 0])
    m.add_seed_stat("hidden_coherence", coh_t[:, 0])
    m.add_seed_array("hidden_preact_var", qs[0])
    return m


def reduce_activation_spike(m: Measurement, ctx: ProbeContext) -> None:
    """Pooled: ``spike_coherence_theory`` c at the mean preactivation variance, and ``hidden_stable_rank_x_c``."""
    c = activation_constants(ctx.model.activation, float(m.arrays["hidden_preact_var"].mean())).coherence
    m.add_seed_stat("hidden_stable_rank_x_c", torch.as_tensor(m.arrays["hidden_stable_rank"] * c))
    m.scalars["spike_coherence_theory"] = c


def projection_split(model: ResidualMLP, h0: Tensor) -> dict[str, Tensor]:
    """Split the rank a post-residual norm removes into rescaling and projection (Figure 4c).

    On the Post-Norm network (Jacobian ``Π J_R (I + J_b)``, Eq. 18), in units of d:
    ``erank_post`` (as it is), ``erank_post_noproj`` (``Π (I + J_b)`` at the same activations: the
    projection removed), ``erank_prenorm`` (R's op moved to the Pre-Norm position, Eq. 7),
    ``erank_unnormalized`` (R = identity; equals noproj for positively homogeneous σ),
    ``rank_removed_by_projection`` = noproj − post, ``rank_removed_by_rescaling`` = prenorm −
    noproj, ``rank_removed_total``, ``erank_projection_product`` (``Π J_R/‖J_R‖_2``) and
    ``projection_step`` (mean ``‖β f‖/‖h_{l−1}‖``). Each ``(E,)``; NaN where a forward overflows.

    Raises:
        ValueError: R is the identity.
    """
    if model.post_op is None:
        raise ValueError("projection_split needs a post-residual op R (placement='post' or "
                         f"norm.post), got placement={model.placement!r} with R = identity")
    d = h0.shape[-1]
    with torch.no_grad():
        uf, un, up, step = _walk_post(model, h0)
        uu = _walk_residual(model, h0, prenorm=False)
        upre = _walk_residual(model, h0, prenorm=True)
    post, noproj, pre = (_erank_or_nan(u, d) for u in (uf, un, upre))
    return {"erank_post": post, "erank_post_noproj": noproj, "erank_prenorm": pre,
            "erank_unnormalized": _erank_or_nan(uu, d), "rank_removed_by_projection": noproj - post,
            "rank_removed_by_rescaling": pre - noproj, "rank_removed_total": pre - post,
            "erank_projection_product": _erank_or_nan(up, d), "projection_step": step}


def _step(units: dict, logs: dict, l: int, jb: Tensor, skip_from: int | None, keep: int,
          residual: NormJacobian | None = None) -> None:
    """Product ``l`` from ``l−1`` (:func:`advance`); the window keeps ``keep`` products."""
    units[l], logs[l] = advance(units, logs, l, skip_from, jb, residual)
    units.pop(l - keep, None)
    logs.pop(l - keep, None)


def _walk_post(model: ResidualMLP, h0: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The Post-Norm walk: ``Π J_R (I + J_b)``, ``Π (I + J_b)``, ``Π J_R/‖J_R‖_2`` (``(E, d, d)``,
    unit-Frobenius) and the ``(E,)`` mean relative branch step.
    """
    keep, (u0, log0) = max(model.skip_every, 1), identity_unit(h0)
    full, noproj = ({0: u0}, {0: log0}), ({0: u0}, {0: log0})
    u_proj, l_proj = u0, log0
    steps = []
    for lj in layer_jacobians(model, h0):
        branch_out = model.blocks[lj.layer - 1].branch(lj.h_in)
        steps.append((branch_out.norm(dim=-1) / lj.h_in.norm(dim=-1))[:, 0])
        _step(*full, lj.layer, lj.branch, lj.skip_from, keep, lj.residual)
        _step(*noproj, lj.layer, lj.branch, lj.skip_from, keep)
        # J_R/‖J_R‖_2 = I − VVᵀ: the projection without the rescaling
        r = NormJacobian(torch.ones_like(lj.residual.scale), lj.residual.basis)
        u_proj, l_proj = renormalize(r.left(u_proj), l_proj)
    return full[0][model.depth], noproj[0][model.depth], u_proj, torch.stack(steps, 1).mean(1)


def _walk_residual(model: ResidualMLP, h0: Tensor, prenorm: bool) -> Tensor:
    """Product ``(E, d, d)`` of (skip + J) with R = identity; R's op before the branch if ``prenorm``."""
    keep, states, (u0, log0) = max(model.skip_every, 1), {0: h0}, identity_unit(h0)
    units, logs = {0: u0}, {0: log0}
    op = model.post_op if prenorm else OWN_PRE
    for l, block in enumerate(model.blocks, start=1):
        x = states[l - 1]
        s, linear = linearize_branch(block, x, pre_op=op)
        if linear is not None:
            jb = linear.dense()
        else:  # torch.func fallback (gated branch)
            from torch.func import functional_call

            def branch(p, xe, b=block):
                if not prenorm:  # the block's own P, B
                    return functional_call(b, p, (xe,), {"part": "branch"})
                return b.scale * b.out_norm(functional_call(b, p, (NORM_FNS[op](xe),), {"part": "f"}))

            jb = member_jacobian(branch, x, dict(block.named_parameters()))
        skip_from = model.skip_source(l) if block.has_skip else None
        _step(units, logs, l, jb, skip_from, keep)
        states[l] = s if skip_from is None else s + states[skip_from]
        states.pop(l - keep, None)
    return units[model.depth]


def _erank_or_nan(u: Tensor, d: int) -> Tensor:
    """``erank(u)/d`` per member of ``u`` ``(E, d, d)``; NaN where ``u`` is not finite."""
    out = torch.full(u.shape[:1], math.nan, dtype=u.dtype, device=u.device)
    ok = torch.isfinite(u).all(-1).all(-1)
    if ok.any():
        out[ok] = erank_from_sv(torch.linalg.svdvals(u[ok])) / d
    return out


def probe_projection_split(ctx: ProbeContext) -> Measurement:
    """Rank removed by a post-residual norm: rescaling vs projection (Figure 4c, Table 3).

    Scalars: :func:`projection_split`'s, and ``erank_projection_product_rw`` from
    :func:`reduce_projection_split`. Without a post-residual op the probe returns nothing.
    """
    model = ctx.model
    if model.post_op is None:
        log.info(
            "projection_split: placement=%s has no post-residual op R; skipped", model.placement)
        return Measurement()
    out = projection_split(model, ctx.h0)
    m = Measurement()
    for k, v in out.items():
        m.add_seed_stat(k, v)
    return m


def reduce_projection_split(m: Measurement, ctx: ProbeContext) -> None:
    """Pooled: ``erank_projection_product_rw``, the random-walk reference (Table 3) at the mean ``projection_step``."""
    if "projection_step" not in m.arrays:  # not a post-norm network: nothing was measured
        return
    sv = random_walk_projection_product(
        ctx.width, ctx.model.depth, float(m.arrays["projection_step"].mean()), seed=0)
    m.scalars["erank_projection_product_rw"] = float(erank_from_sv(torch.as_tensor(sv))) / ctx.width
