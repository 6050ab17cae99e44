"""Gradient probes of the chapter: the BN paradox (Yang et al. 2019) and shattered gradients
(Balduzzi et al. 2017). Readouts and loss weights come from each member's ``STREAM_HEAD``,
inputs from its ``STREAM_INPUT``.
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


def _where(model) -> dict:
    p = next(model.parameters())
    return {"dtype": p.dtype, "device": p.device}


def _normal_rows(seeds, stream: int, *sizes: int) -> list[Tensor]:
    """Per size, ``(E, size)`` standard normal float64 draws, in order from each seed's ``stream``."""
    gens = [seeded_generator(s, stream) for s in seeds]
    return [torch.stack([torch.randn(k, generator=g, dtype=torch.float64) for g in gens])
            for k in sizes]


def random_readout(seeds, width: int, batch: int, *, dtype=torch.float64, device="cpu"
                   ) -> tuple[Tensor, Tensor]:
    """Readouts ``v ~ N(0, I/n)`` ``(E, n)`` and sample weights ``g ~ N(0, 1)`` ``(E, batch)`` from each seed's ``STREAM_HEAD``."""
    v, g = _normal_rows(seeds, STREAM_HEAD, width, batch)
    return (v / math.sqrt(width)).to(dtype=dtype, device=device), g.to(dtype=dtype, device=device)


def weight_gradient_norms(model, batch: int, weights: list[Tensor] | None = None) -> Tensor:
    """``‖∂ℓ/∂W_l‖_F`` ``(E, L)`` of ``ℓ = (1/B) Σ_b g_b vᵀ h_L^{(b)}`` (one backward, training mode).

    ``h0`` ``(E, B, n)`` Gaussian, ``v`` ``(E, n)``, ``g`` ``(E, B)`` of :func:`random_readout`
    (per-sample weights survive a batchnorm's centring); ``weights``: the ``(E, out, in)``
    matrices (default each layer's ``w``).
    """
    weights = [layer.w for layer in model.blocks] if weights is None else weights
    h0 = gaussian_input(model.seeds, model.width, batch=batch, **_where(model))
    v, g = random_readout(model.seeds, model.width, batch, **_where(model))
    with torch.enable_grad():
        out = model(h0)
        loss = ((out @ v[:, :, None])[..., 0] * g).mean(-1).sum()
        grads = torch.autograd.grad(loss, weights)
    return torch.stack([torch.linalg.matrix_norm(gr) for gr in grads], 1)


def probe_gradient_norms(ctx: ProbeContext) -> Measurement:
    """Per-layer weight-gradient norms at initialization for a random readout (BN paradox).

    Option ``batch``. Series ``grad_norm`` (:func:`weight_gradient_norms`); scalars ``grad_ratio``
    (first/last) and ``grad_growth`` (fitted per-layer factor toward the input).
    """
    opt = ctx.probe_options("gradient_norms")
    model = ctx.model
    norms = weight_gradient_norms(model, int(opt["batch"])).detach()
    m = Measurement()
    m.add_seed_series("grad_norm", norms, np.arange(1, model.depth + 1))
    m.add_seed_stat("grad_ratio", norms[:, 0] / norms[:, -1])
    logs = norms.double().log().cpu().numpy()
    layers = np.arange(1, logs.shape[1] + 1, dtype=float)
    slope = (np.polyfit(layers, logs.T, 1)[0] if logs.shape[1] > 1 else np.zeros(logs.shape[0]))
    m.add_seed_stat("grad_growth", torch.as_tensor(np.exp(-slope)))
    return m


def scalar_embedding(seeds, width: int, *, dtype=torch.float64, device="cpu") -> tuple[Tensor, Tensor]:
    """``(w, b)`` ``(E, n)`` of the input line ``h_0(x) = x w + b``, w, b ~ N(0, I_n) from ``STREAM_INPUT``
    (b ≠ 0: a bias-free ReLU network is homogeneous through the origin).
    """
    w, b = _normal_rows(seeds, STREAM_INPUT, width, width)
    return w.to(dtype=dtype, device=device), b.to(dtype=dtype, device=device)


def lag1_autocorrelation(g: Tensor) -> Tensor:
    """Lag-1 autocorrelation along the last axis (1 smooth, ≈ 0 noise)."""
    c = g - g.mean(-1, keepdim=True)
    return (c[..., 1:] * c[..., :-1]).sum(-1) / c.square().sum(-1)


def input_gradients(model, x: Tensor, w: Tensor, b: Tensor, v: Tensor) -> Tensor:
    """``d(vᵀ h_l)/dx`` ``(E, L, P)`` at every grid point ``x`` ``(P,)`` and depth, by one ``jvp``
    (batchnorm statistics of the grid, held fixed: ``detach_stats=True``).
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

    Options ``points``, ``lo``, ``hi`` (the grid is the batch).
    """
    opt = ctx.probe_options("shattered")
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
