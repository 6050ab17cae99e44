"""Scalar activations σ of the model families and their derivatives σ′.

:data:`ACTIVATION_DERIVATIVES` holds σ′ in closed form, equal to what autograd returns
(including its choice at the kinks: relu′(0) = abs′(0) = 0, leaky_relu′(0) = slope), so the
closed-form Jacobians of the engine match ``torch.func`` to rounding.  :data:`MASKED` names the
activations whose σ′ is 0 on a set of units (relu): the branch Jacobian then only needs the
active units, ``J_f = W_down[:, a] W_up[a, :]``.  The gated unit (swiglu) has no scalar σ′.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor
from torch.nn import functional as F

from .spec import ACTIVATIONS, LEAKY_SLOPE

ACTIVATION_FNS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,  # exact erf form (approximate="none")
    "silu": F.silu,
    "abs": torch.abs,
    "tanh": torch.tanh,
    "linear": lambda x: x,
    "leaky_relu": lambda x: F.leaky_relu(x, LEAKY_SLOPE),
    "swiglu": F.silu,  # the gate's nonlinearity; the gating itself lives in the branch
}


def _gelu_prime(x: Tensor) -> Tensor:
    # d/dx x Φ(x) = Φ(x) + x φ(x), exact erf form
    cdf = 0.5 * (1.0 + torch.erf(x * math.sqrt(0.5)))
    return cdf + x * torch.exp(-0.5 * x * x) * (1.0 / math.sqrt(2.0 * math.pi))


def _silu_prime(x: Tensor) -> Tensor:
    s = torch.sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


#: σ′ in closed form for every scalar activation (not the gated swiglu, whose branch is not σ(W x))
ACTIVATION_DERIVATIVES: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": lambda x: (x > 0).to(x.dtype),
    "gelu": _gelu_prime,
    "silu": _silu_prime,
    "abs": torch.sign,
    "tanh": lambda x: 1.0 - torch.tanh(x).square(),
    "linear": torch.ones_like,
    "leaky_relu": lambda x: torch.where(x > 0, torch.ones_like(x), torch.full_like(x, LEAKY_SLOPE)),
}

#: activations whose σ′ vanishes on the inactive units (the engine keeps only the active ones)
MASKED = frozenset({"relu"})


def activation_fn(name: str) -> Callable[[Tensor], Tensor]:
    """The scalar nonlinearity σ called ``name``.

    Raises:
        ValueError: unknown name (allowed: :data:`ACTIVATIONS`).
    """
    try:
        return ACTIVATION_FNS[name]
    except KeyError:
        raise ValueError(f"activation={name!r} is not one of {', '.join(ACTIVATIONS)}") from None


