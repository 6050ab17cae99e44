"""On-device pad-crop-flip (rankexp/tasks/augment.py): exact crops, and their distribution."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from rankexp.tasks.augment import PadCropFlip

PAD, SIDE = 4, 9  # offsets 0 … 8


def coded_images(batch: int) -> torch.Tensor:
    """Pixel (c, i, j) of every image holds 1000 c + 32 i + j + 1 (> 0, unique per position)."""
    c, i, j = torch.meshgrid(torch.arange(3), torch.arange(32), torch.arange(32), indexing="ij")
    return (1000 * c + 32 * i + j + 1).double().expand(batch, 3, 32, 32).contiguous()


def recover(out: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dy, dx, flip) of each augmented coded image, read off its pixels."""
    dys, dxs, flips = [], [], []
    for img in out[:, 0]:  # channel 0: value = 32 i + j + 1, 0 on the padding
        r, s = 12, 12  # the centre 8×8 is never padding (offsets ≤ 8)
        v, right = int(img[r, s]) - 1, int(img[r, s + 1]) - 1
        i, j = divmod(v, 32)
        flip = right == v - 1
        dys.append(i - r + PAD)
        dxs.append(j - (31 - s) + PAD if flip else j - s + PAD)
        flips.append(int(flip))
    return np.array(dys), np.array(dxs), np.array(flips)


def reference(x: torch.Tensor, dy, dx, flip, fill: torch.Tensor) -> torch.Tensor:
    """Per image: pad with the fill, crop at (dy, dx), flip — written plainly."""
    out = torch.empty_like(x)
    for b in range(x.shape[0]):
        padded = fill.view(3, 1, 1).expand(3, 40, 40).clone()
        padded[:, PAD:PAD + 32, PAD:PAD + 32] = x[b]
        crop = padded[:, dy[b]:dy[b] + 32, dx[b]:dx[b] + 32]
        out[b] = crop.flip(-1) if flip[b] else crop
    return out


def test_each_output_is_the_crop_and_flip_of_the_padded_image():
    batch, fill = 64, torch.tensor([-1.5, -2.0, -0.5], dtype=torch.float64)
    aug = PadCropFlip(steps=3, batch_size=batch, seed=5, fill=fill)
    x = coded_images(batch)
    for step in range(3):
        out = aug(x.flatten(1), torch.tensor(step))
        assert out.shape == (batch, 3 * 32 * 32)
        dy, dx, flip = recover(out.view(batch, 3, 32, 32))
        torch.testing.assert_close(out.view(batch, 3, 32, 32), reference(x, dy, dx, flip, fill),
                                   rtol=0, atol=0)
        # what was recovered is what the table drew
        t_dy, t_dx, t_flip = (v.numpy() for v in aug.parameters_at(step))
        assert (dy == t_dy).all() and (dx == t_dx).all() and (flip == t_flip).all()
    # a function of (batch, step): the same step crops the same way, another step differently
    assert torch.equal(aug(x, 1), aug(x, torch.tensor(1)))
    assert not torch.equal(aug(x, 1), aug(x, 2))
    assert torch.equal(PadCropFlip(3, batch, seed=5, fill=fill)(x, 2), aug(x, 2))


def test_offsets_are_uniform_flips_fair_and_all_independent():
    """χ² tests over 64 steps × 512 images (32768 draws) read back from the images: the 81
    offsets uniform, flips Bernoulli(½), flip independent of the offset, dy of dx, and the
    draws of consecutive steps independent."""
    steps, batch = 64, 512
    aug = PadCropFlip(steps=steps, batch_size=batch, seed=11)
    x = coded_images(batch)
    draws = [recover(aug(x, step).view(batch, 3, 32, 32)) for step in range(steps)]
    dy = np.concatenate([d[0] for d in draws])
    dx = np.concatenate([d[1] for d in draws])
    flip = np.concatenate([d[2] for d in draws])
    n = dy.size
    assert dy.min() == dx.min() == 0 and dy.max() == dx.max() == 2 * PAD
    counts = np.bincount(dy * SIDE + dx, minlength=SIDE * SIDE)
    p_uniform = stats.chisquare(counts).pvalue
    p_flip = stats.binomtest(int(flip.sum()), n, 0.5).pvalue
    table = np.zeros((SIDE * SIDE, 2))
    np.add.at(table, (dy * SIDE + dx, flip), 1)
    p_flip_indep = stats.chi2_contingency(table).pvalue
    dydx = np.zeros((SIDE, SIDE))
    np.add.at(dydx, (dy, dx), 1)
    p_dy_dx = stats.chi2_contingency(dydx).pvalue
    lag = np.zeros((SIDE, SIDE))  # offset dy of image k at step t vs at step t+1
    per_step = dy.reshape(steps, batch)
    np.add.at(lag, (per_step[:-1].ravel(), per_step[1:].ravel()), 1)
    p_lag = stats.chi2_contingency(lag).pvalue
    print(f"p: uniform {p_uniform:.3f}, flip {p_flip:.3f}, flip⊥offset {p_flip_indep:.3f}, "
          f"dy⊥dx {p_dy_dx:.3f}, step⊥step {p_lag:.3f}")
    for p in (p_uniform, p_flip, p_flip_indep, p_dy_dx, p_lag):
        assert p > 1e-3
    # and the tests have power: one offset drawn twice as often, or flips at 52 %, are caught
    biased = counts.copy()
    biased[0] *= 2
    assert stats.chisquare(biased).pvalue < 1e-3
    assert stats.binomtest(int(0.52 * n), n, 0.5).pvalue < 1e-3


def test_bad_arguments():
    with pytest.raises(ValueError, match="steps=0"):
        PadCropFlip(steps=0, batch_size=4, seed=0)
