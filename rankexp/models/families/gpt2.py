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

    The top-level ``width`` (d) and ``depth`` (L) default to the network's own — the named
    ``config``'s, or the checkpoint's when ``pretrained`` is given (``conf/model/gpt2.yaml``) —
    and ``width=``/``depth=`` reduce a random initialization (tests).  The residual-MLP knobs
    (``expansion``, ``matrices``, ``alpha``, ``beta``, ``activation``, ``norm``) do not apply.

    Attributes:
        config: the shape of a random initialization (``gpt2`` = GPT-2 Small, ``gpt2-medium``,
            ``gpt2-large``, ``gpt2-xl``), GPT-2's own initialization, no download.
        pretrained: a local checkpoint directory or hub id for ``from_pretrained`` (then one
            network: ``seeds=1``); null = random initialization.
        n_head: attention heads (null: the config's, or head size 64 at a reduced width).
        prompt_ids: the fixed prompt as token ids (default: GPT-2 BPE of "The quick brown fox
            jumps over the lazy dog.").
        prompt: the prompt as text instead (tokenized by ``tokenizer``, default ``pretrained``).
        tokenizer: where the tokenizer of a text prompt comes from (local directory or hub id).
        position: the token whose stream is traced (negative: from the end; default the last).
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
