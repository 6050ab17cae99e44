"""Plain mean-field networks of the textbook chapter (215), ensemble-native::

    h_l = W_l φ(N(h_{l−1})) + b_l                         (plain, skip_every = 0; 215.1–215.3)
    h_l = h_{l−1} + β (W_l φ(N(h_{l−1})) + b_l)           (residual, skip_every = 1)

Weights Gaussian ``N(0, σ_w²/n)`` or ``σ_w Q`` (Q Haar), biases ``N(0, σ_b²)``; σ_w is the
``alpha`` knob, σ_b ``bias``; N the identity or a norm op before φ (:func:`batchnorm` too).
``h_0`` is the zeroth preactivation, so every layer is the same map (∂h_L/∂h_0 = Π_l W_l
D_{l−1}, 215.7).  Parameters carry a leading member axis E; each layer has the ``Block``
interface of :class:`~rankexp.models.mlp.ResidualMLP`, so the per-sample probes run on it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..seeding import normal_many_
from .mlp import Layer, Stack
from .norms import NORM_FNS
from .norms import identity as _identity
from .spec import nominal_ratio

INITS = ("gaussian", "orthogonal")
#: norm ops a plain network accepts before φ (``norm=pre``)
PLAIN_NORM_OPS = (*NORM_FNS, "batchnorm")
BN_EPS = 1e-5  # as torch.nn.BatchNorm1d

__all__ = ["BN_EPS", "INITS", "PLAIN_NORM_OPS", "PlainLayer", "PlainNet", "batchnorm",
           "haar_orthogonal"]


def batchnorm(x: Tensor, *, detach_stats: bool = False) -> Tensor:
    """Batch normalization at gain 1, no shift: ``(x − mean_B x) / sqrt(var_B x + ε)`` per
    feature over axis −2 of ``x`` ``(..., B, n)``, biased variance, ε = :data:`BN_EPS`;
    ``detach_stats``: the batch statistics are constants in autograd (the ``shattered`` probe).

    Raises:
        ValueError: no batch axis, or a batch of one (its statistics are degenerate).
    """
    if x.dim() < 2 or x.shape[-2] < 2:
        raise ValueError(
            f"batchnorm normalizes over a batch of inputs (…, B ≥ 2, n); got shape "
            f"{tuple(x.shape)} — probes that differentiate one input at a time "
            "(io_jacobian, profile, jacobian_spectrum) cannot run on batch-normalized networks")
    mean = x.mean(-2, keepdim=True)
    var = x.var(-2, unbiased=False, keepdim=True)
    if detach_stats:
        mean, var = mean.detach(), var.detach()
    return (x - mean) / torch.sqrt(var + BN_EPS)


def haar_orthogonal(g: Tensor) -> Tensor:
    """Haar-distributed orthogonal matrices ``(…, n, n)`` from square Gaussian draws ``g``:
    ``g = QR``, column j of Q times ``sign(R_jj)`` (Mezzadri 2007)."""
    q, r = torch.linalg.qr(g)
    diag = torch.diagonal(r, dim1=-2, dim2=-1)  # (…, n): batched over members
    return q * torch.sign(diag).where(diag != 0, 1.0).unsqueeze(-2)


class PlainLayer(Layer):
    """One layer ``h_l = [skip +] g · (W φ(N(x)) + b)`` for E members; g = β on a skip layer, else 1.

    Parameters ``w`` ``(E, n, n)`` and ``b`` ``(E, n)``.  ``branch(x)`` is the scaled term
    ``g (W φ(N(x)) + b)``; ``forward(x, skip)`` adds ``skip`` when given.
    """

    def __init__(self, width: int, *, activation: str, norm_op: str | None, beta: float,
                 has_skip: bool, members: int, dtype: torch.dtype = torch.float64,
                 device: str | torch.device = "cpu"):
        if norm_op is not None and norm_op not in PLAIN_NORM_OPS:
            raise ValueError(f"norm_op={norm_op!r} is not one of {', '.join(PLAIN_NORM_OPS)}")
        super().__init__(width, activation, beta, has_skip)
        self.hidden, self.norm_op, self.res_norm = width, norm_op, _identity
        # allocated where they live; PlainNet draws them there, in their dtype
        self.w = nn.Parameter(torch.empty(members, width, width, dtype=dtype, device=device))
        self.b = nn.Parameter(torch.empty(members, width, dtype=dtype, device=device))

    def normalize(self, x: Tensor, *, detach_stats: bool = False) -> Tensor:
        """``N(x)``: the identity, a per-sample norm op, or :func:`batchnorm`."""
        if self.norm_op is None:
            return x
        if self.norm_op == "batchnorm":
            return batchnorm(x, detach_stats=detach_stats)
        return NORM_FNS[self.norm_op](x)

    def branch(self, x: Tensor, *, detach_stats: bool = False) -> Tensor:
        """``g (W φ(N(x)) + b)``, ``(E, B, n)`` (or ``(n,)`` per member under ``vmap``)."""
        u = self.sigma(self.normalize(x, detach_stats=detach_stats))
        # b is (E, n); under vmap over members it is (n,) and broadcasts as it is
        b = self.b.unsqueeze(-2) if self.b.dim() == 2 else self.b
        return self.scale * (torch.matmul(u, self.w.mT) + b)

    def forward(self, x: Tensor, skip: Tensor | None = None, *, part: str = "block",
                detach_stats: bool = False) -> Tensor:
        """``skip + branch(x)`` (``skip`` is ``None`` on a plain layer); ``part="branch"``
        returns :meth:`branch` alone (the ``Block`` interface of the residual MLP)."""
        s = self.branch(x, detach_stats=detach_stats)
        if part == "branch" or skip is None:
            return s
        return skip + s


class PlainNet(Stack):
    """A depth-L plain (or residual) mean-field network on width n (the chapter, 215).

    Args:
        width, depth: n (every layer n → n), L ≥ 1.  activation: φ (not swiglu).
        alpha: σ_w > 0.  bias: σ_b ≥ 0 (drawn even at σ_b = 0: a σ_b sweep shares its numbers).
        init: of :data:`INITS`.  norm_op: ``None`` or one of :data:`PLAIN_NORM_OPS`, before φ.
        beta, beta_scaling: the residual layers' branch gain β and its depth scaling.
        skip_every: identity skip every k layers from ``h_{l−k}``; 0 = plain (default).
        seeds: one per member; W_l and b_l are draws 2(l−1) and 2l−1 of the seed.

    Shapes: ``forward`` maps ``(E, B, n) → (E, B, n)`` with E = ``len(seeds)``.

    Raises:
        ValueError: a size < 1, σ_w ≤ 0, σ_b < 0, unknown init / norm op, or swiglu.
    """

    matrices = 1  # one n×n matrix per layer (the Block interface of the study's MLP)

    def __init__(
        self,
        width: int = 256,
        depth: int = 48,
        *,
        activation: str = "tanh",
        alpha: float = 1.0,
        bias: float = 0.0,
        init: str = "gaussian",
        norm_op: str | None = None,
        beta: float = 1.0,
        beta_scaling: str = "const",
        skip_every: int = 0,
        seeds: Sequence[int] = (0,),
        dtype: torch.dtype = torch.float64,
        device: str | torch.device = "cpu",
    ):
        super().__init__(width, depth, alpha=alpha, beta=beta, beta_scaling=beta_scaling,
                         skip_every=skip_every, seeds=seeds)
        if not bias >= 0:
            raise ValueError(f"bias (σ_b) = {bias} must be ≥ 0")
        if init not in INITS:
            raise ValueError(f"init={init!r} is not one of {', '.join(INITS)}")
        if activation == "swiglu":
            raise ValueError("activation='swiglu' is a gated two-matrix branch (model=mlp)")
        self.sigma_b, self.init = float(bias), init
        self.activation, self.norm_op = activation, norm_op
        self.placement = "none" if norm_op is None else "pre"
        self.blocks = nn.ModuleList(
            PlainLayer(width, activation=activation, norm_op=norm_op, beta=self.beta_eff,
                       has_skip=self.has_skip(l), members=len(self.seeds), dtype=dtype,
                       device=device)
            for l in range(1, depth + 1)
        )
        self.reset_parameters()

    @property
    def sigma_w(self) -> float:
        return self.alpha

    @property
    def nominal_ratio(self) -> float:
        """β σ_w on residual networks, σ_w on plain ones (the study's βα^M with M = 1)."""
        return nominal_ratio(self.beta_eff if self.skip_every else 1.0, self.alpha, 1)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Draw W_l then b_l for l = 1…L per member from its seed (see the class docstring):
        W ~ N(0, σ_w²/n) or σ_w·Haar (the QR of the same Gaussian numbers), b ~ N(0, σ_b²)."""
        orthogonal = self.init == "orthogonal"
        w_scale = 1.0 if orthogonal else self.alpha / math.sqrt(self.width)
        targets = []
        for i, layer in enumerate(self.blocks):
            targets += [(layer.w.data, 2 * i, w_scale), (layer.b.data, 2 * i + 1, self.sigma_b)]
        normal_many_(targets, self.seeds)
        if orthogonal:
            for layer in self.blocks:
                layer.w.data.copy_(self.alpha * haar_orthogonal(layer.w.data))
