"""``model=plain``: the mean-field plain networks of the textbook chapter
(:mod:`rankexp.models.plain`); the knobs only they have (σ_b, orthogonal init, batchnorm) are
refused under the other families by :mod:`rankexp.config.checks`."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Family, branch_params, mlp_shape
from .mlp import run_name


@dataclass
class PlainModel:
    """``model=plain``: the mean-field plain network of the textbook chapter
    (:class:`rankexp.models.plain.PlainNet`), shaped by the top-level knobs (``alpha``: σ_w,
    ``bias``: σ_b; ``norm``: none, or pre with any op incl. batchnorm); ``expansion`` and
    ``matrices`` do not apply (one n×n matrix per layer)."""

    name: str = "plain"


FAMILY = Family(
    name="plain", schema=PlainModel, builder="rankexp.models.build:build_plain",
    tasks=("measure", "train"), run_name=run_name, memory_shape=mlp_shape,
    derived=lambda s: branch_params(s, 1),  # one matrix per layer: βα (Eq. 21 with M = 1)
)
