"""Gradient probes of the textbook chapter (science.md §5): the BN paradox, shattered gradients.

* ``gradient_norms`` — per-layer weight-gradient norms ``‖∂ℓ/∂W_l‖_F`` at initialization for
  a random readout on a batch (Yang et al. 2019: batch-normalized plain networks explode
  geometrically toward the input; skips keep the ratio first/last O(1)).
* ``shattered`` — the derivative of a random readout with respect to a scalar input on a grid,
  and its lag-1 autocorrelation along the grid (Balduzzi et al. 2017: ≈ 1 smooth, ≈ 0 white
  noise; plain nets decay like 2^{−L}, residual ones like ((1+β²/2)/(1+β²))^L = (3/4)^L at
  β = 1, batch-normalized residual ones only like 1/√L).

Random readouts and the per-sample loss weights come from each member's ``STREAM_HEAD``,
inputs from its ``STREAM_INPUT``, so a member's numbers do not depend on the other seeds.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor
from torch.func import jvp

from ..result import Measurement
from ..seeding import STREAM_HEAD, STREAM_INPUT, gaussian_input, seeded_generator
from .base import ProbeContext
from .catalog import GRADIENT_NORMS_OPTIONS, SHATTERED_OPTIONS


def _where(model) -> dict:
    p = next(model.parameters())
    return {"dtype": p.dtype, "device": p.device}


def random_readout(seeds, width: int, batch: int, *, dtype=torch.float64, device="cpu"
                   ) -> tuple[Tensor, Tensor]:
    """Readout vectors ``v ~ N(0, I/n)`` ``(E, n)`` and per-sample weights ``g ~ N(0, 1)``
    ``(E, batch)``, drawn in that order from each seed's ``STREAM_HEAD``."""
    vs, gs = [], []
    for s in seeds:
        gen = seeded_generator(s, STREAM_HEAD)
        vs.append(torch.randn(width, generator=gen, dtype=torch.float64) / math.sqrt(width))
        gs.append(torch.randn(batch, generator=gen, dtype=torch.float64))
    return (torch.stack(vs).to(dtype=dtype, device=device),
            torch.stack(gs).to(dtype=dtype, device=device))


def weight_gradient_norms(model, h0: Tensor, v: Tensor, g: Tensor,
                          weights: list[Tensor] | None = None) -> Tensor:
    """``‖∂ℓ/∂W_l‖_F`` for l = 1…L, ``(E, L)``, of ``ℓ = (1/B) Σ_b g_b vᵀ h_L^{(b)}``.

    ``weights``: the ``(E, out, in)`` matrices to differentiate (default: each layer's ``w``;
    the ``grad_norm_proxy`` probe passes every weight matrix, L·M of them).
    ``h0`` ``(E, B, n)``; ``v`` ``(E, n)``; ``g`` ``(E, B)``.  The per-sample weights g make
    the backward signal differ across the batch (a batch-constant one is removed by a
    batchnorm's centring), as the gradient of a loss against random targets does.  Batch
    statistics are differentiated through (training mode).  One backward for all members.
    """
    weights = [layer.w for layer in model.blocks] if weights is None else weights
    with torch.enable_grad():
        out = model(h0)
        loss = ((out @ v[:, :, None])[..., 0] * g).mean(-1).sum()
        grads = torch.autograd.grad(loss, weights)
    return torch.stack([torch.linalg.matrix_norm(gr) for gr in grads], 1)


def probe_gradient_norms(ctx: ProbeContext) -> Measurement:
    """Per-layer weight-gradient norms at initialization for a random readout (BN paradox).

    Options (``task.options.gradient_norms``): ``batch`` Gaussian inputs per member (128).

    Series (step = l): ``grad_norm`` = ‖∂ℓ/∂W_l‖_F (:func:`weight_gradient_norms`).  Scalars:
    ``grad_ratio`` = ‖∂ℓ/∂W_1‖/‖∂ℓ/∂W_L‖ (first over last; ≫ 1 = explosion toward the
    input), ``grad_growth`` = the fitted per-layer factor exp(−slope of ln ‖∂ℓ/∂W_l‖ vs l)
    (> 1: each layer toward the input multiplies the gradient by it).
    """
    opt = ctx.probe_options("gradient_norms", GRADIENT_NORMS_OPTIONS)
    model, b = ctx.model, int(opt["batch"])
    where = _where(model)
    h0 = gaussian_input(model.seeds, model.width, batch=b, **where)
    v, g = random_readout(model.seeds, model.width, b, **where)
    norms = weight_gradient_norms(model, h0, v, g).detach()
    m = Measurement()
    m.add_seed_series("grad_norm", norms, np.arange(1, model.depth + 1))
    m.add_seed_stat("grad_ratio", norms[:, 0] / norms[:, -1])
    logs = norms.double().log().cpu().numpy()
    layers = np.arange(1, logs.shape[1] + 1, dtype=float)
    slope = (np.polyfit(layers, logs.T, 1)[0] if logs.shape[1] > 1 else np.zeros(logs.shape[0]))
    m.add_seed_stat("grad_growth", torch.as_tensor(np.exp(-slope)))
    return m


# --------------------------------------------------------------------------- shattered
def scalar_embedding(seeds, width: int, *, dtype=torch.float64, device="cpu") -> tuple[Tensor, Tensor]:
    """Input layer of the shattered-gradient probe: ``h_0(x) = x w + b``, w, b ~ N(0, I_n).

    A generic line in R^n (not through the origin: with b = 0 a bias-free ReLU network is
    positively homogeneous and its derivative has a single jump at x = 0).  Drawn per member
    from ``STREAM_INPUT``; returns ``(w, b)``, each ``(E, n)``.
    """
    ws, bs = [], []
    for s in seeds:
        gen = seeded_generator(s, STREAM_INPUT)
        ws.append(torch.randn(width, generator=gen, dtype=torch.float64))
        bs.append(torch.randn(width, generator=gen, dtype=torch.float64))
    return (torch.stack(ws).to(dtype=dtype, device=device),
            torch.stack(bs).to(dtype=dtype, device=device))


def lag1_autocorrelation(g: Tensor) -> Tensor:
    """``Σ_i (g_i − ḡ)(g_{i+1} − ḡ) / Σ_i (g_i − ḡ)²`` along the last axis (1 smooth, ≈ 0 noise)."""
    c = g - g.mean(-1, keepdim=True)
    return (c[..., 1:] * c[..., :-1]).sum(-1) / c.square().sum(-1)


def input_gradients(model, x: Tensor, w: Tensor, b: Tensor, v: Tensor) -> Tensor:
    """``d(vᵀ h_l)/dx`` at every grid point and every depth l = 1…L, ``(E, L, P)``.

    One forward-mode pass (``jvp`` with tangent dx = 1 on every point) through
    :meth:`PlainNet.trajectory` with ``detach_stats=True``: batchnorm statistics are those of
    the grid (training mode) but held fixed, so each point's tangent is its own derivative.

    Args:
        x: grid ``(P,)``; w, b: the embedding (:func:`scalar_embedding`); v: readouts ``(E, n)``.
    """
    xs = x.expand(w.shape[0], -1).clone()  # (E, P)

    def readouts(xv):  # (E, P) → (E, L, P): vᵀ h_l at every depth
        h0 = xv[..., None] * w[:, None, :] + b[:, None, :]
        hs = model.trajectory(h0, detach_stats=True)[1:]
        return torch.stack([(h @ v[:, :, None])[..., 0] for h in hs], 1)

    with torch.no_grad():
        return jvp(readouts, (xs,), (torch.ones_like(xs),))[1]


def probe_shattered(ctx: ProbeContext) -> Measurement:
    """Shattered gradients: derivative of a random readout wrt a scalar input on a grid.

    Options (``task.options.shattered``): ``points`` (256), ``lo``/``hi`` (−2, 2).  The grid
    is the batch (batchnorm runs over it); the input layer is :func:`scalar_embedding`; the
    readout is ``vᵀ h_l``, v ~ N(0, I/n).  Every depth l = 1…L is read off the one network
    (the network up to layer l is a depth-l network when β does not depend on L).

    Series (step = l): ``shattered_autocorr`` = lag-1 autocorrelation of ``d(vᵀh_l)/dx`` along
    the grid (seed mean, ``_std``).  Scalar ``shattered_autocorr_final`` (l = L).  Arrays:
    ``shattered_grad`` ``(E, P)`` at l = L, ``shattered_x`` ``(P,)``.
    """
    opt = ctx.probe_options("shattered", SHATTERED_OPTIONS)
    model = ctx.model
    where = _where(model)
    x = torch.linspace(float(opt["lo"]), float(opt["hi"]), int(opt["points"]), **where)
    w, b = scalar_embedding(model.seeds, model.width, **where)
    v, _ = random_readout(model.seeds, model.width, 1, **where)
    grads = input_gradients(model, x, w, b, v)  # (E, L, P)
    ac = lag1_autocorrelation(grads)
    m = Measurement()
    m.add_seed_series("shattered_autocorr", ac, np.arange(1, model.depth + 1))
    m.add_seed_stat("shattered_autocorr_final", ac[:, -1])
    m.arrays["shattered_grad"] = grads[:, -1].double().cpu().numpy()
    m.arrays["shattered_x"] = x.double().cpu().numpy()
    return m
