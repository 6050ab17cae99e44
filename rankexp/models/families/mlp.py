"""``model=mlp``: the residual MLP of the study (:mod:`rankexp.models.mlp`)."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Family, branch_params, mlp_shape


@dataclass
class MlpModel:
    """``model=mlp`` (default): the residual MLP of the study
    (:class:`rankexp.models.mlp.ResidualMLP`), shaped by the top-level knobs."""

    name: str = "mlp"


_SCALED = {"const": "", "inv_sqrt_depth": "/√L", "inv_depth": "/L"}


def run_name(s) -> str:
    """``post·α1·β1·L48·d256`` (``·train`` or ``·lr<lr>`` for training)."""
    name = (f"{s.norm.placement.value}·α{s.alpha:g}·β{s.beta:g}{_SCALED[s.beta_scaling.value]}"
            f"·L{s.depth}·d{s.width}")
    if s.task.name == "train":
        name += "·train" if s.lr is None else f"·lr{s.lr:g}"
    return name


FAMILY = Family(
    name="mlp", schema=MlpModel, builder="rankexp.models.build:build_mlp",
    tasks=("measure", "train"), run_name=run_name, memory_shape=mlp_shape,
    derived=lambda s: branch_params(s, s.matrices), streams=True,
)
