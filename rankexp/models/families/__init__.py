"""The model families (``model=``), each declared once, torch-free (:class:`Family`); adding
one: docs/extending.md.
"""

from __future__ import annotations

from typing import Any

from . import convnet, gpt2, mlp, plain
from .base import CIFAR10, GAUSSIAN, Family, branch_params, mlp_shape

#: ``model.name`` → its family, in the order ``--help`` and errors list them
FAMILIES: dict[str, Family] = {f.name: f for f in (mlp.FAMILY, plain.FAMILY, gpt2.FAMILY,
                                                   convnet.FAMILY)}

__all__ = ["CIFAR10", "FAMILIES", "GAUSSIAN", "Family", "branch_params", "family_of", "mlp_shape"]


def family_of(s: Any) -> Family:
    """The family of a typed config (``s.model.name``)."""
    return FAMILIES[s.model.name]
