"""The CIFAR-10 ConvNets of He et al. (2016, §4.2): plain and residual networks of depth 6n+2.

A 3×3 stem (16 filters), three stages of n blocks of two 3×3 convs (16, 32, 64 filters at
32×32, 16×16, 8×8; stride 2 at a stage's first conv), global average pool and a 10-way fully
connected layer.  Every conv is biasless and followed by BN; a block is
``y = ReLU(BN(conv₂(ReLU(BN(conv₁ x)))) + s(x))``, ``s`` the identity or, at a stage change,
*option A* (subsample, zero-pad channels); the plain network drops ``+ s(x)``.  Init: He's
fan-out normal for convs, BN (1, 0), the classifier ``U(±1/√fan_in)`` with zero bias.  Each
parameter has a leading member axis E; activations are ``(B, E·C, H, W)`` (grouped convs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..seeding import normal_many_, uniform_

#: the depths of He et al.'s CIFAR-10 table (n = 3, 5, 7, 9, 18)
HE_DEPTHS = (20, 32, 44, 56, 110)
#: He et al. 2016 Table 6: ResNet test error (%) on CIFAR-10 at those depths
HE_RESNET_TEST_ERROR = {20: 8.75, 32: 7.51, 44: 7.17, 56: 6.97, 110: 6.43}
#: He et al. 2016 Table 6: parameters (millions)
HE_PARAMS_M = {20: 0.27, 32: 0.46, 44: 0.66, 56: 0.85, 110: 1.7}
IMAGE_SHAPE = (3, 32, 32)

#: ``on_response(layer, tensor)``: called with each 3×3 conv's output after BN (before the
#: shortcut add and the ReLU), ``layer`` = 1 … 6n+1 in network order, tensor ``(B, E·C, H, W)``
ResponseHook = Callable[[int, Tensor], None]


def blocks_per_stage(depth: int) -> int:
    """n of depth = 6n + 2.

    Raises:
        ValueError: depth not of the form 6n+2 with n ≥ 1 (lists He et al.'s depths).
    """
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 8 or (depth - 2) % 6:
        raise ValueError(
            f"depth={depth!r}: a CIFAR ResNet has depth 6n+2 with n ≥ 1 (8, 14, 20, …; He et al. "
            f"use {', '.join(map(str, HE_DEPTHS))})"
        )
    return (depth - 2) // 6


class MemberConv(nn.Module):
    """A biasless 3×3 conv (padding 1) for E members: weight ``(E, c_out, c_in, 3, 3)``; input
    ``(B, c_in, H, W)`` shared by the members (``shared_input``: the stem) or ``(B, E·c_in, H, W)``
    (a grouped conv, ``groups=E``)."""

    def __init__(self, members: int, c_in: int, c_out: int, stride: int = 1, *,
                 shared_input: bool = False, dtype=torch.float32, device="cpu"):
        super().__init__()
        self.c_in, self.c_out, self.stride, self.shared_input = c_in, c_out, stride, shared_input
        self.weight = nn.Parameter(torch.empty(members, c_out, c_in, 3, 3, dtype=dtype,
                                               device=device))

    def forward(self, x: Tensor) -> Tensor:
        members = self.weight.shape[0]
        w = self.weight.reshape(members * self.c_out, self.c_in, 3, 3)
        return F.conv2d(x, w, stride=self.stride, padding=1,
                        groups=1 if self.shared_input else members)


class MemberBatchNorm(nn.Module):
    """Batch norm over ``(B, E·C, H, W)``: per member and channel, scale/shift ``(E, C)``,
    running statistics ``(E, C)`` (updated with ``momentum`` in training mode — torch's
    BatchNorm2d convention, unbiased variance — and used in eval mode)."""

    def __init__(self, members: int, channels: int, *, eps: float = 1e-5, momentum: float = 0.1,
                 dtype=torch.float32, device="cpu"):
        super().__init__()
        kw = {"dtype": dtype, "device": device}
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(members, channels, **kw))
        self.bias = nn.Parameter(torch.zeros(members, channels, **kw))
        self.register_buffer("running_mean", torch.zeros(members, channels, **kw))
        self.register_buffer("running_var", torch.ones(members, channels, **kw))

    def forward(self, x: Tensor) -> Tensor:
        # views of the buffers: the in-place running update lands in them
        return F.batch_norm(x, self.running_mean.view(-1), self.running_var.view(-1),
                            self.weight.view(-1), self.bias.view(-1), self.training,
                            self.momentum, self.eps)


def shortcut_option_a(x: Tensor, members: int, c_out: int, stride: int) -> Tensor:
    """He et al.'s option-A shortcut: subsample by ``stride`` (the top-left pixel of each
    ``stride × stride`` cell, where a stride-2 3×3 conv with padding 1 centres its outputs) and
    append zero channels up to ``c_out`` per member. ``x``: ``(B, E·c_in, H, W)`` →
    ``(B, E·c_out, H/stride, W/stride)``; the identity when nothing changes."""
    if stride != 1:
        x = x[:, :, ::stride, ::stride]
    batch, channels, h, w = x.shape
    c_in = channels // members
    if c_out == c_in:
        return x
    x = x.reshape(batch, members, c_in, h, w)
    return F.pad(x, (0, 0, 0, 0, 0, c_out - c_in)).reshape(batch, members * c_out, h, w)


class BasicBlock(nn.Module):
    """Two 3×3 conv + BN layers, ReLU between, the option-A shortcut added when ``residual``;
    ``first_layer``: the network index of the first conv (for response hooks)."""

    def __init__(self, members: int, c_in: int, c_out: int, stride: int, residual: bool,
                 first_layer: int, *, dtype=torch.float32, device="cpu"):
        super().__init__()
        kw = {"dtype": dtype, "device": device}
        self.members, self.c_in, self.c_out, self.stride = members, c_in, c_out, stride
        self.residual, self.first_layer = residual, first_layer
        self.conv1 = MemberConv(members, c_in, c_out, stride, **kw)
        self.bn1 = MemberBatchNorm(members, c_out, **kw)
        self.conv2 = MemberConv(members, c_out, c_out, 1, **kw)
        self.bn2 = MemberBatchNorm(members, c_out, **kw)

    @property
    def downsamples(self) -> bool:
        """Whether this block changes resolution and width (its shortcut is option A's)."""
        return self.stride != 1 or self.c_in != self.c_out

    def shortcut(self, x: Tensor) -> Tensor:
        return shortcut_option_a(x, self.members, self.c_out, self.stride)

    def forward(self, x: Tensor, on_response: ResponseHook | None = None) -> Tensor:
        r1 = self.bn1(self.conv1(x))
        r2 = self.bn2(self.conv2(F.relu(r1)))
        if on_response is not None:
            on_response(self.first_layer, r1)
            on_response(self.first_layer + 1, r2)
        return F.relu(r2 + self.shortcut(x) if self.residual else r2)


class CifarResNet(nn.Module):
    """He et al.'s CIFAR-10 network of depth 6n+2, residual or plain, for E members.

    Args:
        depth: 6n + 2 (n ≥ 1).  residual: shortcuts every two convs, or none.
        base_width: filters of stage 1 (stages 2 and 3 have 2× and 4×).
        seeds: one per member; draws numbered in network order (stem, conv₁, conv₂, …,
            classifier weight; :func:`rankexp.seeding.normal_many_`).

    Raises:
        ValueError: depth not 6n+2, base_width < 1, no seeds.

    Input ``(B, 3·32·32)`` (flattened, channel-major, as :class:`~rankexp.tasks.data.DeviceDataset`
    holds it) or ``(B, 3, 32, 32)``, shared by the members; output logits ``(E, B, num_classes)``.
    """

    family = "cifar_resnet"

    def __init__(self, depth: int, *, residual: bool = True, base_width: int = 16,
                 seeds: Sequence[int] = (0,), num_classes: int = 10, dtype=torch.float32,
                 device: torch.device | str = "cpu"):
        super().__init__()
        n = blocks_per_stage(depth)
        if base_width < 1:
            raise ValueError(f"base_width={base_width} must be ≥ 1")
        self.seeds = [int(s) for s in seeds]
        if not self.seeds:
            raise ValueError("seeds: give at least one (one per member)")
        members = len(self.seeds)
        kw = {"dtype": dtype, "device": device}
        self.depth, self.n, self.residual, self.base_width = depth, n, bool(residual), base_width
        self.num_classes, self.in_features = num_classes, math.prod(IMAGE_SHAPE)
        self.stem = MemberConv(members, IMAGE_SHAPE[0], base_width, shared_input=True, **kw)
        self.stem_bn = MemberBatchNorm(members, base_width, **kw)
        blocks, c_in, layer = [], base_width, 2
        for stage in range(3):
            c_out = base_width * 2**stage
            for b in range(n):
                stride = 2 if stage > 0 and b == 0 else 1
                blocks.append(BasicBlock(members, c_in, c_out, stride, self.residual, layer, **kw))
                c_in, layer = c_out, layer + 2
        self.blocks = nn.ModuleList(blocks)
        self.fc_weight = nn.Parameter(torch.empty(members, num_classes, c_in, **kw))
        self.fc_bias = nn.Parameter(torch.zeros(members, num_classes, **kw))
        # He fan-out init of the convs (std √(2/(k² c_out))), then the U(±1/√fan_in) classifier
        # weight; BN starts at (1, 0) and the classifier bias at 0
        convs = self.convs
        normal_many_([(conv.weight.data, i, math.sqrt(2.0 / (9 * conv.c_out)))
                      for i, conv in enumerate(convs)], self.seeds)
        bound = 1.0 / math.sqrt(c_in)
        uniform_(self.fc_weight.data, self.seeds, len(convs), low=-bound, high=bound)

    @property
    def members(self) -> int:
        return len(self.seeds)

    @property
    def convs(self) -> list[MemberConv]:
        """The 6n+1 conv layers in network order (index i ↔ layer i+1)."""
        return [self.stem] + [c for blk in self.blocks for c in (blk.conv1, blk.conv2)]

    @property
    def conv_layers(self) -> int:
        return 6 * self.n + 1

    def architecture(self) -> dict:
        """What defines this network besides its weights (checkpoints are checked against it)."""
        names = ("family", "depth", "residual", "base_width", "num_classes")
        return {**{k: getattr(self, k) for k in names}, "seeds": list(self.seeds),
                "dtype": str(self.fc_weight.dtype)}

    def parameter_count(self) -> int:
        """Trainable parameters of one member (He et al.'s count: 0.27 M at depth 20)."""
        return sum(p[0].numel() for p in self.parameters())

    def images(self, x: Tensor) -> Tensor:
        """``(B, 3072)`` or ``(B, 3, 32, 32)`` → ``(B, 3, 32, 32)`` (a view)."""
        return x.view(x.shape[0], *IMAGE_SHAPE) if x.dim() == 2 else x

    def stem_forward(self, x: Tensor, on_response: ResponseHook | None = None) -> Tensor:
        """Layer 1: ReLU(BN(conv(x))) → ``(B, E·w, 32, 32)``."""
        r = self.stem_bn(self.stem(self.images(x)))
        if on_response is not None:
            on_response(1, r)
        return F.relu(r)

    def head(self, h: Tensor) -> Tensor:
        """Global average pool and classifier: ``(B, E·4w, 8, 8)`` → logits ``(E, B, classes)``."""
        pooled = h.mean((2, 3)).view(h.shape[0], self.members, -1).transpose(0, 1)
        return torch.baddbmm(self.fc_bias[:, None, :], pooled, self.fc_weight.mT)

    def forward(self, x: Tensor, on_response: ResponseHook | None = None,
                lesion: int | None = None) -> Tensor:
        """Logits ``(E, B, num_classes)``.

        Args:
            x: images ``(B, 3072)`` or ``(B, 3, 32, 32)``, shared by the members.
            on_response: see :data:`ResponseHook`.
            lesion: index (0 … 3n−1) of a block replaced by its shortcut alone (Veit et al.
                2016's lesion; option A at a stage change), or None.
        """
        h = self.stem_forward(x, on_response)
        for i, blk in enumerate(self.blocks):
            h = blk.shortcut(h) if i == lesion else blk(h, on_response)
        return self.head(h)
