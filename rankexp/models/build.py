"""The builders of the model families (``model=``; see :mod:`rankexp.models`), one per family,
named by its declaration (:mod:`.families`).  Each takes a validated config; members are the
seeds ``seed … seed+seeds−1`` unless ``seeds`` is given (training: one member per learning rate,
all with the same seed); ``dtype`` defaults to the config's.  Models never import probes.
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


def _members(s: RankexpConfig, seeds, dtype, device) -> dict:
    """The keywords every network takes: ``seeds``, ``dtype``, ``device``."""
    return {"seeds": range(s.seed, s.seed + s.seeds) if seeds is None else seeds,
            "dtype": dtype or DTYPES[s.dtype.value], "device": device}


def build_mlp(s: RankexpConfig, device: torch.device | str = "cpu", seeds=None,
              dtype: torch.dtype | None = None, streamed: bool = False) -> ResidualMLP:
    """The :class:`ResidualMLP`; ``streamed``: weights drawn block by block as a walk reaches
    them."""
    n = s.norm
    return ResidualMLP(
        s.width, s.depth, expansion=s.expansion, matrices=s.matrices,
        activation=s.activation.value, placement=n.placement.value, norm_op=n.op.value,
        pre=n.pre.value, out=n.out.value, post=n.post.value, alpha=s.alpha, beta=s.beta,
        beta_scaling=s.beta_scaling.value, skip_every=s.skip_every, streamed=streamed,
        **_members(s, seeds, dtype, device))


def build_plain(s: RankexpConfig, device: torch.device | str = "cpu", seeds=None,
                dtype: torch.dtype | None = None) -> PlainNet:
    """The :class:`PlainNet` (``model=plain``): σ_w = ``alpha``, σ_b = ``bias``, ``init``, the
    norm op before φ when ``norm=pre`` (none for ``norm=none``)."""
    return PlainNet(
        s.width, s.depth, activation=s.activation.value, alpha=s.alpha, bias=s.bias,
        init=s.init.value, norm_op=None if s.norm.placement.value == "none" else s.norm.op.value,
        beta=s.beta, beta_scaling=s.beta_scaling.value, skip_every=s.skip_every,
        **_members(s, seeds, dtype, device))


def build_gpt2(s: RankexpConfig, device: torch.device | str = "cpu", seeds=None,
               dtype: torch.dtype | None = None) -> CausalLM:
    """The :class:`CausalLM` of ``model=gpt2``: random init of shape width × depth (one network
    per seed) or the ``model.pretrained`` checkpoint; the prompt and position of ``model``."""
    m = s.model
    return build_causal_lm(
        config=m.config, pretrained=m.pretrained, width=s.width, depth=s.depth, heads=m.n_head,
        prompt_ids=m.prompt_ids, prompt=m.prompt, tokenizer=m.tokenizer, position=m.position,
        **_members(s, seeds, dtype, device))


def build_cifar_resnet(s: RankexpConfig, device: torch.device | str = "cpu", seeds=None,
                       dtype: torch.dtype | None = None) -> CifarResNet:
    """The :class:`CifarResNet`: top-level ``depth`` (6n+2), ``model.residual``,
    ``model.base_width``."""
    return CifarResNet(s.depth, residual=s.model.residual, base_width=s.model.base_width,
                       **_members(s, seeds, dtype, device))


def build_model(s: RankexpConfig, device: torch.device | str = "cpu", seeds=None,
                dtype: torch.dtype | None = None, streamed: bool = False) -> nn.Module:
    """The network of the config's model family (its declared builder) on ``device``;
    ``streamed`` only for families that stream (:attr:`~.families.base.Family.streams`).

    Raises:
        ValueError: ``streamed`` for a family that does not stream.
    """
    return family_of(s).build(s, device, seeds=seeds, dtype=dtype, streamed=streamed)
