"""``model=mlp``: the residual MLP of the study (science.md §1; :mod:`rankexp.models.mlp`)."""

from __future__ import annotations

from dataclasses import dataclass

from ...naming import base_name
from .base import Family, branch_params, mlp_shape


@dataclass
class MlpModel:
    """``model=mlp`` (default): the residual MLP of the study (science.md §1,
    :class:`rankexp.models.mlp.ResidualMLP`), shaped by the top-level knobs."""

    name: str = "mlp"


def run_name(s) -> str:
    """``post·α1·β1·L48·d256`` (``·train`` or ``·lr<lr>`` for training)."""
    return base_name(s.norm.placement.value, s.alpha, s.beta, s.beta_scaling.value, s.depth,
                     s.width, s.task.name, s.lr)


FAMILY = Family(
    name="mlp", schema=MlpModel, builder="rankexp.models.build:build_mlp",
    tasks=("measure", "train"), run_name=run_name, memory_shape=mlp_shape,
    derived=lambda s: branch_params(s, s.matrices), streams=True,
)
