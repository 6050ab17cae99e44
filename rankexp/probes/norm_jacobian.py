"""Table 2: the Jacobians of the post-residual ops at gain 1, closed form against autograd.

Each op's Jacobian is ``J = c (I − V Vᵀ)`` (:mod:`rankexp.models.norms`): rmsnorm c = √d/‖x‖,
V = x̂; detached c = √d/‖x‖, no V; meansub c = 1, V = 1/√d; layernorm c = √d/‖x−μ‖, V = x̂_c, 1/√d.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..models.norms import NORM_FNS, norm_jacobian
from ..result import Measurement
from .base import ProbeContext


def theory_scale(op: str, x: Tensor) -> Tensor:
    """Table 2's scale c of op at ``x`` ``(E, d)`` → ``(E,)``."""
    d = x.shape[-1]
    if op == "meansub":
        return torch.ones_like(x[:, 0])
    xc = x - x.mean(-1, keepdim=True) if op == "layernorm" else x
    return math.sqrt(d) / torch.linalg.vector_norm(xc, dim=-1)


def autograd_jacobian(op: str, x: Tensor) -> Tensor:
    """``∂ op(x)/∂x`` ``(E, d, d)`` by ``torch.func.jacrev`` of the op itself."""
    fn = NORM_FNS[op]
    return torch.vmap(torch.func.jacrev(lambda v: fn(v[None])[0]))(x)


def removed(j: Tensor, v: Tensor) -> Tensor:
    """``‖J v̂‖ / ‖J‖₂`` per member (0: J removes the direction v)."""
    u = v / torch.linalg.vector_norm(v, dim=-1, keepdim=True)
    return torch.linalg.vector_norm(j @ u[..., None], dim=(-2, -1)) / torch.linalg.matrix_norm(j, ord=2)


def probe_norm_jacobian(ctx: ProbeContext) -> Measurement:
    """Table 2 for the op R (``norm.post``) of the first block.

    At ``x = h_0 + μ·1`` (option ``input_mean``): the closed form against autograd, the directions
    it removes (``‖J v̂‖/‖J‖₂``, 0 = removed), its rank deficit and its scale against Table 2's c
    (ValueError: the first block has no post-residual op).
    """
    op = ctx.model.blocks[0].post_op
    if op is None:
        raise ValueError("norm_jacobian measures the post-residual op R: set norm=post "
                         "norm.op=<rmsnorm|detached|meansub|layernorm> (or norm.post=<op>)")
    opt = ctx.probe_options("norm_jacobian")
    x = ctx.h0[:, 0] + float(opt["input_mean"])
    d = x.shape[-1]
    closed = norm_jacobian(op, x).dense(d)
    auto = autograd_jacobian(op, x)
    sv = torch.linalg.svdvals(closed)
    top = sv[:, :1]
    nonzero = sv > 1e-8 * top
    low = torch.where(nonzero, sv, top).amin(-1)
    c = theory_scale(op, x)
    m = Measurement()
    m.add_seed_stat("jac_autograd_error", torch.linalg.matrix_norm(closed - auto) / torch.linalg.matrix_norm(auto))
    m.add_seed_stat("jac_removes_xhat", removed(closed, x))
    m.add_seed_stat("jac_removes_xhat_c", removed(closed, x - x.mean(-1, keepdim=True)))
    m.add_seed_stat("jac_removes_ones", removed(closed, torch.ones_like(x)))
    m.add_seed_stat("jac_rank_deficit", (d - nonzero.sum(-1)).to(x.dtype))
    m.add_seed_stat("jac_scale", top[:, 0])
    m.add_seed_stat("jac_scale_theory", c)
    m.add_seed_stat("jac_sv_spread", (top[:, 0] - low) / top[:, 0])
    m.add_seed_stat("jac_scale_rms", c * x.square().mean(-1).sqrt())
    return m
