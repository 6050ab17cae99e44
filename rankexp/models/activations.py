"""Scalar activations σ of the model families (science.md §1)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.nn import functional as F

ACTIVATIONS = ("relu", "gelu", "silu", "abs", "tanh", "linear", "leaky_relu", "swiglu")
LEAKY_SLOPE = 0.01


def _abs(x: Tensor) -> Tensor:
    return x.abs()


def _linear(x: Tensor) -> Tensor:
    return x


ACTIVATION_FNS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,  # exact erf form (approximate="none")
    "silu": F.silu,
    "abs": _abs,
    "tanh": torch.tanh,
    "linear": _linear,
    "leaky_relu": lambda x: F.leaky_relu(x, LEAKY_SLOPE),
    "swiglu": F.silu,  # the gate's nonlinearity; the gating itself lives in the branch
}


def activation_fn(name: str) -> Callable[[Tensor], Tensor]:
    """The scalar nonlinearity σ called ``name``.

    Raises:
        ValueError: unknown name (allowed: :data:`ACTIVATIONS`).
    """
    try:
        return ACTIVATION_FNS[name]
    except KeyError:
        raise ValueError(f"activation={name!r} is not one of {', '.join(ACTIVATIONS)}") from None


