"""Independent random streams per seed, shared by every model family and task.

Weight draw k of seed s comes from ``Generator(SFC64(SeedSequence([s, stream, k])))``
(:func:`block_generator`) in float64 on the CPU, then rounded to the weight's dtype and device:
a member equals the one-member network of its seed, and CPU and CUDA hold the same weights, bit
for bit. Inputs and other small draws use :func:`seeded_generator` (torch's CPU generator).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from torch import Tensor

STREAM_WEIGHTS, STREAM_INPUT, STREAM_HEAD, STREAM_DATA = 0, 1, 2, 3


def seeded_generator(seed: int, stream: int) -> torch.Generator:
    """A CPU generator for ``stream`` of ``seed``, keyed by ``SeedSequence([seed, stream])``."""
    key = np.random.SeedSequence([int(seed), int(stream)]).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(key) & 0x7FFF_FFFF_FFFF_FFFF)


def gaussian_input(seeds: Sequence[int], width: int, batch: int = 1, *, dtype=torch.float64,
                   device="cpu") -> Tensor:
    """Standard Gaussian inputs ``h_0`` ``(E, batch, width)``, one draw per seed."""
    rows = [torch.randn(batch, width, generator=seeded_generator(s, STREAM_INPUT),
                        dtype=torch.float64) for s in seeds]
    return torch.stack(rows).to(device=device, dtype=dtype)


def subset_indices(total: int, n: int, seed: int = 0) -> Tensor | None:
    """A fixed random subset (int64 ``(n,)``) of ``range(total)``; None when ``n ≥ total``."""
    if n >= total:
        return None
    return torch.randperm(int(total), generator=seeded_generator(seed, STREAM_INPUT))[: int(n)]


def block_generator(seed: int, stream: int, block: int) -> np.random.Generator:
    """The generator of draw ``block`` of stream ``stream`` of seed ``seed``."""
    return np.random.Generator(np.random.SFC64(np.random.SeedSequence([seed, stream, block])))


def _fill(out: Tensor, seed: int, stream: int, block: int, scale: float, low: float | None) -> None:
    direct = out.device.type == "cpu" and out.dtype == torch.float64 and out.is_contiguous()
    buf = out.detach().numpy().reshape(-1) if direct else np.empty(out.numel())
    g = block_generator(seed, stream, block)
    (g.standard_normal if low is None else g.random)(out=buf)
    buf *= scale
    if low is not None:
        buf += low
    if not direct:  # rounded on the CPU, then moved: every device holds the same numbers
        out.copy_(torch.from_numpy(buf).view(out.shape).to(out.dtype))


def draw_threads(jobs: int) -> int:
    """Threads the draws run on: torch's intra-op thread count, at most one per job."""
    return max(1, min(torch.get_num_threads(), jobs))


@torch.no_grad()
def _draw(targets: Sequence[tuple[Tensor, int, float]], seeds: Sequence[int], stream: int,
          low: float | None) -> None:
    jobs = []
    for out, block, scale in targets:
        if out.dim() < 1 or out.shape[0] != len(seeds):
            raise ValueError(f"draw {block}: out must have {len(seeds)} members first, "
                             f"got shape {tuple(out.shape)}")
        jobs.extend((out[e], int(s), int(stream), int(block), float(scale), low)
                    for e, s in enumerate(seeds))
    threads = draw_threads(len(jobs))
    if threads == 1:
        for job in jobs:
            _fill(*job)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda job: _fill(*job), jobs))


def normal_many_(targets: Sequence[tuple[Tensor, int, float]], seeds: Sequence[int],
                 stream: int = STREAM_WEIGHTS) -> None:
    """Fill each ``(out, block, scale)`` of ``targets``: ``out[e]`` ``(E, …)`` ←
    ``scale · N(0, 1)`` from :func:`block_generator` ``(seeds[e], stream, block)``, row-major.
    Raises ValueError: an ``out`` whose leading (member) axis is not ``len(seeds)``."""
    _draw(targets, seeds, stream, None)


def normal_(out: Tensor, seeds: Sequence[int], block: int, stream: int = STREAM_WEIGHTS, *,
            scale: float = 1.0) -> Tensor:
    """``out`` ``(E, …)`` ← ``scale · N(0, 1)``, member e from draw ``block`` of ``seeds[e]``."""
    _draw([(out, block, scale)], seeds, stream, None)
    return out


def uniform_(out: Tensor, seeds: Sequence[int], block: int, stream: int = STREAM_WEIGHTS, *,
             low: float = 0.0, high: float = 1.0) -> Tensor:
    """``out`` ``(E, …)`` ← ``U(low, high)``, member e from draw ``block`` of ``seeds[e]``."""
    _draw([(out, block, high - low)], seeds, stream, low)
    return out
