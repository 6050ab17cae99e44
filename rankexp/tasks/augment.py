"""On-device pad-crop-flip for CIFAR-10 (He et al. 2016, §4.2), a pure function of
``(batch, step)`` (one uint8 draw table), CUDA-graph safe.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from ..seeding import seeded_generator

#: the random stream of the augmentation draws (after seeding.py's weights/input/head/data)
STREAM_AUGMENT = 4


class PadCropFlip:
    """Random pad-crop-flip of whole batches on their device from ``seed``'s ``STREAM_AUGMENT``.
    Raises ValueError: non-positive steps or batch size, negative pad."""

    def __init__(self, steps: int, batch_size: int, seed: int, *, pad: int = 4,
                 fill: Tensor | None = None, image_shape: tuple[int, int, int] = (3, 32, 32),
                 device: str | torch.device = "cpu"):
        if steps < 1 or batch_size < 1 or pad < 0:
            raise ValueError(f"steps={steps}, batch_size={batch_size} must be ≥ 1 and pad={pad} ≥ 0")
        self.steps, self.batch_size, self.seed, self.pad = int(steps), int(batch_size), int(seed), int(pad)
        self.image_shape = tuple(image_shape)
        self.device = torch.device(device)
        g = seeded_generator(self.seed, STREAM_AUGMENT)
        draws = torch.empty(self.steps, self.batch_size, 3, dtype=torch.uint8)
        draws[..., :2] = torch.randint(0, 2 * self.pad + 1, (self.steps, self.batch_size, 2),
                                       generator=g, dtype=torch.uint8)
        draws[..., 2] = torch.randint(0, 2, (self.steps, self.batch_size), generator=g,
                                      dtype=torch.uint8)
        #: ``(steps, B, 3)`` uint8: ``dy, dx, flip`` of every image of every step
        self.table = draws.to(self.device)
        c, h, w = self.image_shape
        self.fill = None if fill is None else torch.as_tensor(fill).to(self.device).view(1, c, 1, 1)
        self._rows = torch.arange(h, device=self.device)
        self._cols = torch.arange(w, device=self.device)

    @property
    def name(self) -> str:
        """Recorded in checkpoints with the recipe: another augmentation is another run."""
        return f"pad_crop_flip(pad={self.pad},seed={self.seed})"

    def parameters_at(self, step: Tensor | int) -> tuple[Tensor, Tensor, Tensor]:
        """``(dy, dx, flip)`` int64 ``(B,)`` each, of 0-based ``step`` (a device index)."""
        step = torch.as_tensor(step, device=self.device).view(1)
        row = self.table.index_select(0, step)[0].long()
        return row[:, 0], row[:, 1], row[:, 2]

    def __call__(self, x: Tensor, step: Tensor | int) -> Tensor:
        """The augmented batch, shaped as ``x``; ``step`` 0-based, an int or a 0-dim device tensor."""
        c, h, w = self.image_shape
        batch, p = x.shape[0], self.pad
        images = x.view(batch, c, h, w)
        if self.fill is None:
            padded = F.pad(images, (p, p, p, p))
        else:  # pad the offset from the fill with zeros, then add the fill back
            fill = self.fill.to(x.dtype)
            padded = F.pad(images - fill, (p, p, p, p)) + fill
        dy, dx, flip = self.parameters_at(step)
        dy, dx, flip = dy[:batch], dx[:batch], flip[:batch]
        rows = dy[:, None] + self._rows  # (B, H) rows of the padded image
        cols = dx[:, None] + torch.where(flip[:, None].bool(), w - 1 - self._cols, self._cols)
        hp, wp = h + 2 * p, w + 2 * p
        # one gather: flat index of (b, ch, rows[b, i], cols[b, j]) in the padded batch
        base = (torch.arange(batch, device=x.device)[:, None] * c
                + torch.arange(c, device=x.device)[None, :]) * hp  # (B, C)
        index = ((base[:, :, None] + rows[:, None, :])[..., None] * wp + cols[:, None, None, :])
        out = torch.take(padded, index)
        return out.view_as(x)

