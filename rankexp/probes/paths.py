"""Path-order decomposition of the input–output Jacobian (Eq. 5/11/12).

For a residual stack with identity skips on every block,

    ∂h_L/∂h_0 = Π_{m=1}^{L} (I + β J_m) = Σ_{k=0}^{L} β^k S_k            (Eq. 5/11)

where ``S_k`` sums the products of the k branch Jacobians ``J_m`` of every
path that passes through exactly k branches.  The dynamic program

    S_k^{(m)} = S_k^{(m−1)} + J_m S_{k−1}^{(m−1)},   S_0^{(0)} = I         (Eq. 12)

builds every ``S_k`` in O(L²) matrix products.  We run it on the *scaled*
branch Jacobians ``β J_m = J_b`` (what :func:`rankexp.probes.jacobian.layer_jacobians`
yields, norm ops included), so it produces ``T_k = β^k S_k`` directly and
works at β = 0; ``ln ‖S_k‖_F = ln μ_k − k ln β``.

What ``J_m`` is per placement (R = post-residual norm, Eq. 17/18):

* pre / output / peri / none: R = identity, block Jacobian ``I + J_b`` with
  ``J_b = ∂[β B(f(P(h)))]/∂h`` at the forward activation — exactly Eq. 11/12.
* post: the block Jacobian ``J_R (I + J_b)`` (Eq. 18) is not of the form
  ``I + βJ``.  We keep k = *number of branches a path traverses* and let the
  skip path carry ``J_R``: ``T_k^{(m)} = J_R (T_k^{(m−1)} + J_b T_{k−1}^{(m−1)})``.
  This reduces to Eq. 12 when ``J_R = I`` and still sums exactly to
  ``∂h_L/∂h_0``; it costs one more product per order.
* spaced skips (``skip_every ≠ 1``) and plain MLPs have no per-block
  ``skip + branch`` structure: :class:`ValueError`.

Magnitudes ``μ_k = ‖β^k S_k‖_F`` span hundreds of decades at L = 384, so each
``T_k`` is stored as a unit-Frobenius matrix plus its natural-log norm.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..models.mlp import ResidualMLP
from ..models.norms import NormJacobian
from ..result import Measurement
from ..theory import uncorrelated_path_profile
from .base import ProbeContext
from .catalog import PATH_ORDER_OPTIONS
from .jacobian import LayerJacobian, layer_jacobians

#: ln of a zero norm is clamped here in logged series (below float64's smallest subnormal).
LOG_ZERO = -746.0


#: Relative weights below e^CUTOFF (≈ 2e−35, far below float64's 1e−16) are set to 0: they
#: cannot change a sum in float64, and as subnormal numbers they slow the CPU ~100×.
CUTOFF = -80.0


def _weight(log_ratio: Tensor) -> Tensor:
    """``exp(log_ratio)`` for ``log_ratio ≤ 0``, flushed to 0 below ``e^CUTOFF``."""
    return torch.where(log_ratio > CUTOFF, torch.exp(log_ratio), torch.zeros_like(log_ratio))


@dataclass
class PathOrders:
    """Path-order terms ``T_k = β^k S_k`` of ``∂h_L/∂h_0``, k = 0…K (Eq. 11).

    Attributes:
        units: ``(E, K+1, d, d)``, ``T_k / ‖T_k‖_F`` (zeros where ``T_k = 0``; a strided view).
        log_mu: ``(E, K+1)``, ``ln μ_k = ln ‖β^k S_k‖_F`` (``−inf`` where zero).
        beta: the effective β of the blocks.
        complete: whether K = L (all orders kept, so Σ_k T_k = ∂h_L/∂h_0).
    """

    units: Tensor
    log_mu: Tensor
    beta: float
    complete: bool

    @property
    def orders(self) -> np.ndarray:
        return np.arange(self.log_mu.shape[1])

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
        """``Σ_k β^k S_k`` as (unit-Frobenius ``(E, d, d)``, ln-norm ``(E,)``).

        Equals ``∂h_L/∂h_0`` when :attr:`complete`; the sum is formed relative to the
        largest term so it never overflows.
        """
        top = self.log_mu.amax(1)
        w = _weight(self.log_mu - top[:, None])
        acc = torch.einsum("ek,ekij->eij", w, self.units)
        norm = torch.linalg.matrix_norm(acc)
        return acc / norm[:, None, None], top + norm.log()


class PathOrderDP:
    """The dynamic program of Eq. 12 in log-norm form, fed one block at a time.

    Args:
        members: E; width: d; max_order: K (orders above K are not formed — the
            kept ones are still exact, since ``T_k`` depends only on ``T_k, T_{k−1}``);
        chunk: orders updated per matrix product (temporary memory ``≈ 3·chunk·E·d²``);
        dtype, device: of the stored terms.

    The terms are stored row-major as ``(E, d, K+1, d)`` so that ``J_b`` times a run of
    consecutive orders is *one* ``d × d × (chunk·d)`` GEMM per member.
    Memory: ``E·(K+1)·d²`` numbers (≈ 200 MB per member at K = 384, d = 256, float64).
    """

    def __init__(
        self,
        members: int,
        width: int,
        max_order: int,
        *,
        chunk: int = 64,
        dtype=torch.float64,
        device="cpu",
    ):
        if max_order < 0:
            raise ValueError(f"max_order={max_order} must be ≥ 0")
        if chunk < 1:
            raise ValueError(f"chunk={chunk} must be ≥ 1")
        e, d, k = members, width, max_order
        self.chunk, self.max_order, self.layers_seen, self.width = chunk, k, 0, d
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
            ok, top + torch.log(torch.where(ok, norm, 1)), -math.inf
        )

    def step(self, branch: Tensor, residual_norm: NormJacobian | Tensor | None = None) -> None:
        """Apply block m: ``T_k ← J_R (T_k + J_b T_{k−1})`` for k = min(m, K)…1, then ``T_0 ← J_R T_0``.

        Args:
            branch: ``J_b = β J_m`` ``(E, d, d)``.
            residual_norm: ``J_R`` (post-norm) as a closed-form :class:`NormJacobian`
                (O(d²) per order) or a dense ``(E, d, d)`` matrix, or ``None`` (identity).
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
            acc *= _weight(prev_log - top)[:, None, :, None]
            acc += _weight(cur_log - top)[:, None, :, None] * self.terms[:, :, lo : hi + 1, :]
            if residual_norm is not None:
                acc = _left(residual_norm, acc.view(e, d, n * d)).view(e, d, n, d)
            self._store(acc, top, lo, hi + 1)
            hi = lo - 1
        if residual_norm is not None:
            acc = _left(residual_norm, self._block(0, 1).clone()).view(e, d, 1, d)
            self._store(acc, self.log_mu[:, :1].clone(), 0, 1)

    def result(self, beta: float, depth: int) -> PathOrders:
        return PathOrders(
            self.terms.permute(0, 2, 1, 3), self.log_mu, beta, complete=self.max_order >= depth
        )


def _left(j: NormJacobian | Tensor, a: Tensor) -> Tensor:
    """``J a`` for ``a`` ``(E, d, n)``: in place for a closed form, one product for a dense J."""
    return j.left_(a) if isinstance(j, NormJacobian) else j @ a


def _check_structure(model: ResidualMLP) -> None:
    if model.skip_every != 1:
        raise ValueError(
            f"path-order decomposition (Eq. 12) needs an identity skip on every block; "
            f"skip_every={model.skip_every} is not supported (use skip_every=1)"
        )


def path_orders(
    model: ResidualMLP,
    h0: Tensor,
    *,
    max_order: int | None = None,
    chunk: int = 64,
    on_layer: Callable[[LayerJacobian], None] | None = None,
) -> PathOrders:
    """``∂h_L/∂h_0 = Σ_k β^k S_k`` (Eq. 11) by the dynamic program of Eq. 12.

    Args:
        model: a residual stack with ``skip_every = 1`` (any placement, norm op,
            activation, M).
        h0: inputs ``(E, 1, d)``, one per member.
        max_order: K ≤ L, keep orders 0…K only (exact for those; default L).
        chunk: orders per batched product.
        on_layer: also called with every block's :class:`LayerJacobian`.

    Returns:
        :class:`PathOrders`.  Cost: ``≈ L·K`` products of ``d×d`` matrices per member
        (twice that for post-norm), one pass of block Jacobians.

    Raises:
        ValueError: ``skip_every ≠ 1`` (see module docstring) or ``max_order < 0``.
    """
    _check_structure(model)
    e, _, d = h0.shape
    k = model.depth if max_order is None else min(int(max_order), model.depth)
    dp = PathOrderDP(e, d, k, chunk=chunk, dtype=h0.dtype, device=h0.device)
    with torch.no_grad():
        for lj in layer_jacobians(model, h0):
            dp.step(lj.branch, lj.residual)
            if on_layer is not None:
                on_layer(lj)
    return dp.result(model.beta_eff, model.depth)


class PathOrderFold:
    """The dynamic program as a layer fold of the shared sweep (``needs`` name ``path_orders``)."""

    def __init__(self, ctx: ProbeContext):
        opt = ctx.probe_options("path_order", PATH_ORDER_OPTIONS)
        model = ctx.model
        _check_structure(model)
        k = model.depth if opt["max_order"] is None else min(int(opt["max_order"]), model.depth)
        e, _, d = ctx.h0.shape
        self.model = model
        self.dp = PathOrderDP(e, d, k, chunk=int(opt["chunk"]), dtype=ctx.h0.dtype, device=ctx.h0.device)

    def step(self, lj: LayerJacobian) -> None:
        self.dp.step(lj.branch, lj.residual)

    def result(self) -> PathOrders:
        return self.dp.result(self.model.beta_eff, self.model.depth)


def probe_path_order(ctx: ProbeContext) -> Measurement:
    """Path-order profile of ``∂h_L/∂h_0`` (Eq. 5/11/12; Figure 3), step = path order k.

    Options (``task.options.path_order``): ``max_order`` (K, default L),
    ``chunk`` (orders per matrix product, default 64).

    Series (k = 0…K): ``path_log_mu`` = ln μ_k, ``μ_k = ‖β^k S_k‖_F`` (zeros clamped
    at ``LOG_ZERO``); ``path_profile`` = μ_k / Σ_j μ_j (over the kept orders when K < L).
    Scalars: ``mean_path_order`` ⟨k⟩ under the μ profile; ``mean_path_order_energy``
    under μ_k²; ``path_order_peak`` argmax_k μ_k; ``mean_path_order_uncorrelated`` the
    energy mean if paths were uncorrelated (Poisson-binomial with ρ_l = r_l², Eq. 4;
    Binomial(L, ρ/(1+ρ)) for constant ρ); ``path_reconstruction_error`` =
    ``‖Σ_k β^k S_k − ∂h_L/∂h_0‖_F / ‖∂h_L/∂h_0‖_F`` against the forward sweep
    (~1e−15 in float64 when K = L; the truncation error otherwise).

    Needs ``path_orders`` (the fold, fed by the shared sweep), ``io_jacobian`` and
    ``branch_norms``: the block Jacobians are formed once for every probe.
    """
    ctx.probe_options("path_order", PATH_ORDER_OPTIONS)  # unknown keys fail before any work
    model = ctx.model
    _check_structure(model)
    po = ctx.fold("path_orders")
    sw = ctx.sweep

    m = Measurement()
    orders = po.orders
    m.add_seed_series("path_log_mu", po.log_mu.clamp(min=LOG_ZERO), orders)
    m.add_seed_series("path_profile", po.profile(), orders)
    m.add_seed_stat("mean_path_order", po.mean_order())
    m.add_seed_stat("mean_path_order_energy", po.mean_order(power=2))
    m.add_seed_stat("path_order_peak", po.log_mu.argmax(1).to(po.log_mu.dtype))
    rho = sw.branch_ratio.square().double().cpu().numpy()
    k_axis = np.arange(model.depth + 1)
    m.add_seed_stat(
        "mean_path_order_uncorrelated",
        torch.tensor([float((uncorrelated_path_profile(r) * k_axis).sum()) for r in rho]),
    )
    unit, log = po.reconstruct()
    io_log = sw.log_gain[:, -1]
    err = torch.linalg.matrix_norm(unit * torch.exp(log - io_log)[:, None, None] - sw.io_unit)
    m.add_seed_stat("path_reconstruction_error", err)
    return m
