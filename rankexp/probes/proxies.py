"""Zero-cost proxies of the NAS literature, measured at initialization beside the study's ranks.

* ``grad_norm_proxy`` — ``Σ_l ‖∂ℓ/∂W_l‖_F`` over every weight matrix of the network (Abdelfattah
  et al. 2021, "Zero-Cost Proxies for Lightweight NAS"), for the random-readout loss of the
  ``gradient_norms`` probe (:func:`~rankexp.probes.gradients.weight_gradient_norms`).
* ``jacob_cov`` — Mellor et al. 2021, "Neural Architecture Search without Training" (v1): the
  per-input Jacobians ``g_i = ∂(1ᵀ f(x_i))/∂x_i`` over a batch, the eigenvalues ``σ_i`` of their
  correlation matrix, score ``−Σ_i [log(σ_i + k) + 1/(σ_i + k)]``, k = 1e−5 (higher: less
  correlated Jacobians).
* ``synflow`` — Tanaka et al. 2020, "Pruning neural networks without any data by iteratively
  conserving synaptic flow": parameters replaced by ``|θ|``, an all-ones input, ``R = 1ᵀ f(1)``
  (``1ᵀ(Π_l |W_l|)1`` for a linear chain), score ``Σ_θ |θ ⊙ ∂R/∂θ|``; computed in float64 and
  logged as its natural log (``log_synflow``): at depth the product overflows any float32.

They run on the measure task's Gaussian inputs (each member's ``STREAM_INPUT`` and
``STREAM_HEAD``), so under ``task=train`` (:data:`rankexp.probes.INIT_PROBES`) they are measured
on the initial network by the very run that trains it.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from ..result import Measurement
from ..seeding import gaussian_input
from .base import ProbeContext
from .catalog import GRAD_NORM_PROXY_OPTIONS, JACOB_COV_OPTIONS
from .gradients import _where, random_readout, weight_gradient_norms


def weight_matrices(model) -> list[Tensor]:
    """Every weight matrix of the network: its parameters ``(E, out, in)`` (biases and norm
    gains, one axis fewer, are left out)."""
    return [p for p in model.parameters() if p.dim() == 3]


def probe_grad_norm_proxy(ctx: ProbeContext) -> Measurement:
    """Zero-cost proxy grad_norm: the sum over every weight matrix of ``‖∂ℓ/∂W‖_F`` at init.

    Options (``task.options.grad_norm_proxy``): ``batch`` Gaussian inputs per member (128).
    ``ℓ = (1/B) Σ_b g_b vᵀ h_L^{(b)}``, the random readout of the ``gradient_norms`` probe
    (:func:`~rankexp.probes.gradients.weight_gradient_norms`).  Scalar ``grad_norm_proxy``
    (Abdelfattah et al. 2021).
    """
    opt = ctx.probe_options("grad_norm_proxy", GRAD_NORM_PROXY_OPTIONS)
    model, b = ctx.model, int(opt["batch"])
    where = _where(model)
    h0 = gaussian_input(model.seeds, model.width, batch=b, **where)
    v, g = random_readout(model.seeds, model.width, b, **where)
    norms = weight_gradient_norms(model, h0, v, g, weights=weight_matrices(model)).detach()
    m = Measurement()
    m.add_seed_stat("grad_norm_proxy", norms.sum(1))
    return m


def jacob_cov_score(jac: Tensor, k: float = 1e-5) -> Tensor:
    """Mellor et al. (2021, v1)'s score of per-input Jacobians ``jac`` ``(E, N, d)``: ``(E,)``
    values ``−Σ_i [log(σ_i + k) + 1/(σ_i + k)]``, σ_i the eigenvalues of the N × N correlation
    matrix of the N rows (``numpy.corrcoef`` of each member's rows, in float64).

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
    """``∂(1ᵀ f(x_i))/∂x_i`` for every input of the batch ``x`` ``(E, N, d)`` → ``(E, N, d)``: one
    backward of the summed output (Mellor et al.'s ``y.backward(ones)``; batch statistics of a
    batchnorm are differentiated through)."""
    with torch.enable_grad():
        xs = x.detach().clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(model(xs).sum(), xs)
    return grad


def probe_jacob_cov(ctx: ProbeContext) -> Measurement:
    """Zero-cost proxy jacob_cov: correlation of per-input Jacobians over a batch (Mellor et al. 2021).

    Options (``task.options.jacob_cov``): ``batch`` N Gaussian inputs per member (128), ``k``
    (1e−5).  Scalar ``jacob_cov`` (:func:`jacob_cov_score` of :func:`input_jacobians`); NaN
    where a Jacobian is constant across its d entries (a dead network).
    """
    opt = ctx.probe_options("jacob_cov", JACOB_COV_OPTIONS)
    model = ctx.model
    x = gaussian_input(model.seeds, model.width, batch=int(opt["batch"]), **_where(model))
    m = Measurement()
    m.add_seed_stat("jacob_cov", jacob_cov_score(input_jacobians(model, x), float(opt["k"])))
    return m


def log_synflow(model) -> Tensor:
    """``log Σ_θ |θ ⊙ ∂R/∂θ|`` per member ``(E,)`` with ``R = 1ᵀ f_{|θ|}(1)`` (Tanaka et al.
    2020): a float64 copy of ``model`` with every parameter replaced by its absolute value, one
    all-ones input ``(E, 1, d)`` per member.  ``+inf`` where the float64 forward overflows.
    The model itself is not changed."""
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
    """Zero-cost proxy synflow: log of Σ|θ ⊙ ∂R/∂θ| on |θ| and an all-ones input (Tanaka et al. 2020).

    Scalar ``log_synflow`` (natural log, float64; :func:`log_synflow`).
    """
    m = Measurement()
    m.add_seed_stat("log_synflow", log_synflow(ctx.model).to(torch.float64))
    return m


__all__ = ["input_jacobians", "jacob_cov_score", "log_synflow", "probe_grad_norm_proxy",
           "probe_jacob_cov", "probe_synflow", "weight_matrices"]
