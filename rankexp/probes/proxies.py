"""Zero-cost NAS proxies at initialization beside the study's ranks: grad_norm (Abdelfattah et
al. 2021), jacob_cov (Mellor et al. 2021, v1) and synflow (Tanaka et al. 2020, logged as its
natural log in float64).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from ..result import Measurement
from ..seeding import gaussian_input
from .base import ProbeContext
from .gradients import _where, weight_gradient_norms


def probe_grad_norm_proxy(ctx: ProbeContext) -> Measurement:
    """Zero-cost proxy grad_norm: the sum over every weight matrix of ``‖∂ℓ/∂W‖_F`` at init.

    The loss of the ``gradient_norms`` probe (option ``batch``; Abdelfattah et al. 2021)."""
    opt = ctx.probe_options("grad_norm_proxy")
    weights = [p for p in ctx.model.parameters() if p.dim() == 3]  # every (E, out, in) matrix
    norms = weight_gradient_norms(ctx.model, int(opt["batch"]), weights).detach()
    m = Measurement()
    m.add_seed_stat("grad_norm_proxy", norms.sum(1))
    return m


def jacob_cov_score(jac: Tensor, k: float = 1e-5) -> Tensor:
    """Mellor et al.'s score ``(E,)`` of per-input Jacobians ``(E, N, d)`` (float64 correlation of the rows).

    Raises:
        ValueError: fewer than 2 rows.
    """
    if jac.shape[-2] < 2:
        raise ValueError(f"jacob_cov needs at least 2 inputs, got {jac.shape[-2]}")
    x = jac.detach().double()
    x = x - x.mean(-1, keepdim=True)
    cov = x @ x.mT
    sd = torch.diagonal(cov, dim1=-2, dim2=-1).sqrt()
    corr = cov / (sd[..., :, None] * sd[..., None, :])
    sigma = torch.linalg.eigvalsh(corr)
    return -(torch.log(sigma + k) + 1.0 / (sigma + k)).sum(-1)


def input_jacobians(model, x: Tensor) -> Tensor:
    """``∂(1ᵀ f(x_i))/∂x_i`` ``(E, N, d)`` by one backward of the summed output."""
    with torch.enable_grad():
        xs = x.detach().clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(model(xs).sum(), xs)
    return grad


def probe_jacob_cov(ctx: ProbeContext) -> Measurement:
    """Zero-cost proxy jacob_cov: correlation of per-input Jacobians over a batch (Mellor et al. 2021).

    Options ``batch``, ``k``; NaN for a dead network."""
    opt = ctx.probe_options("jacob_cov")
    model = ctx.model
    x = gaussian_input(model.seeds, model.width, batch=int(opt["batch"]), **_where(model))
    m = Measurement()
    m.add_seed_stat("jacob_cov", jacob_cov_score(input_jacobians(model, x), float(opt["k"])))
    return m


def log_synflow(model) -> Tensor:
    """``log Σ_θ |θ ⊙ ∂R/∂θ|`` ``(E,)`` on a float64 ``|θ|`` copy (+inf on overflow); the model is unchanged."""
    net = copy.deepcopy(model).double()
    with torch.no_grad():
        for p in net.parameters():
            p.abs_()
    params = [p for p in net.parameters() if p.requires_grad]
    with torch.enable_grad():
        ones = torch.ones(len(model.seeds), 1, model.width, dtype=torch.float64,
                          device=params[0].device)
        grads = torch.autograd.grad(net(ones).sum(), params)
    score = sum((p * g).abs().flatten(1).sum(1) for p, g in zip(params, grads, strict=True))
    return torch.log(score.detach().nan_to_num(nan=torch.inf))


def probe_synflow(ctx: ProbeContext) -> Measurement:
    """Zero-cost proxy synflow: log of Σ|θ ⊙ ∂R/∂θ| on |θ| and an all-ones input (Tanaka et al. 2020)."""
    m = Measurement()
    m.add_seed_stat("log_synflow", log_synflow(ctx.model).to(torch.float64))
    return m
