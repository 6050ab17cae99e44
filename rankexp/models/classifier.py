"""The classifier around a measured residual stack for training on CIFAR-10: an input
projection (3072 → d), the stack, and a linear head (d → 10), for E members at once (the
ensemble axis of a batched learning-rate sweep, :mod:`rankexp.tasks.loop`)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.func import functional_call

from ..seeding import STREAM_HEAD, seeded_generator
from ..tasks.data import IN_FEATURES
from .mlp import ResidualMLP

#: CIFAR-10's classes: the head's size
NUM_CLASSES = 10


class Classifier(nn.Module):
    """Input projection → :class:`ResidualMLP` stack → linear head, for E members.

    ``stack`` is built exactly as for measuring (a learning-rate sweep: ``seeds=[seed] *
    len(lrs)``).  The biasless projection ``w_in`` ``(E, d, in_features)`` and head ``w_out``
    ``(E, num_classes, d)`` are drawn in float64 on CPU from ``seeded_generator(seed,
    STREAM_HEAD)``, ``N(0, 1/fan_in)`` (``rms(h_0) ≈ rms(x)``); dtype and device follow the stack.
    """

    def __init__(
        self, stack: ResidualMLP, *, in_features: int = IN_FEATURES, num_classes: int = NUM_CLASSES
    ):
        super().__init__()
        ref = next(stack.parameters())
        members, width = stack.members, stack.width
        self.stack = stack
        self.in_features, self.num_classes = int(in_features), int(num_classes)
        kw = {"dtype": ref.dtype, "device": ref.device}
        self.w_in = nn.Parameter(torch.empty(members, width, self.in_features, **kw))
        self.w_out = nn.Parameter(torch.empty(members, self.num_classes, width, **kw))
        for e, seed in enumerate(stack.seeds):  # w_in then w_out, each N(0, 1/fan_in)
            g = seeded_generator(seed, STREAM_HEAD)
            for w in (self.w_in, self.w_out):
                fan_out, fan_in = w.shape[1:]
                draw = torch.randn(fan_out, fan_in, generator=g, dtype=torch.float64)
                w.data[e].copy_(draw / math.sqrt(fan_in))

    @property
    def members(self) -> int:
        return self.stack.members

    def architecture(self) -> dict:
        """What defines this network besides its weights (checkpoints are checked against it)."""
        stack = self.stack
        names = ("width", "depth", "matrices", "activation", "placement", "norm_op", "alpha",
                 "skip_every")
        return {**{k: getattr(stack, k) for k in names}, "hidden": stack.blocks[0].hidden,
                "beta": stack.beta_eff, "seeds": list(stack.seeds),
                "in_features": self.in_features, "num_classes": self.num_classes,
                "dtype": str(self.w_in.dtype)}

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``(E, B, num_classes)`` for inputs ``x`` ``(B, in_features)`` shared by all members."""
        if self.members == 1:
            return self._forward_one(x)[None]
        members, width = self.w_in.shape[:2]
        # One (B, in) × (in, E·d) GEMM instead of E broadcast copies of x.
        h0 = (x @ self.w_in.reshape(members * width, -1).mT).view(-1, members, width)
        return self.stack(h0.transpose(0, 1)) @ self.w_out.mT

    def _forward_one(self, x: Tensor) -> Tensor:
        """E = 1 with the member axis squeezed out of every weight, so each product is a plain
        ``mm``: a batch-of-one ``bmm`` and its backward (which transposes into non-contiguous
        gradients that autograd then copies) cost ~25 % more per step on CPU. ``squeeze`` is a
        view whose backward is a view too (``[0]`` would allocate a zero-filled gradient)."""
        weights = {name: p.squeeze(0) for name, p in self.stack.named_parameters()}
        h0 = x @ self.w_in.squeeze(0).mT
        return functional_call(self.stack, weights, (h0,)) @ self.w_out.squeeze(0).mT
