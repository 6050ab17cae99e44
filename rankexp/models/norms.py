"""Normalization operations at gain 1 over the last axis (Table 2 of the study).

Each maps ``(..., d) → (..., d)``; the Jacobians in the docstrings are the closed forms the
engine and the tests use (Table 2, Eq. 19–20).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

NORM_OPS = ("rmsnorm", "layernorm", "detached", "meansub")


def rmsnorm(x: Tensor) -> Tensor:
    """RMSNorm at gain 1 over the last axis: ``sqrt(d) x / ‖x‖`` (Table 2).

    Jacobian ``sqrt(d)/‖x‖ (I − x̂x̂ᵀ)``: a rescaling times a projection.
    """
    return x * (math.sqrt(x.shape[-1]) / torch.linalg.vector_norm(x, dim=-1, keepdim=True))


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
    scale = math.sqrt(x.shape[-1]) / torch.linalg.vector_norm(x, dim=-1, keepdim=True)
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
