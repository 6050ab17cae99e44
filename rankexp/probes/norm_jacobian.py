"""Table 2: the Jacobians of the post-residual ops at gain 1, closed form against autograd.

Every op of Table 2 has the Jacobian ``J = c (I − V Vᵀ)`` (:mod:`rankexp.models.norms`):

| op        | c          | V (removed directions) |
|-----------|------------|------------------------|
| rmsnorm   | √d/‖x‖     | x̂                      |
| detached  | √d/‖x‖     | — (pure rescaling)     |
| meansub   | 1          | 1/√d (no rescale)      |
| layernorm | √d/‖x−μ‖   | x̂_c, 1/√d              |

The probe ``norm_jacobian`` takes the op R of the network's first block (``norm=post
norm.op=<op>``), evaluates it at one Gaussian input per seed shifted by a nonzero mean (so
x̂ ≠ x̂_c and 1 is not orthogonal to x), and measures what the table states: the closed form's
distance from autograd (``torch.func.jacrev`` of the op itself), the directions it removes
(``‖J x̂‖``, ``‖J 1̂‖`` relative to ``‖J‖₂``), how many it removes (d − numerical rank), and
its scale (the nonzero singular values, all equal to c).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..models.norms import NORM_FNS, norm_jacobian
from ..result import Measurement
from .base import ProbeContext
from .catalog import NORM_JACOBIAN_DEFAULTS


def theory_scale(op: str, x: Tensor) -> Tensor:
    """Table 2's scale c of op at ``x`` ``(E, d)`` → ``(E,)``: √d/‖x‖, 1 (meansub), √d/‖x−μ‖."""
    d = x.shape[-1]
    if op == "meansub":
        return torch.ones_like(x[:, 0])
    xc = x - x.mean(-1, keepdim=True) if op == "layernorm" else x
    return math.sqrt(d) / torch.linalg.vector_norm(xc, dim=-1)


def autograd_jacobian(op: str, x: Tensor) -> Tensor:
    """``∂ op(x)/∂x`` by ``torch.func.jacrev`` of the op itself, per member: ``(E, d, d)``."""
    fn = NORM_FNS[op]
    return torch.vmap(torch.func.jacrev(lambda v: fn(v[None])[0]))(x)


def removed(j: Tensor, v: Tensor) -> Tensor:
    """``‖J v̂‖ / ‖J‖₂`` per member (0: J removes the direction v; 1 for a direction it keeps)."""
    u = v / torch.linalg.vector_norm(v, dim=-1, keepdim=True)
    return torch.linalg.vector_norm(j @ u[..., None], dim=(-2, -1)) / torch.linalg.matrix_norm(j, ord=2)


def probe_norm_jacobian(ctx: ProbeContext) -> Measurement:
    """Table 2 for the op R (``norm.post``) of the first block.

    Options (``task.options.norm_jacobian``): ``input_mean`` μ (default 1): the input is
    ``x = g + μ·1``, g standard Gaussian (the seed's ``h_0``).

    Scalars (mean and ``_std`` over seeds): ``jac_autograd_error`` ‖J_closed − J_autograd‖_F /
    ‖J_autograd‖_F; ``jac_removes_xhat`` ‖J x̂‖/‖J‖₂ and ``jac_removes_xhat_c`` (of x̂_c =
    (x−μ)/‖x−μ‖), ``jac_removes_ones`` ‖J 1̂‖/‖J‖₂ (0 = removed); ``jac_rank_deficit``
    d − rank(J) (singular values ≤ 1e-8 ‖J‖₂); ``jac_scale`` the largest singular value,
    ``jac_scale_theory`` Table 2's c, ``jac_sv_spread`` (σ_max − σ_min over the nonzero
    singular values)/σ_max (0: J is c times a projection); ``jac_scale_rms`` c·rms(x) (1 for
    the rescaling ops, whose c is √d/‖x‖; rms(x) for meansub, which does not rescale).

    Raises:
        ValueError: the first block has no post-residual op (``norm.post=none``).
    """
    op = ctx.model.blocks[0].post_op
    if op is None:
        raise ValueError("norm_jacobian measures the post-residual op R: set norm=post "
                         "norm.op=<rmsnorm|detached|meansub|layernorm> (or norm.post=<op>)")
    opt = ctx.probe_options("norm_jacobian", NORM_JACOBIAN_DEFAULTS)
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


