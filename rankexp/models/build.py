"""The builders of the model families (``model=``; see :mod:`rankexp.models`).

Each family is one module (``mlp.py``: the residual MLP of the study; ``plain.py``: the
mean-field plain networks of the textbook chapter; ``convnet.py``: He et al.'s CIFAR ResNets
and plain ConvNets; ``gpt2.py``: Hugging Face causal LMs, which imports ``transformers`` only
when built) and one builder here, named by the family's declaration (:mod:`.families`).
Models never import probes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from .convnet import CifarResNet
from .families import family_of
from .gpt2 import CausalLM, build_causal_lm
from .mlp import ResidualMLP
from .plain import PlainNet

if TYPE_CHECKING:
    from ..config import RankexpConfig

#: the config's ``dtype`` names → torch dtypes
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _seeds(s: RankexpConfig, seeds=None):
    """The members' seeds: ``seed … seed+seeds−1`` unless given."""
    return range(s.seed, s.seed + s.seeds) if seeds is None else seeds


def build_mlp(s: RankexpConfig, device: torch.device | str = "cpu", seeds=None,
              dtype: torch.dtype | None = None, streamed: bool = False) -> ResidualMLP:
    """The :class:`ResidualMLP` a validated config describes.

    Members are the seeds ``seed … seed+seeds−1`` unless ``seeds`` is given (training uses one
    member per learning rate, all with the same seed); ``dtype`` defaults to the config's;
    ``streamed``: weights drawn block by block as a walk reaches them (``ResidualMLP``).
    """
    return ResidualMLP(
        s.width,
        s.depth,
        expansion=s.expansion,
        matrices=s.matrices,
        activation=s.activation.value,
        placement=s.norm.placement.value,
        norm_op=s.norm.op.value,
        pre=s.norm.pre.value,
        out=s.norm.out.value,
        post=s.norm.post.value,
        alpha=s.alpha,
        beta=s.beta,
        beta_scaling=s.beta_scaling.value,
        skip_every=s.skip_every,
        seeds=_seeds(s, seeds),
        dtype=dtype or DTYPES[s.dtype.value],
        device=device,
        streamed=streamed,
    )


def build_plain(s: RankexpConfig, device: torch.device | str = "cpu", seeds=None,
                dtype: torch.dtype | None = None) -> PlainNet:
    """The :class:`PlainNet` a validated config describes (``model=plain``): σ_w = ``alpha``,
    σ_b = ``bias``, ``init``, the norm op before φ when ``norm=pre`` (none for ``norm=none``).

    Members and dtype as :func:`build_mlp`.
    """
    return PlainNet(
        s.width,
        s.depth,
        activation=s.activation.value,
        alpha=s.alpha,
        bias=s.bias,
        init=s.init.value,
        norm_op=None if s.norm.placement.value == "none" else s.norm.op.value,
        beta=s.beta,
        beta_scaling=s.beta_scaling.value,
        skip_every=s.skip_every,
        seeds=_seeds(s, seeds),
        dtype=dtype or DTYPES[s.dtype.value],
        device=device,
    )


def build_gpt2(s: RankexpConfig, device: torch.device | str = "cpu", seeds=None,
               dtype: torch.dtype | None = None) -> CausalLM:
    """The :class:`CausalLM` of ``model=gpt2``: random init of shape width × depth (one network
    per seed) or the ``model.pretrained`` checkpoint; the prompt and position of ``model``."""
    m = s.model
    return build_causal_lm(
        config=m.config, pretrained=m.pretrained, width=s.width, depth=s.depth, heads=m.n_head,
        seeds=_seeds(s, seeds),
        prompt_ids=m.prompt_ids, prompt=m.prompt, tokenizer=m.tokenizer, position=m.position,
        dtype=dtype or DTYPES[s.dtype.value], device=device)


def build_cifar_resnet(s: RankexpConfig, device: torch.device | str = "cpu", seeds=None,
                       dtype: torch.dtype | None = None) -> CifarResNet:
    """The :class:`CifarResNet` a validated config describes: top-level ``depth`` (6n+2),
    ``model.residual``, ``model.base_width``; members as for :func:`build_mlp`."""
    return CifarResNet(
        s.depth,
        residual=s.model.residual,
        base_width=s.model.base_width,
        seeds=_seeds(s, seeds),
        dtype=dtype or DTYPES[s.dtype.value],
        device=device,
    )


def build_model(s: RankexpConfig, device: torch.device | str = "cpu", seeds=None,
                dtype: torch.dtype | None = None, streamed: bool = False) -> nn.Module:
    """The network of the config's model family (``model=``; its declared builder), on
    ``device``; ``streamed`` (families that stream: :attr:`~.families.base.Family.streams`):
    weights drawn block by block as a walk reaches them.

    Raises:
        ValueError: ``streamed`` for a family that does not stream.
    """
    return family_of(s).build(s, device, seeds=seeds, dtype=dtype, streamed=streamed)

