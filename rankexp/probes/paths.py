"""Path-order decomposition of the input–output Jacobian (Eq. 5/11/12).

``∂h_L/∂h_0 = Π (I + β J_m) = Σ_k β^k S_k`` by the dynamic program of Eq. 12 on the scaled
``J_b = β J_m`` (so ``T_k = β^k S_k``, also at β = 0); Post-Norm lets the skip path carry ``J_R``
(Eq. 18), spaced skips are refused. Each ``T_k`` is a unit-Frobenius matrix plus its ln-norm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..models.mlp import ResidualMLP
from ..models.norms import NormJacobian
from ..result import Measurement
from ..theory import uncorrelated_path_profile
from .base import ProbeContext
from .jacobian import LayerJacobian, layer_jacobians, renormalize, weight

#: ln of a zero norm is clamped here in logged series (below float64's smallest subnormal).
LOG_ZERO = -746.0


@dataclass
class PathOrders:
    """Path-order terms ``T_k = β^k S_k`` of ``∂h_L/∂h_0`` (Eq. 11): ``units`` ``(E, K+1, d, d)`` unit-Frobenius,
    ``log_mu`` ``(E, K+1)`` ``ln ‖T_k‖_F``; ``complete``: K = L.
    """

    units: Tensor
    log_mu: Tensor
    beta: float
    complete: bool

    def profile(self, power: int = 1) -> Tensor:
        """Normalized profile ``μ_k^power / Σ_j μ_j^power`` ``(E, K+1)`` (power 2: energy)."""
        return torch.softmax(power * self.log_mu, dim=1)

    def mean_order(self, power: int = 1) -> Tensor:
        """Mean path order ``⟨k⟩ = Σ_k k · profile_k`` ``(E,)``."""
        k = torch.arange(self.log_mu.shape[1], dtype=self.log_mu.dtype, device=self.log_mu.device)
        return (self.profile(power) * k).sum(1)

    def log_s_norm(self) -> Tensor:
        """``ln ‖S_k‖_F = ln μ_k − k ln β`` ``(E, K+1)`` (requires β > 0)."""
        k = torch.arange(self.log_mu.shape[1], dtype=self.log_mu.dtype, device=self.log_mu.device)
        return self.log_mu - k * math.log(self.beta)

    def reconstruct(self) -> tuple[Tensor, Tensor]:
        """``Σ_k β^k S_k`` as (unit-Frobenius ``(E, d, d)``, ln-norm ``(E,)``); ``∂h_L/∂h_0`` when :attr:`complete`."""
        top = self.log_mu.amax(1)
        return renormalize(torch.einsum("ek,ekij->eij", weight(self.log_mu - top[:, None]),
                                        self.units), top)


class PathOrderDP:
    """The dynamic program of Eq. 12 in log-norm form, fed one block at a time; orders above
    ``max_order`` are not formed, ``chunk`` consecutive orders are one GEMM per member
    (memory ``E·(K+1)·d²``).
    """

    def __init__(self, members: int, width: int, max_order: int, *, chunk: int = 64,
                 dtype=torch.float64, device="cpu"):
        if max_order < 0:
            raise ValueError(f"max_order={max_order} must be ≥ 0")
        if chunk < 1:
            raise ValueError(f"chunk={chunk} must be ≥ 1")
        e, d, k = members, width, max_order
        self.chunk, self.max_order, self.layers_seen = chunk, k, 0
        self.terms = torch.zeros(e, d, k + 1, d, dtype=dtype, device=device)
        self.terms[:, :, 0, :] = torch.eye(d, dtype=dtype, device=device) / math.sqrt(d)
        self.log_mu = torch.full((e, k + 1), -math.inf, dtype=dtype, device=device)
        self.log_mu[:, 0] = 0.5 * math.log(d)

    def _block(self, lo: int, hi: int) -> Tensor:
        """Orders ``lo…hi−1`` as one ``(E, d, (hi−lo)·d)`` matrix view (no copy)."""
        e, d = self.terms.shape[:2]
        return self.terms[:, :, lo:hi, :].view(e, d, (hi - lo) * d)

    def _store(self, acc: Tensor, top: Tensor, lo: int, hi: int) -> None:
        """Normalize ``acc`` ``(E, d, n, d)`` per order and write it to orders ``lo…hi−1``."""
        norm = acc.square().sum((1, 3)).sqrt()  # (E, n)
        ok = norm > 0
        scale = torch.where(ok, 1.0 / torch.where(ok, norm, 1), 0)
        self.terms[:, :, lo:hi, :] = acc * scale[:, None, :, None]
        self.log_mu[:, lo:hi] = torch.where(
            ok, top + torch.log(torch.where(ok, norm, 1)), -math.inf)

    def step(self, branch: Tensor, residual_norm: NormJacobian | Tensor | None = None) -> None:
        """Apply block m: ``T_k ← J_R (T_k + J_b T_{k−1})`` for k = min(m, K)…1, then ``T_0 ← J_R T_0``
        (``residual_norm`` ``J_R``: closed form, dense or ``None``).
        """
        self.layers_seen += 1
        e, d = self.terms.shape[:2]
        hi = min(self.layers_seen, self.max_order)
        # descending runs of orders [lo, hi]; each reads T_{lo−1…hi−1} before they change
        while hi >= 1:
            lo = max(1, hi - self.chunk + 1)
            n = hi - lo + 1
            prev_log, cur_log = self.log_mu[:, lo - 1 : hi], self.log_mu[:, lo : hi + 1]
            top = torch.maximum(prev_log, cur_log)
            top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
            acc = (branch @ self._block(lo - 1, hi)).view(e, d, n, d)
            acc *= weight(prev_log - top)[:, None, :, None]
            acc += weight(cur_log - top)[:, None, :, None] * self.terms[:, :, lo : hi + 1, :]
            if residual_norm is not None:
                acc = _left(residual_norm, acc.view(e, d, n * d)).view(e, d, n, d)
            self._store(acc, top, lo, hi + 1)
            hi = lo - 1
        if residual_norm is not None:
            acc = _left(residual_norm, self._block(0, 1).clone()).view(e, d, 1, d)
            self._store(acc, self.log_mu[:, :1].clone(), 0, 1)

    def result(self, beta: float, depth: int) -> PathOrders:
        return PathOrders(self.terms.permute(0, 2, 1, 3), self.log_mu, beta,
                          complete=self.max_order >= depth)


def _left(j: NormJacobian | Tensor, a: Tensor) -> Tensor:
    """``J a`` for ``a`` ``(E, d, n)``: in place for a closed form, one product for a dense J."""
    return j.left_(a) if isinstance(j, NormJacobian) else j @ a


def _dp(model: ResidualMLP, h0: Tensor, max_order: int | None, chunk: int) -> PathOrderDP:
    if model.skip_every != 1:
        raise ValueError(f"path-order decomposition (Eq. 12) needs an identity skip on every "
                         f"block; skip_every={model.skip_every} is not supported (use skip_every=1)")
    k = model.depth if max_order is None else min(int(max_order), model.depth)
    return PathOrderDP(h0.shape[0], h0.shape[-1], k, chunk=int(chunk), dtype=h0.dtype,
                       device=h0.device)


def path_orders(model: ResidualMLP, h0: Tensor, *, max_order: int | None = None, chunk: int = 64
                ) -> PathOrders:
    """``∂h_L/∂h_0 = Σ_k β^k S_k`` (Eq. 11) by the dynamic program of Eq. 12, from ``h0`` ``(E, 1, d)``.

    Raises:
        ValueError: ``skip_every ≠ 1`` or ``max_order < 0``.
    """
    dp = _dp(model, h0, max_order, chunk)
    with torch.no_grad():
        for lj in layer_jacobians(model, h0):
            dp.step(lj.branch, lj.residual)
    return dp.result(model.beta_eff, model.depth)


class PathOrderFold:
    """The dynamic program as a layer fold of the shared sweep (``needs`` name ``path_orders``)."""

    def __init__(self, ctx: ProbeContext):
        opt = ctx.probe_options("path_order")
        self.model, self.dp = ctx.model, _dp(ctx.model, ctx.h0, opt["max_order"], opt["chunk"])

    def step(self, lj: LayerJacobian) -> None:
        self.dp.step(lj.branch, lj.residual)

    def result(self) -> PathOrders:
        return self.dp.result(self.model.beta_eff, self.model.depth)


def probe_path_order(ctx: ProbeContext) -> Measurement:
    """Path-order profile of ``∂h_L/∂h_0`` (Eq. 5/11/12; Figure 3), step = path order k.

    Options ``max_order``, ``chunk``. ``mean_path_order_uncorrelated``: Poisson-binomial with
    ρ_l = r_l² (Eq. 4); ``path_reconstruction_error``: relative, against the forward sweep.
    """
    model, po, sw = ctx.model, ctx.fold("path_orders"), ctx.sweep  # the fold checks the options
    m = Measurement()
    orders = np.arange(po.log_mu.shape[1])
    m.add_seed_series("path_log_mu", po.log_mu.clamp(min=LOG_ZERO), orders)
    m.add_seed_series("path_profile", po.profile(), orders)
    m.add_seed_stat("mean_path_order", po.mean_order())
    m.add_seed_stat("mean_path_order_energy", po.mean_order(power=2))
    m.add_seed_stat("path_order_peak", po.log_mu.argmax(1).to(po.log_mu.dtype))
    rho = sw.branch_ratio.square().double().cpu().numpy()
    k_axis = np.arange(model.depth + 1)
    m.add_seed_stat(
        "mean_path_order_uncorrelated",
        torch.tensor([float((uncorrelated_path_profile(r) * k_axis).sum()) for r in rho]))
    unit, log = po.reconstruct()
    io_log = sw.log_gain[:, -1]
    err = torch.linalg.matrix_norm(unit * torch.exp(log - io_log)[:, None, None] - sw.io_unit)
    m.add_seed_stat("path_reconstruction_error", err)
    return m
