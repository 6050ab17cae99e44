"""``model=gpt2``: Hugging Face causal LMs (Figure 12; :mod:`rankexp.models.gpt2`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import bad as _bad
from ..spec import DEFAULT_PROMPT_IDS, LM_SHAPES, checkpoint_shape
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

    def __post_init__(self) -> None:
        if self.config not in LM_SHAPES:
            raise _bad("model.config", self.config, f"allowed: {', '.join(LM_SHAPES)}")
        if self.n_head is not None and self.n_head < 1:
            raise _bad("model.n_head", self.n_head, "must be an integer ≥ 1 (or null)")
        if self.prompt is None:
            ids = list(self.prompt_ids)
            if not ids or min(ids) < 0:
                raise _bad("model.prompt_ids", ids, "need at least one token id ≥ 0")
            if not -len(ids) <= self.position < len(ids):
                raise _bad("model.position", self.position, f"outside the prompt of {len(ids)} tokens")
        elif not (self.tokenizer or self.pretrained):
            raise _bad("model.prompt", self.prompt, "a text prompt needs a tokenizer: set "
                       "model.tokenizer or model.pretrained (a local directory or hub id), or "
                       "give model.prompt_ids")


def run_name(s) -> str:
    """``gpt2·L12·d768`` (``<checkpoint>·L12·d768`` when pretrained)."""
    source = Path(s.model.pretrained).name if s.model.pretrained else s.model.config
    return f"{source}·L{s.depth}·d{s.width}"


def check(s, probes: list[str]) -> None:
    """Heads dividing d; one pretrained network whose shape (when known offline) is
    width × depth.

    Raises:
        ConfigError: the first rule broken.
    """
    m = s.model
    if m.pretrained:
        if s.seeds != 1:
            raise _bad("seeds", s.seeds, "pretrained weights are one network: use seeds=1")
        shape = checkpoint_shape(m.pretrained)
        if shape and (shape.get("n_embd"), shape.get("n_layer")) != (s.width, s.depth):
            raise _bad("width/depth", (s.width, s.depth),
                       f"model.pretrained={m.pretrained!r} has d = {shape.get('n_embd')}, "
                       f"L = {shape.get('n_layer')} (leave width/depth unset)")
    elif m.n_head is not None and s.width % m.n_head:
        raise _bad("model.n_head", m.n_head, f"must divide width={s.width}")

#: a Hugging Face hub id: ``name`` or ``org/name`` (letters, digits, ``-``, ``_``, ``.``)
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def check_pretrained(pretrained: str) -> None:
    """``model.pretrained`` names a local checkpoint directory (``save_pretrained``'s, with its
    ``config.json``) or a hub id (``gpt2``, ``openai-community/gpt2-medium``); a path that is
    neither is refused before any run exists (not as a Hugging Face traceback after one).

    Raises:
        ConfigError: the value, what was found there and what belongs there.
    """
    path = Path(pretrained).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise _bad("model.pretrained", pretrained, f"{path} holds no config.json: a local "
                       "checkpoint is a directory written by save_pretrained")
        return
    if path.exists():
        raise _bad("model.pretrained", pretrained, f"{path} is a file; a local checkpoint is a "
                   "directory written by save_pretrained (config.json + weights)")
    looks_like_path = pretrained.startswith(("/", ".", "~")) or "\\" in pretrained
    if looks_like_path or not _HUB_ID.fullmatch(pretrained) or ".." in pretrained:
        raise _bad("model.pretrained", pretrained, f"no such directory ({path.absolute()}); give "
                   "a local checkpoint directory (config.json + weights) or a hub id such as "
                   "gpt2 or openai-community/gpt2-medium")



FAMILY = Family(
    name="gpt2", schema=Gpt2Model, builder="rankexp.models.build:build_gpt2",
    tasks=("measure",), run_name=run_name, memory_shape=mlp_shape,
    checks_fit=False,  # its weights are the LM's, not the estimate's MLP (ffn_memory: the rest)
    default_probes=("ffn_jacobian",), check=check,
    check_paths=lambda s: check_pretrained(s.model.pretrained) if s.model.pretrained else None,
)
