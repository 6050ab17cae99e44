"""Normalization operations at gain 1 over the last axis, ``(..., d) → (..., d)``, and their
closed-form Jacobians (Table 2): each is ``J = c · (I − V Vᵀ)``, V ∈ R^{d×r} orthonormal, r ≤ 2
(rmsnorm: c = √d/‖x‖, V = x̂; layernorm: c = √d/‖x−μ‖, V = [x̂_c, 1/√d]; detached: r = 0;
meansub: c = 1, V = 1/√d), applied in O(r·d·n) by :class:`NormJacobian`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .spec import NORM_OPS, PRESET, PRESET_SLOTS, SLOTS, block_ops  # noqa: F401 — torch-free (config)


def _norm(x: Tensor) -> Tensor:
    """``‖x‖`` over the last axis, never below the dtype's smallest normal number: a zero vector
    (every unit of a small ReLU branch off: 2⁻⁸ per input at d = 8) is normalized to zero
    instead of 0/0 = NaN; any other vector's norm is unchanged, bit for bit."""
    return torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp(min=torch.finfo(x.dtype).tiny)


def rmsnorm(x: Tensor) -> Tensor:
    """RMSNorm at gain 1 over the last axis: ``sqrt(d) x / ‖x‖`` (Table 2; 0 at x = 0).

    Jacobian ``sqrt(d)/‖x‖ (I − x̂x̂ᵀ)``: a rescaling times a projection.
    """
    return x * (math.sqrt(x.shape[-1]) / _norm(x))


def meansub(x: Tensor) -> Tensor:
    """Mean subtraction ``x − mean(x) 1`` over the last axis (Table 2); Jacobian ``I − 11ᵀ/d``."""
    return x - x.mean(dim=-1, keepdim=True)


def layernorm(x: Tensor) -> Tensor:
    """LayerNorm at gain 1, no bias: center, then rmsnorm (Table 2).

    Jacobian ``sqrt(d)/‖x−μ‖ (I − x̂_c x̂_cᵀ)(I − 11ᵀ/d)``.
    """
    return rmsnorm(meansub(x))


def detached(x: Tensor) -> Tensor:
    """Detached rescaling ``x / stopgrad(rms(x))`` (Table 2).

    Same forward value as :func:`rmsnorm`; its Jacobian is the pure rescaling
    ``sqrt(d)/‖x‖ I`` with no projection, which isolates the rescaling's
    effect on rank (Figure 4).
    """
    scale = math.sqrt(x.shape[-1]) / _norm(x)
    return x * scale.detach()


NORM_FNS: dict[str, Callable[[Tensor], Tensor]] = {
    "rmsnorm": rmsnorm,
    "layernorm": layernorm,
    "detached": detached,
    "meansub": meansub,
}


def identity(x: Tensor) -> Tensor:
    """The identity operation (a placement without a norm)."""
    return x


# --------------------------------------------------------------------------- Table 2 Jacobians
@dataclass
class NormJacobian:
    """A Table 2 Jacobian ``J = c (I − V Vᵀ)`` per member, kept in factored form.

    Attributes:
        scale: c, shape ``(E,)``.
        basis: V, shape ``(E, d, r)`` with orthonormal columns, or ``None`` (r = 0: J = c I).
    """

    scale: Tensor
    basis: Tensor | None

    def left(self, a: Tensor) -> Tensor:
        """``J a`` for ``a`` of shape ``(E, d, n)`` (a new tensor; O(r·d·n))."""
        return self.left_(a.clone())

    def left_(self, a: Tensor) -> Tensor:
        """``a ← J a`` in place (``a`` ``(E, d, n)``); returns ``a``."""
        if self.basis is not None:
            # bmm then subtract (not baddbmm_): per-member bits independent of the batch size
            a.sub_(self.basis @ (self.basis.mT @ a))
        return a.mul_(self.scale[:, None, None])

    def right_(self, a: Tensor) -> Tensor:
        """``a ← a J`` in place (``a`` ``(E, n, d)``); returns ``a``."""
        if self.basis is not None:
            a.sub_((a @ self.basis) @ self.basis.mT)
        return a.mul_(self.scale[:, None, None])

    def dense(self, width: int) -> Tensor:
        """J as a dense ``(E, d, d)`` matrix, d = ``width`` (tests, small-d probes)."""
        e = self.scale.shape[0]
        eye = torch.eye(width, dtype=self.scale.dtype, device=self.scale.device)
        return self.left_(eye.expand(e, width, width).clone())


def norm_jacobian(op: str, x: Tensor) -> NormJacobian:
    """Closed-form Jacobian of norm ``op`` at ``x`` ``(E, d)`` (Table 2, Eq. 19–20).

    Raises:
        ValueError: unknown op (allowed: :data:`NORM_OPS`).
    """
    d = x.shape[-1]
    root = math.sqrt(d)
    if op in ("rmsnorm", "detached"):
        n = torch.linalg.vector_norm(x, dim=-1)
        basis = (x / n[:, None])[..., None] if op == "rmsnorm" else None
        return NormJacobian(root / n, basis)
    ones = torch.full_like(x, 1.0 / root)
    if op == "meansub":
        return NormJacobian(torch.ones_like(x[:, 0]), ones[..., None])
    if op == "layernorm":
        xc = x - x.mean(dim=-1, keepdim=True)
        n = torch.linalg.vector_norm(xc, dim=-1)
        # (I − x̂_c x̂_cᵀ)(I − 11ᵀ/d) = I − x̂_c x̂_cᵀ − 11ᵀ/d because x̂_c ⊥ 1
        return NormJacobian(root / n, torch.stack([xc / n[:, None], ones], dim=-1))
    raise ValueError(f"norm op {op!r} is not one of {', '.join(NORM_OPS)}")
