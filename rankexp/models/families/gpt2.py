"""``model=gpt2``: Hugging Face causal LMs (Figure 12; :mod:`rankexp.models.gpt2`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..spec import DEFAULT_PROMPT_IDS
from .base import Family, mlp_shape


@dataclass
class Gpt2Model:
    """``model=gpt2``: a Hugging Face causal LM (:mod:`rankexp.models.gpt2`), its FFN-branch
    Jacobians along the residual stream of a fixed prompt (Figure 12, probe ``ffn_jacobian``).
    ``width``/``depth`` default to the network's own (``conf/model/gpt2.yaml``); the
    residual-MLP knobs do not apply.

    Attributes:
        config: the shape of a random initialization (``gpt2``, ``gpt2-medium``, …; no download).
        pretrained: a local checkpoint directory or hub id (one network: ``seeds=1``), or null.
        n_head: attention heads (null: the config's, or head size 64 at a reduced width).
        prompt_ids: the fixed prompt as token ids (default: "The quick brown fox …").
        prompt, tokenizer: the prompt as text instead, and where its tokenizer comes from.
        position: the token whose stream is traced (negative: from the end).
    """

    name: str = "gpt2"
    config: str = "gpt2"
    pretrained: str | None = None
    n_head: int | None = None
    prompt_ids: list[int] = field(default_factory=lambda: list(DEFAULT_PROMPT_IDS))
    prompt: str | None = None
    tokenizer: str | None = None
    position: int = -1


def run_name(s) -> str:
    """``gpt2·L12·d768`` (``<checkpoint>·L12·d768`` when pretrained)."""
    source = Path(s.model.pretrained).name if s.model.pretrained else s.model.config
    return f"{source}·L{s.depth}·d{s.width}"


FAMILY = Family(
    name="gpt2", schema=Gpt2Model, builder="rankexp.models.build:build_gpt2",
    tasks=("measure",), run_name=run_name, memory_shape=mlp_shape,
    checks_fit=False,  # its weights are the LM's, not the estimate's MLP (ffn_memory: the rest)
    default_probes=("ffn_jacobian",),
)
