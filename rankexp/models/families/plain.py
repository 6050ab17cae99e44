"""``model=plain``: the mean-field plain networks of the textbook chapter (science.md §5;
:mod:`rankexp.models.plain`), and the knobs only they have (σ_b, orthogonal init, batchnorm)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import bad
from .base import Family, branch_params, mlp_shape
from .mlp import run_name


@dataclass
class PlainModel:
    """``model=plain``: the mean-field plain network of the textbook chapter (science.md §5,
    :class:`rankexp.models.plain.PlainNet`), ``h_l = W_l φ(N(h_{l−1})) + b_l`` (plus the skip
    ``h_{l−1}`` and branch gain β when ``skip_every=1``), shaped by the top-level knobs
    ``depth``, ``width``, ``alpha`` (σ_w), ``bias`` (σ_b), ``init``, ``activation``,
    ``skip_every``, ``beta`` and ``norm`` (``none``, or ``pre`` with any op incl. ``batchnorm``).
    ``expansion`` and ``matrices`` do not apply (one n×n matrix per layer)."""

    name: str = "plain"


def check(s, probes: list[str]) -> None:
    """Its norm is N before φ (``norm=none|pre``, slots from the preset), one matrix per layer
    (no gated unit), and a batchnorm needs a batch (no probe of one input per seed).

    Raises:
        ConfigError: the first rule broken.
    """
    from ...config.schema import _preset_slot
    from ...probes import PROBES

    placement, op = s.norm.placement.value, s.norm.op.value
    if placement not in ("none", "pre"):
        raise bad("norm", placement, "model=plain supports norm=none or norm=pre (N before φ)")
    if s.activation.value == "swiglu":
        raise bad("activation", "swiglu", "model=plain has one matrix per layer; "
                  "the gated unit needs model=mlp matrices=2")
    for slot in ("pre", "out", "post"):
        got = getattr(s.norm, slot).value
        if got != _preset_slot(slot, placement, op):
            raise bad(f"norm.{slot}", got, "model=plain takes its norm from norm= and "
                      "norm.op (the slots P, B, R of Eq. 17 are model=mlp's)")
    single = [p for p in probes if PROBES[p].inputs == "one"]
    if op == "batchnorm" and placement == "pre" and single:
        raise bad("task.probes", single, "these differentiate one input per seed and a "
                  "batchnorm needs a batch; use correlation, gradient_norms, shattered")


def exclusive(s) -> list[tuple[str, Any, str]]:
    """The settings only a plain net has, where ``s`` uses them: σ_b, orthogonal init, batchnorm."""
    out = []
    if s.bias != 0:
        out.append(("bias", s.bias, "biases (σ_b) exist only in model=plain (add model=plain)"))
    if s.init.value != "gaussian":
        out.append(("init", s.init.value, "orthogonal weights exist only in model=plain "
                    "(add model=plain)"))
    if s.norm.op.value == "batchnorm":
        out.append(("norm.op", "batchnorm", "batch normalization exists only in model=plain "
                    "(add model=plain norm=pre)"))
    for slot in ("pre", "out", "post"):
        if getattr(s.norm, slot).value == "batchnorm":
            out.append((f"norm.{slot}", "batchnorm", "batch normalization exists only in "
                        "model=plain (add model=plain norm=pre norm.op=batchnorm)"))
    return out


FAMILY = Family(
    name="plain", schema=PlainModel, builder="rankexp.models.build:build_plain",
    tasks=("measure", "train"), run_name=run_name, memory_shape=mlp_shape,
    derived=lambda s: branch_params(s, 1),  # one matrix per layer: βα (Eq. 21 with M = 1)
    check=check, exclusive=exclusive,
)
