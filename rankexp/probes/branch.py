"""The branch Jacobian, its masked up-projection, the activation spike, and post-norm's split.

* Branch Jacobian (Eq. 9/25) at the branch input ``x = P(h_{l−1})``::

      J_f = W_down D W_up,   D = diag(σ′(W_up x))          (M = 2)
      J_f = D W                                          (M = 1)
      J_f = W_down [diag(σ′(g)⊙u) W_g + diag(σ(g)) W_up]  (gated, g = W_g x, u = W_up x)

  The bracket (``D W_up``, ``D W`` or the gated bracket) is the *masked
  up-projection* ``A ∈ R^{m×d}``; its Gram spectrum is compared with
  Marchenko–Pastur at γ = p·m/d (Figure 8/9/17; normalization in
  :func:`rankexp.theory.marchenko_pastur_edges`).  σ′ is the closed form (autograd on
  the model's own σ for any other), so every activation works.
* Activation spike (Table 1): the stable rank of the hidden activations
  ``σ(W P(h))`` over n probe inputs approaches the spike bound ``1/c``.
* Projection split (Figure 4c, Table 3): for Post-Norm, how much rank the
  post-residual norm removes through its forward rescaling vs its Jacobian's
  projection (:func:`projection_split`).
"""

from __future__ import annotations

import logging
import math

import numpy as np
import torch
from torch import Tensor

from ..models.activations import ACTIVATION_DERIVATIVES
from ..models.mlp import Block, ResidualMLP
from ..models.norms import NORM_FNS, NormJacobian
from ..result import Measurement
from ..spectra import erank_from_sv, gram_eigenvalues, singular_values
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
from .catalog import (
    ACTIVATION_SPIKE_OPTIONS,
    BRANCH_JACOBIAN_OPTIONS,
)
from .jacobian import OWN_PRE, layer_jacobians, linearize_branch, member_jacobian

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- J_f and D·W_up
def _sigma_prime(block: Block, z: Tensor) -> Tensor:
    """σ′(z) elementwise: the closed form, or autograd on the block's σ (any other activation)."""
    if block.activation in ACTIVATION_DERIVATIVES:
        return ACTIVATION_DERIVATIVES[block.activation](z)
    with torch.enable_grad():
        z = z.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(block.sigma(z).sum(), z)
    return g


def masked_up_projection(block: Block, x: Tensor) -> tuple[Tensor, Tensor]:
    """Masked up-projection ``A`` and bare branch Jacobian ``J_f`` at branch inputs ``x``.

    Args:
        block: one block (E members).
        x: the branch input ``P(h_{l−1})``, ``(E, 1, d)``.

    Returns:
        ``A`` ``(E, m, d)`` = ``∂hidden/∂x`` (``D W_up``, ``D W`` or the gated bracket)
        and ``J_f`` ``(E, d, d)`` = ``∂f/∂x`` (Eq. 9/25; no β, no norm ops).
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


def _survival_gamma(model: ResidualMLP, q: float) -> tuple[float, float, float]:
    """(p, survival rate, γ = p·m/d) of the model's activation at preactivation variance q."""
    k = activation_constants(model.activation, q)
    hidden = model.blocks[0].hidden
    return k.survival, k.survival_rate, k.survival * hidden / model.width


def probe_branch_jacobian(ctx: ProbeContext) -> Measurement:
    """Branch Jacobian rank and the masked up-projection vs Marchenko–Pastur (Figure 8/9/17).

    Measured at the forward activation of ``ctx.h0`` on the layers chosen by option
    ``layers`` (``task.options.branch_jacobian.layers``: list of 1-based layers, default
    all); ``reference_draws`` (default 4) sets the Monte Carlo size of the reference.

    Scalars: ``erank_branch`` (mean over layers of erank(J_f)/d), ``erank_branch_reference``
    (erank/d of a Gaussian product with inner dimension round(γ d),
    :func:`rankexp.theory.gaussian_product_erank`), ``mp_gamma`` (γ = p·m/d at the measured
    preactivation variance), ``mp_ks`` (KS distance of the pooled normalized Gram
    eigenvalues of ``A = D W_up`` over layers and seeds to MP(γ)), ``mp_edge_lower`` /
    ``mp_edge_upper`` (theory) vs ``mp_eig_min`` / ``mp_eig_max`` (mean over layers of the
    smallest nonzero / largest normalized eigenvalue), ``mp_zero_fraction`` vs
    ``mp_atom_theory`` (= max(0, 1−γ)), ``masked_rank`` (numerical rank(A)/d) vs
    ``masked_rank_theory`` = min(1, P(σ′≠0)·m/d) (full rank from m/d = 1/p),
    ``survival_measured`` (mean D²; theory ``survival_theory`` = p).
    Series (step = l): ``erank_branch_profile``.
    Arrays: ``mp_hist_centers``, ``mp_hist_density`` (pooled, per unit of normalized
    eigenvalue, integrating to 1 − zero fraction), ``mp_theory_density``; per seed
    ``mp_preact_var`` ``(E, layers)``.  The pooled quantities come from
    :func:`reduce_branch_jacobian`.
    """
    opt = ctx.probe_options("branch_jacobian", BRANCH_JACOBIAN_OPTIONS)
    model, d = ctx.model, ctx.width
    chosen = set(
        range(1, model.depth + 1) if opt["layers"] is None else (int(v) for v in opt["layers"])
    )
    bad = [l for l in chosen if not 1 <= l <= model.depth]
    if bad:
        raise ValueError(f"task.options.branch_jacobian.layers: {bad} outside 1…{model.depth}")
    states = {0: ctx.h0}
    keep = max(model.skip_every, 1)
    er, eigs, qs, rank, surv, steps = [], [], [], [], [], []
    tol = 1e-10 if ctx.h0.dtype == torch.float64 else 1e-5
    with torch.no_grad():
        for l, block in enumerate(model.blocks, start=1):
            h = states[l - 1]
            if l in chosen:
                x = block.pre_norm(h)
                a, jf = masked_up_projection(block, x)
                er.append(erank_from_sv(singular_values(jf)) / d)
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
            b = block.branch(h)
            s = b + states[model.skip_source(l)] if block.has_skip else b
            states[l] = block.res_norm(s)
            states.pop(l - keep, None)
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
    """What pools every seed: γ at the mean preactivation variance, the MP fit (KS distance,
    edges, atom, histogram) of all seeds' eigenvalues, and the Gaussian-product reference."""
    opt = ctx.probe_options("branch_jacobian", BRANCH_JACOBIAN_OPTIONS)
    model, d = ctx.model, ctx.width
    tol = 1e-10 if ctx.h0.dtype == torch.float64 else 1e-5
    ev_np = m.arrays.pop(_EIGENVALUES)
    m.seed_arrays.discard(_EIGENVALUES)
    p, rate, gamma = _survival_gamma(model, float(m.arrays["mp_preact_var"].mean()))
    lo, hi = marchenko_pastur_edges(gamma)
    m.scalars["erank_branch_reference"] = gaussian_product_erank(
        d, int(round(gamma * d)), draws=int(opt["reference_draws"]), seed=0
    )
    m.scalars.update(
        mp_gamma=gamma,
        mp_ks=marchenko_pastur_ks(ev_np, gamma, zero_tol=tol),
        mp_edge_lower=lo,
        mp_edge_upper=hi,
        mp_atom_theory=marchenko_pastur_atom(gamma),
        masked_rank_theory=min(1.0, rate * model.blocks[0].hidden / d),
        survival_theory=p,
    )
    top = max(hi, float(ev_np.max())) * 1.02
    counts, edges = np.histogram(ev_np[ev_np > tol * ev_np.max()], bins=80, range=(0.0, top))
    centers = 0.5 * (edges[1:] + edges[:-1])
    m.arrays["mp_hist_centers"] = centers
    m.arrays["mp_hist_density"] = counts / (ev_np.size * np.diff(edges))
    m.arrays["mp_theory_density"] = marchenko_pastur_density(centers, gamma)


# --------------------------------------------------------------------------- Table 1 spike
def hidden_activations(block: Block, h: Tensor) -> Tensor:
    """Hidden activations ``σ(W P(h))`` (gated: ``silu(W_g P(h)) ⊙ W_up P(h)``), ``(E, n, m)``."""
    x = block.pre_norm(h)
    z = block.preactivation(h)
    if block.gated:
        return block.sigma(torch.matmul(x, block.w_gate.mT)) * z
    return block.sigma(z)


def probe_activation_spike(ctx: ProbeContext) -> Measurement:
    """Stable rank of ``σ(W h)`` over n probe inputs vs the spike bound ``1/c`` (Table 1).

    The hidden activations ``A_l = σ(W P(h_{l−1}))`` (``n×m``, uncentered) have a
    mean ``E[σ]`` in every entry — a rank-one spike holding a fraction c of the
    energy, so ``stable_rank(A) → 1/c`` (finite-size: ``1/(c + (1−c)(1/n + 1/m))``).

    Table 1's condition is the first layer, whose inputs are independent Gaussians.
    Deeper layers see inputs that share the stream's accumulated mean, so their
    hidden activations are more correlated than the spike alone implies and the
    stable rank drops below ``1/c`` (e.g. 1.5 vs π at l = 384, M = 2, ReLU).

    Options (``task.options.activation_spike``): ``n`` (default 2048), ``layers``
    (1-based list, default ``[1]``; the forward runs up to the deepest one).

    Scalars (at the shallowest listed layer): ``hidden_stable_rank``, ``hidden_coherence``
    (measured ``mean(A)²/mean(A²)``), ``hidden_stable_rank_x_c`` (measured stable rank × c:
    ≈ 1 when the spike dominates, 0 when c = 0); ``spike_coherence_theory`` (c at the
    measured preactivation variance of that layer).  Series (step = l):
    ``hidden_stable_rank_profile``, ``hidden_coherence_profile``.
    """
    model = ctx.model
    opt = ctx.probe_options("activation_spike", ACTIVATION_SPIKE_OPTIONS)
    chosen = {int(v) for v in opt["layers"]}
    if not chosen:
        raise ValueError("task.options.activation_spike.layers: list at least one layer")
    bad = [l for l in chosen if not 1 <= l <= model.depth]
    if bad:
        raise ValueError(f"task.options.activation_spike.layers: {bad} outside 1…{model.depth}")
    h = ctx.probe_inputs(int(opt["n"]))
    states, keep = {0: h}, max(model.skip_every, 1)
    sr, coh, qs, steps = [], [], [], []
    with torch.no_grad():
        for l, block in enumerate(model.blocks, start=1):
            x = states[l - 1]
            if l in chosen:
                a = hidden_activations(block, x)
                ev = gram_eigenvalues(a)
                sr.append(ev.sum(-1) / ev.amax(-1))
                coh.append(a.mean((-2, -1)).square() / a.square().mean((-2, -1)))
                qs.append(block.preactivation(x).square().mean((-2, -1)))
                steps.append(l)
            b = block.branch(x)
            s = b + states[model.skip_source(l)] if block.has_skip else b
            states[l] = block.res_norm(s)
            states.pop(l - keep, None)
            if l >= max(chosen):
                break
    sr_t, coh_t = torch.stack(sr, 1), torch.stack(coh, 1)
    m = Measurement()
    m.add_seed_series("hidden_stable_rank_profile", sr_t, steps)
    m.add_seed_series("hidden_coherence_profile", coh_t, steps)
    m.add_seed_stat("hidden_stable_rank", sr_t[:, 0])
    m.add_seed_stat("hidden_coherence", coh_t[:, 0])
    m.add_seed_array("hidden_preact_var", qs[0])
    return m


def reduce_activation_spike(m: Measurement, ctx: ProbeContext) -> None:
    """Pooled over seeds: c at the seeds' mean preactivation variance of the shallowest layer,
    and the per-seed ``stable rank × c`` against it."""
    c = activation_constants(ctx.model.activation, float(m.arrays["hidden_preact_var"].mean())).coherence
    m.add_seed_stat("hidden_stable_rank_x_c", torch.as_tensor(m.arrays["hidden_stable_rank"] * c))
    m.scalars["spike_coherence_theory"] = c


# --------------------------------------------------------------------------- Figure 4c / Table 3
def _accumulate(unit: Tensor, log: Tensor, factor: Tensor | NormJacobian) -> tuple[Tensor, Tensor]:
    """``factor @ (e^log · unit)`` back in unit-Frobenius + ln-norm form (closed-form factors
    applied in O(d²))."""
    acc = factor.left(unit) if isinstance(factor, NormJacobian) else factor @ unit
    norm = torch.linalg.matrix_norm(acc)
    return acc / norm[:, None, None], log + norm.log()


def projection_split(model: ResidualMLP, h0: Tensor) -> dict[str, Tensor]:
    """Split the rank a post-residual norm removes into rescaling and projection (Figure 4c).

    On the Post-Norm network (forward with R, Jacobian ``Π J_R (I + J_b)``, Eq. 18):

    * ``erank_post``: ``erank(Π_l J_R (I + J_b))/d`` — the network as it is.
    * ``erank_post_noproj``: ``erank(Π_l (I + J_b))/d`` at the *same* forward
      activations.  A scalar rescaling factors out of the product, so this is
      also the "rescaling-only" (detached) Jacobian; only the projection is gone.
    * ``erank_prenorm``: the same weights with R's op moved to the Pre-Norm position
      (``h_l = h_{l−1} + β B(f(R(h_{l−1})))``, Eq. 7; it replaces the block's own P, if any) —
      the reference in which the op does not rescale the stream, so the branch ratio decays
      (Eq. 22).
    * ``rank_removed_by_projection`` = noproj − post (the Jacobian's projection);
      ``rank_removed_by_rescaling`` = prenorm − noproj (the post-residual rescaling
      holds every branch at ratio βα^M); ``rank_removed_total`` = prenorm − post.
      All in units of d.
    * ``erank_unnormalized``: the same weights with R = identity in forward and
      Jacobian (``h_l = h_{l−1} + β B(f(P(h_{l−1})))``, the block's own P and B kept).  For positively homogeneous σ
      (relu, abs, leaky_relu, linear) the unnormalized stream is a rescaled copy of
      the Post-Norm stream, so this equals ``erank_post_noproj`` exactly: post-residual
      rescaling then removes no rank relative to no norm at all — both hold the ratio
      at βα^M (Eq. 21) — and all post-norm adds is the projection.
    * ``erank_projection_product``: ``erank(Π_l J_R/‖J_R‖_2)/d`` — the projections alone
      along the real trajectory (``I − ŝ_lŝ_lᵀ`` for rmsnorm), and ``projection_step``:
      the mean relative branch step ``‖β f‖/‖h_{l−1}‖`` driving the stream's direction.

    Args:
        model: a network with a post-residual op R (``placement = "post"``, or any P/B with
            ``norm.post`` set: the general block of Eq. 17).
        h0: ``(E, 1, d)``.

    Returns:
        name → ``(E,)`` tensor.  For the ``detached`` op the split is 0 by construction
        (its Jacobian has no projection).  The unnormalized forward can overflow (stream variance
        ``(1+α²)^L``); its erank is then NaN.

    Raises:
        ValueError: R is the identity.
    """
    if model.post_op is None:
        raise ValueError("projection_split needs a post-residual op R (placement='post' or "
                         f"norm.post), got placement={model.placement!r} with R = identity")
    e, _, d = h0.shape
    eye = torch.eye(d, dtype=h0.dtype, device=h0.device).expand(e, d, d)
    zero = torch.zeros(e, dtype=h0.dtype, device=h0.device)
    keep = max(model.skip_every, 1)

    with torch.no_grad():
        uf, un, up, step = _walk_post(model, h0, eye, zero, keep)
        uu = _walk_residual(model, h0, eye, zero, keep, prenorm=False)
        upre = _walk_residual(model, h0, eye, zero, keep, prenorm=True)

    def er(u: Tensor) -> Tensor:
        return _erank_or_nan(u, d)

    post, noproj, pre = er(uf), er(un), er(upre)
    return {
        "erank_post": post,
        "erank_post_noproj": noproj,
        "erank_prenorm": pre,
        "erank_unnormalized": er(uu),
        "rank_removed_by_projection": noproj - post,
        "rank_removed_by_rescaling": pre - noproj,
        "rank_removed_total": pre - post,
        "erank_projection_product": er(up),
        "projection_step": step,
    }


def _walk_post(model: ResidualMLP, h0: Tensor, eye: Tensor, zero: Tensor, keep: int
               ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`projection_split`'s walk of the Post-Norm network: the ``(E, d, d)`` products
    ``Π J_R (I + J_b)`` and ``Π (I + J_b)`` (each ``/√d``), the projections' product
    ``Π J_R/‖J_R‖_2`` and the ``(E,)`` mean relative branch step."""
    d = h0.shape[-1]
    u_full = u_noproj = u_proj = eye / math.sqrt(d)
    l_full = l_noproj = l_proj = zero
    skips: dict[int, tuple] = {0: (u_full, l_full, u_noproj, l_noproj)}
    steps = []
    for lj in layer_jacobians(model, h0):
        branch_out = model.blocks[lj.layer - 1].branch(lj.h_in)
        steps.append((branch_out.norm(dim=-1) / lj.h_in.norm(dim=-1))[:, 0])
        uf, lf, un, ln_ = skips[lj.layer - 1]
        nf, nlf = _accumulate(uf, lf, lj.branch)
        nn_, nln = _accumulate(un, ln_, lj.branch)
        if lj.skip_from is not None:
            sf, slf, sn, sln = skips[lj.skip_from]
            nf, nlf = _add(nf, nlf, sf, slf)
            nn_, nln = _add(nn_, nln, sn, sln)
        nf, nlf = _accumulate(nf, nlf, lj.residual)
        skips[lj.layer] = (nf, nlf, nn_, nln)
        skips.pop(lj.layer - keep, None)
        # J_R/‖J_R‖_2 = I − VVᵀ: the projection without the rescaling
        r = NormJacobian(torch.ones_like(lj.residual.scale), lj.residual.basis)
        u_proj, l_proj = _accumulate(u_proj, l_proj, r)
    uf, _, un, _ = skips[model.depth]
    return uf, un, u_proj, torch.stack(steps, 1).mean(1)


def _walk_residual(model: ResidualMLP, h0: Tensor, eye: Tensor, zero: Tensor, keep: int,
                   prenorm: bool) -> Tensor:
    """Product ``(E, d, d)`` (``/√d``) of (skip + J) with R = identity; R's op before the
    branch if ``prenorm`` (:func:`projection_split`)."""
    d = h0.shape[-1]
    states = {0: h0}
    prods = {0: (eye / math.sqrt(d), zero)}
    for l, block in enumerate(model.blocks, start=1):
        x = states[l - 1]
        op = model.post_op if prenorm else OWN_PRE
        s, linear = linearize_branch(block, x, pre_op=op)
        if linear is not None:
            jb = linear.dense()
        else:  # torch.func fallback (gated branch)
            from torch.func import functional_call

            def branch(p, xe, b=block, o=op):
                if not prenorm:  # the block's own P, B
                    return functional_call(b, p, (xe,), {"part": "branch"})
                return b.scale * b.out_norm(functional_call(b, p, (NORM_FNS[o](xe),), {"part": "f"}))

            jb = member_jacobian(branch, x, dict(block.named_parameters()))
        u, lg = _accumulate(*prods[l - 1], jb)
        if block.has_skip:
            j = model.skip_source(l)
            u, lg = _add(u, lg, *prods[j])
            s = s + states[j]
        states[l], prods[l] = s, (u, lg)
        states.pop(l - keep, None)
        prods.pop(l - keep, None)
    return prods[model.depth][0]


def _erank_or_nan(u: Tensor, d: int) -> Tensor:
    """``erank(u)/d`` per member of ``u`` ``(E, d, d)``; NaN where ``u`` is not finite."""
    e = u.shape[0]
    out = torch.full((e,), math.nan, dtype=u.dtype, device=u.device)
    ok = torch.isfinite(u).all(-1).all(-1)
    if ok.any():
        out[ok] = erank_from_sv(singular_values(u[ok])) / d
    return out


def _add(u1: Tensor, l1: Tensor, u2: Tensor, l2: Tensor) -> tuple[Tensor, Tensor]:
    """``e^{l1} u1 + e^{l2} u2`` in unit-Frobenius + ln-norm form."""
    top = torch.maximum(l1, l2)
    # relative weights below e^−80 are flushed to 0 (no subnormals, which slow the CPU)
    w1, w2 = ((v - top).clamp(min=-80.0).exp() * (v - top > -80.0) for v in (l1, l2))
    acc = u1 * w1[:, None, None] + u2 * w2[:, None, None]
    norm = torch.linalg.matrix_norm(acc)
    return acc / norm[:, None, None], top + norm.log()


def probe_projection_split(ctx: ProbeContext) -> Measurement:
    """Rank removed by a post-residual norm: rescaling vs projection (Figure 4c, Table 3).

    Scalars (per seed mean/std, units of d): see :func:`projection_split`, plus
    ``erank_projection_product_rw``: erank/d of the random-walk projection product
    (:func:`rankexp.theory.random_walk_projection_product`) with the same d, L and the
    measured ``projection_step``, seeded 0 — the reference the measured
    ``erank_projection_product`` is compared with.

    For placements other than ``post`` there is no post-residual norm: the probe returns
    nothing (and logs that), so it can stay in a sweep across placements.
    """
    model = ctx.model
    if model.post_op is None:
        log.info(
            "projection_split: placement=%s has no post-residual op R; skipped", model.placement
        )
        return Measurement()
    out = projection_split(model, ctx.h0)
    m = Measurement()
    for k, v in out.items():
        m.add_seed_stat(k, v)
    return m


def reduce_projection_split(m: Measurement, ctx: ProbeContext) -> None:
    """Pooled over seeds: the random-walk reference at the seeds' mean ``projection_step``."""
    if "projection_step" not in m.arrays:  # not a post-norm network: nothing was measured
        return
    sv = random_walk_projection_product(
        ctx.width, ctx.model.depth, float(m.arrays["projection_step"].mean()), seed=0
    )
    p = sv / sv.sum()
    p = p[p > 0]
    m.scalars["erank_projection_product_rw"] = float(np.exp(-(p * np.log(p)).sum())) / ctx.width


