"""Probes of the CIFAR ConvNets (:class:`~rankexp.models.convnet.CifarResNet`): layer responses
(He et al. 2016, Fig. 7), initial gradient norms (the BN paradox, Yang et al. 2019) and lesions
(Veit et al. 2016).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F

from ..instruments.blocks import eval_mode  # as tested: BN with running statistics
from ..models.convnet import CifarResNet
from ..result import Measurement
from ..seeding import subset_indices
from .base import probe_options

if TYPE_CHECKING:
    from ..tasks.data import DeviceDataset


class ImageProbeContext:
    """A ConvNet under test (``model``, E members), CIFAR-10 on its device (``data``, images
    ``(N, 3072)``), ``options`` (``task.options``), and whether it is ``trained`` (measured as tested).
    """

    def __init__(self, model: CifarResNet, data: DeviceDataset, options: dict | None = None, *,
                 trained: bool = False):
        self.model, self.data, self.options, self.trained = model, data, dict(options or {}), trained

    def probe_options(self, name: str) -> dict:
        return probe_options(self.options, name)

    def images(self, split: str, n: int, seed: int = 0) -> tuple[Tensor, Tensor]:
        """``n`` images of ``split`` (train | test) and labels: all in order, or a fixed random
        subset of ``seed``. Raises ValueError for n < 1."""
        x, y = getattr(self.data, f"x_{split}"), getattr(self.data, f"y_{split}")
        if n < 1:
            raise ValueError(f"{split} images: n={n} must be ≥ 1")
        idx = subset_indices(x.shape[0], n, seed)
        if idx is None:
            return x, y
        idx = idx.to(x.device)
        return x[idx], y[idx]


@contextlib.contextmanager
def training_mode_untouched(model: CifarResNet):
    """Batch norm with batch statistics; running statistics and mode restored afterwards."""
    saved, was_training = {k: b.clone() for k, b in model.named_buffers()}, model.training
    model.train()
    try:
        yield
    finally:
        with torch.no_grad():
            for k, b in model.named_buffers():
                b.copy_(saved[k])
        model.train(was_training)


@torch.no_grad()
def probe_layer_response(ctx: ImageProbeContext) -> Measurement:
    """Std of every 3×3 layer's response (after BN, before add/ReLU) on test images.

    Options ``images``, ``batch``."""
    opts = ctx.probe_options("layer_response")
    model, members, layers = ctx.model, ctx.model.members, ctx.model.conv_layers
    x, _ = ctx.images("test", int(opts["images"]))
    dev = x.device
    s1 = torch.zeros(members, layers, dtype=torch.float64, device=dev)
    s2 = torch.zeros_like(s1)
    count = torch.zeros(layers, dtype=torch.float64, device=dev)

    def hook(layer: int, r: Tensor) -> None:
        v = r.reshape(r.shape[0], members, -1)
        s1[:, layer - 1] += v.sum((0, 2), dtype=torch.float64)
        s2[:, layer - 1] += v.square().sum((0, 2), dtype=torch.float64)
        count[layer - 1] += v.shape[0] * v.shape[2]

    mode = eval_mode(model) if ctx.trained else training_mode_untouched(model)
    with mode:
        for chunk in x.split(int(opts["batch"])):
            model(chunk, on_response=hook)
    mean = s1 / count
    std = (s2 / count - mean.square()).clamp_min(0).sqrt()
    steps = np.arange(1, layers + 1)
    out = Measurement()
    out.add_seed_series("response_std", std, steps)
    out.add_seed_series("response_std_sorted", std.sort(dim=1, descending=True).values, steps)
    out.add_seed_stat("response_std_mean", std.mean(1))
    return out


def probe_init_gradient_norms(ctx: ImageProbeContext) -> Measurement:
    """Per-conv weight-gradient norms at initialization on one fixed batch of training images.

    Options ``batch``, ``batch_seed``; ``grad_ratio`` = ‖∂ℓ/∂W₂‖_F / ‖∂ℓ/∂W_{6n+1}‖_F (ℓ the mean
    cross-entropy). The model is left as it was.

    Raises:
        ValueError: the network is trained.
    """
    if ctx.trained:
        raise ValueError("init_gradient_norms measures the initial network; under task=train "
                         "it runs before the first step")
    opts = ctx.probe_options("init_gradient_norms")
    model = ctx.model
    x, y = ctx.images("train", int(opts["batch"]), seed=int(opts["batch_seed"]))
    weights = [conv.weight for conv in model.convs]
    with training_mode_untouched(model):
        logits = model(x)  # (E, B, C)
        members, batch, classes = logits.shape
        ce = F.cross_entropy(logits.reshape(-1, classes), y.repeat(members), reduction="none")
        grads = torch.autograd.grad(ce.view(members, batch).mean(1).sum(), weights)
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads], 1).double()  # (E, 6n+1)
    out = Measurement()
    out.add_seed_series("grad_norm", norms, np.arange(1, norms.shape[1] + 1))
    ratio = norms[:, 1] / norms[:, -1]
    out.add_seed_stat("grad_ratio", ratio)
    out.add_seed_stat("log10_grad_ratio", ratio.log10())
    return out


@torch.no_grad()
def probe_lesion(ctx: ImageProbeContext) -> Measurement:
    """Test error of the trained network with each block in turn replaced by its shortcut.

    Options ``images``, ``batch``; ValueError if the network is not trained.
    """
    if not ctx.trained:
        raise ValueError("lesion measures a trained network (task=train, task.probes=[lesion])")
    opts = ctx.probe_options("lesion")
    model, members = ctx.model, ctx.model.members
    blocks = list(model.blocks)
    x, y = ctx.images("test", int(opts["images"]))
    wrong = torch.zeros(members, len(blocks) + 1, dtype=torch.float64, device=x.device)
    with eval_mode(model):
        for xc, yc in zip(x.split(int(opts["batch"])), y.split(int(opts["batch"])), strict=True):
            h = model.stem_forward(xc)
            inputs = []
            for blk in blocks:
                inputs.append(h)
                h = blk(h)
            wrong[:, 0] += (model.head(h).argmax(-1) != yc).sum(1)
            for b, blk in enumerate(blocks):
                h = blk.shortcut(inputs[b])
                for later in blocks[b + 1:]:
                    h = later(h)
                wrong[:, b + 1] += (model.head(h).argmax(-1) != yc).sum(1)
    error = wrong / x.shape[0]
    out = Measurement()
    out.add_seed_stat("lesion_intact_error", error[:, 0])
    out.add_seed_series("lesion_error", error[:, 1:], np.arange(1, len(blocks) + 1))
    out.add_seed_stat("lesion_error_mean", error[:, 1:].mean(1))
    out.arrays["lesion_downsampling_blocks"] = np.array(
        [i + 1 for i, blk in enumerate(blocks) if blk.downsamples])
    return out
