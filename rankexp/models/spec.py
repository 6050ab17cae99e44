"""What the model families are, without torch (the config and ``--help`` read it): names,
Eq. 17's slots, GPT-2's shapes, derived widths and ratios.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

#: σ of the residual MLP (:mod:`rankexp.models.activations` holds the functions)
ACTIVATIONS = ("relu", "gelu", "silu", "abs", "tanh", "linear", "leaky_relu", "swiglu")
LEAKY_SLOPE = 0.01  # leaky_relu's slope below 0
#: the norm operations of Table 2 (:mod:`rankexp.models.norms` holds the functions)
NORM_OPS = ("rmsnorm", "layernorm", "detached", "meansub")

#: the norm placements (presets of Eq. 17's slots, :data:`PRESET_SLOTS`)
PLACEMENTS = ("pre", "post", "output", "peri", "none")
#: depth scalings of β (``beta_scaling``)
BETA_SCALINGS = ("const", "inv_sqrt_depth", "inv_depth")


def effective_beta(beta: float, depth: int, scaling: str) -> float:
    """Branch scale after depth scaling: β, β/√L or β/L for ``const``,
    ``inv_sqrt_depth``, ``inv_depth``."""
    if scaling == "const":
        return float(beta)
    if scaling == "inv_sqrt_depth":
        return float(beta) / math.sqrt(depth)
    if scaling == "inv_depth":
        return float(beta) / depth
    raise ValueError(f"beta_scaling={scaling!r} is not one of {', '.join(BETA_SCALINGS)}")


#: the general block ``h_l = R(h_{l−1} + β B(f(P(h_{l−1}))))`` (Eq. 17) has three slots
SLOTS = ("pre", "out", "post")
#: each named placement (``norm=pre|post|output|peri|none``) is a preset: the slots it fills
#: with its op (the others are the identity)
PRESET_SLOTS: dict[str, tuple[str, ...]] = {
    "pre": ("pre",),  # Pre-Norm, Eq. 7
    "post": ("post",),  # Post-Norm, Eq. 6
    "output": ("out",),  # branch-output norm
    "peri": ("pre", "out"),  # pre + output
    "none": (),
}
#: ``block_ops(…, pre=PRESET)``: take the slot from the placement preset
PRESET = "preset"


def block_ops(placement: str, op: str, pre: str | None = PRESET, out: str | None = PRESET,
              post: str | None = PRESET) -> tuple[str | None, str | None, str | None]:
    """The ops ``(P, B, R)`` of Eq. 17, each a name of :data:`NORM_OPS` or ``None`` (identity).

    A slot given as :data:`PRESET` comes from the placement preset (``op`` where the preset puts
    a norm, else the identity); an explicit op name, ``"none"`` or ``None`` overrides it.

    Raises:
        ValueError: unknown placement or op.
    """
    if placement not in PRESET_SLOTS:
        raise ValueError(f"placement={placement!r} is not one of {', '.join(PRESET_SLOTS)}")
    out_ops = []
    for slot, given in zip(SLOTS, (pre, out, post), strict=True):
        chosen = (op if slot in PRESET_SLOTS[placement] else None) if given == PRESET else given
        chosen = None if chosen in (None, "none") else chosen
        if chosen is not None and chosen not in NORM_OPS:
            raise ValueError(f"norm.{slot}={chosen!r} is not one of none, {', '.join(NORM_OPS)}")
        out_ops.append(chosen)
    return tuple(out_ops)


#: named configs a random initialization can take its shape from (no download): d, L, heads
LM_SHAPES: dict[str, dict[str, int]] = {
    "gpt2": {"n_embd": 768, "n_layer": 12, "n_head": 12},
    "gpt2-medium": {"n_embd": 1024, "n_layer": 24, "n_head": 16},
    "gpt2-large": {"n_embd": 1280, "n_layer": 36, "n_head": 20},
    "gpt2-xl": {"n_embd": 1600, "n_layer": 48, "n_head": 25},
}
#: the same shapes under the hub's organisation-qualified ids
HUB_IDS = {f"openai-community/{k}": k for k in LM_SHAPES}
#: GPT-2 BPE ids of "The quick brown fox jumps over the lazy dog." (the default fixed prompt)
DEFAULT_PROMPT_IDS = (464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13)
#: config.json keys of d, L and heads across architectures (GPT-2's names, then Llama's)
_CONFIG_KEYS = {"n_embd": ("n_embd", "hidden_size"), "n_layer": ("n_layer", "num_hidden_layers"),
                "n_head": ("n_head", "num_attention_heads")}


class ShapeError(ValueError):
    """The shape of a ``model=gpt2`` network cannot be known (an unknown config name, a hub id
    offline); :func:`rankexp.config.validate` reports it as a config error."""


def checkpoint_shape(pretrained: str) -> dict[str, int] | None:
    """``{"n_embd", "n_layer", "n_head"}`` of a pretrained model known offline: a local directory's
    ``config.json``, or a hub id of :data:`LM_SHAPES`; None otherwise."""
    path = Path(pretrained).expanduser() / "config.json"
    if not path.is_file():
        name = HUB_IDS.get(pretrained, pretrained)
        return dict(LM_SHAPES[name]) if name in LM_SHAPES else None
    cfg = json.loads(path.read_text())
    found = {key: [cfg[n] for n in names if n in cfg] for key, names in _CONFIG_KEYS.items()}
    return {key: int(values[0]) for key, values in found.items() if values}


def lm_shape(key: str, config: str, pretrained: str | None) -> int:
    """Resolver ``rankexp_lm_shape``: d (``n_embd``) or L (``n_layer``) of the network
    ``model=gpt2`` builds — the checkpoint's when ``pretrained`` is given, else the named config's.

    Raises:
        ShapeError: an unknown config name, or a hub id whose shape cannot be known offline
            (then give ``width=`` and ``depth=`` on the command line).
    """
    if pretrained:
        shape = checkpoint_shape(str(pretrained))
        if shape is None or key not in shape:
            raise ShapeError(f"model.pretrained={pretrained!r}: its shape is not known offline "
                             "(not a local checkpoint directory, nor a hub id of "
                             f"{', '.join(LM_SHAPES)}); give width= and depth= explicitly")
        return shape[key]
    if config not in LM_SHAPES:
        raise ShapeError(f"model.config={config!r}: allowed {', '.join(LM_SHAPES)}")
    return LM_SHAPES[config][key]


def default_heads(width: int, config: str) -> int:
    """Heads of a random-init network of width d: the named config's when d is its width, else
    as many as keep its head size (64) — the largest divisor of d not above ``d/64`` (≥ 1)."""
    shape = LM_SHAPES.get(config, LM_SHAPES["gpt2"])
    if width == shape["n_embd"]:
        return shape["n_head"]
    head = shape["n_embd"] // shape["n_head"]
    n = max(1, width // head)
    while width % n:
        n -= 1
    return n


def expanded_width(width: int, expansion: float) -> int:
    """m = round(m/d · d): the hidden width of a two-matrix branch (may be < 1 for a tiny m/d;
    the config refuses that)."""
    return int(round(expansion * width))


def hidden_width(width: int, expansion: float, matrices: int) -> int:
    """The width of a branch's hidden layer: d for ``M = 1`` (σ(W x)), else
    :func:`expanded_width` (at least 1)."""
    return width if matrices == 1 else max(1, expanded_width(width, expansion))


def nominal_ratio(beta_eff: float, alpha: float, matrices: int) -> float:
    """βα^M, the nominal branch-to-skip ratio (Eq. 21 at ‖h‖ = √d), from the depth-scaled β
    (:func:`effective_beta`), the init scale α and the M weight matrices of a branch."""
    return beta_eff * alpha**matrices
