"""Hugging Face causal LMs — GPT-2 and kin — as a model family (``model=gpt2``; Figure 12):
GPT-2's own random initialization of a named shape, or pretrained weights of any architecture
of :data:`ARCHITECTURES` (one member); ``transformers`` is imported only when used.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..seeding import STREAM_WEIGHTS, seeded_generator
from .spec import DEFAULT_PROMPT_IDS, default_heads  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)

EXTRA_HINT = ("model=gpt2 needs the optional extra `transformers`: "
              "pip install -e '.[gpt2]' (make setup installs it)")


def transformers_module():
    """``import transformers``, or an ImportError naming the extra (:data:`EXTRA_HINT`)."""
    try:
        import transformers
    except ImportError as e:
        raise ImportError(EXTRA_HINT) from e
    return transformers


@dataclass(frozen=True)
class Architecture:
    """Where a causal LM keeps its blocks (``blocks(model)``) and, on a block, ln₂ (``ffn_norm``) and the FFN (``ffn``)."""

    blocks: Callable[[nn.Module], Sequence[nn.Module]]
    ffn_norm: str
    ffn: str


_LLAMA = Architecture(lambda m: m.model.layers, "post_attention_layernorm", "mlp")
#: ``config.model_type`` → where its FFN branch is (GPT-2 has a closed form in probes.ffn)
ARCHITECTURES: dict[str, Architecture] = {
    "gpt2": Architecture(lambda m: m.transformer.h, "ln_2", "mlp"), "llama": _LLAMA,
    "mistral": _LLAMA, "qwen2": _LLAMA, "qwen3": _LLAMA}


def random_gpt2(width: int, depth: int, heads: int, seed: int, *, dtype: torch.dtype,
                device: torch.device | str = "cpu") -> nn.Module:
    """A randomly initialized ``GPT2LMHeadModel`` (GPT-2's own init, dropout off, eval mode),
    drawn in float32 from ``seeded_generator(seed, STREAM_WEIGHTS)``'s seed in a forked RNG, then
    cast to ``dtype`` (float32 and float64 measure the same network)."""
    tf = transformers_module()
    cfg = tf.GPT2Config(n_embd=width, n_layer=depth, n_head=heads, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seeded_generator(seed, STREAM_WEIGHTS).initial_seed())
        model = tf.GPT2LMHeadModel(cfg)
    return model.to(device=device, dtype=dtype).eval()


def load_pretrained(pretrained: str, *, dtype: torch.dtype, device: torch.device | str = "cpu") -> nn.Module:
    """``AutoModelForCausalLM.from_pretrained(pretrained)`` in ``dtype`` on ``device``, eval mode.

    Raises:
        ValueError: an architecture without an entry in :data:`ARCHITECTURES`.
        OSError: what ``from_pretrained`` raises.
    """
    tf = transformers_module()
    model = tf.AutoModelForCausalLM.from_pretrained(pretrained)
    kind = model.config.model_type
    if kind not in ARCHITECTURES:
        raise ValueError(f"model.pretrained={pretrained!r} is a {kind!r} model; model=gpt2 knows "
                         f"where the FFN branch is in {', '.join(ARCHITECTURES)}")
    return model.to(device=device, dtype=dtype).eval()


class CausalLM(nn.Module):
    """E members (seeds) of one causal-LM architecture with a fixed prompt and token ``position``.

    Raises:
        ValueError: members of different shapes, an empty prompt, a token id outside the
            vocabulary, or a position outside the prompt.
    """

    def __init__(self, members: Sequence[nn.Module], seeds: Sequence[int], prompt_ids: Sequence[int],
                 position: int = -1):
        super().__init__()
        self.members = nn.ModuleList(members)
        self.seeds = [int(s) for s in seeds]
        cfg = members[0].config
        self.model_type = cfg.model_type
        self.arch = ARCHITECTURES[self.model_type]
        self.width = int(cfg.hidden_size)
        self.depth = len(self.arch.blocks(members[0]))
        if any(m.config.hidden_size != self.width or len(self.arch.blocks(m)) != self.depth
               for m in members):
            raise ValueError("the members of a CausalLM must share one shape")
        ids = [int(i) for i in prompt_ids]
        if not ids or min(ids) < 0 or max(ids) >= cfg.vocab_size:
            raise ValueError(f"model.prompt_ids={ids}: need ≥ 1 token ids in [0, {cfg.vocab_size})")
        if not -len(ids) <= position < len(ids):
            raise ValueError(f"model.position={position} is outside the prompt of {len(ids)} tokens")
        self.register_buffer("prompt_ids", torch.tensor([ids], dtype=torch.long), persistent=False)
        self.position = position

    def blocks(self, member: int) -> Sequence[nn.Module]:
        return self.arch.blocks(self.members[member])

    def ffn_parts(self, member: int, layer: int) -> tuple[nn.Module, nn.Module]:
        """(ln₂, mlp) of block ``layer`` (1-based) of member ``member``."""
        block = self.blocks(member)[layer - 1]
        return getattr(block, self.arch.ffn_norm), getattr(block, self.arch.ffn)

    def ffn_branch(self, member: int, layer: int) -> Callable[[Tensor], Tensor]:
        """The FFN branch ``x ↦ mlp(ln₂(x))`` of block ``layer``, ``(…, d) → (…, d)``."""
        norm, mlp = self.ffn_parts(member, layer)
        return lambda x: mlp(norm(x))

    @torch.no_grad()
    def trace(self, member: int) -> tuple[Tensor, Tensor]:
        """One forward pass of the prompt at the chosen position: ``stream`` ``(L + 1, d)`` (``h_0``
        and each block's output) and ``ffn_in`` ``(L, d)`` (the stream entering each FFN branch).
        """
        model, pos = self.members[member], self.position
        blocks = self.blocks(member)
        stream: list[Tensor | None] = [None] * (self.depth + 1)
        ffn_in: list[Tensor | None] = [None] * self.depth

        def first_input(_mod, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            stream[0] = h[0, pos].detach().clone()

        def output(l):
            def hook(_mod, _args, out):
                h = out[0] if isinstance(out, tuple) else out
                stream[l] = h[0, pos].detach().clone()
            return hook

        def norm_input(l):
            def hook(_mod, args):
                ffn_in[l - 1] = args[0][0, pos].detach().clone()
            return hook

        handles = [blocks[0].register_forward_pre_hook(first_input, with_kwargs=True)]
        for l, block in enumerate(blocks, 1):
            handles.append(block.register_forward_hook(output(l)))
            handles.append(getattr(block, self.arch.ffn_norm).register_forward_pre_hook(norm_input(l)))
        try:
            model(input_ids=self.prompt_ids, use_cache=False)
        finally:
            for h in handles:
                h.remove()
        if any(t is None for t in stream + ffn_in):
            raise RuntimeError(f"{self.model_type}: a block or its FFN norm was not called")
        return torch.stack(stream), torch.stack(ffn_in)


def build_causal_lm(*, config: str, pretrained: str | None, width: int, depth: int,
                    heads: int | None, seeds: Sequence[int], prompt_ids: Sequence[int],
                    prompt: str | None, tokenizer: str | None, position: int,
                    dtype: torch.dtype, device: torch.device | str) -> CausalLM:
    """The :class:`CausalLM` of a ``model=gpt2`` config: one random model per seed, or one pretrained
    of shape width × depth; a text ``prompt`` is tokenized by ``tokenizer`` (default ``pretrained``).

    Raises:
        ValueError: a checkpoint of another shape, a text prompt without tokenizer, or what
            :class:`CausalLM` raises.
    """
    if prompt is not None:
        source = tokenizer or pretrained
        if not source:
            raise ValueError("model.prompt (text) needs a tokenizer: set model.tokenizer or "
                             "model.pretrained (a local directory or hub id)")
        tokenizer_ = transformers_module().AutoTokenizer.from_pretrained(source)
        prompt_ids = tokenizer_(prompt)["input_ids"]
    if pretrained:
        members, seeds = [load_pretrained(pretrained, dtype=dtype, device=device)], list(seeds)[:1]
    else:
        h = heads or default_heads(width, config)
        members = [random_gpt2(width, depth, h, s, dtype=dtype, device=device) for s in seeds]
    lm = CausalLM(members, seeds, prompt_ids, position).to(device)
    if (lm.width, lm.depth) != (width, depth):
        raise ValueError(f"model.pretrained={pretrained!r} has width × depth {lm.width} × "
                         f"{lm.depth}, the config says {width} × {depth}")
    log.info("%s: d=%d, L=%d, %d member(s), prompt of %d tokens, position %d",
             pretrained or f"random {config}", width, depth, len(members), len(prompt_ids), position)
    return lm
