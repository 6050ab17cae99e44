"""Independent random streams per seed, shared by every model family and task.

Member ``e`` of an ensemble with seed ``s`` draws from the same streams a one-member model with
seed ``s`` draws from, so batching seeds never changes a number.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

#: Independent random streams derived from one seed (see :func:`seeded_generator`).
STREAM_WEIGHTS, STREAM_INPUT, STREAM_HEAD, STREAM_DATA = 0, 1, 2, 3


def seeded_generator(seed: int, stream: int) -> torch.Generator:
    """A CPU generator for one independent random stream of one seed.

    Streams (:data:`STREAM_WEIGHTS`, :data:`STREAM_INPUT`, …) are derived with
    NumPy's ``SeedSequence`` so the weights of seed 1 never share bits with the
    input of seed 0.
    """
    state = np.random.SeedSequence([int(seed), int(stream)]).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state) & 0x7FFF_FFFF_FFFF_FFFF)


def gaussian_input(
    seeds: Sequence[int], width: int, batch: int = 1, *, dtype=torch.float64, device="cpu"
) -> Tensor:
    """Standard Gaussian inputs ``h_0``, shape ``(E, batch, width)``, one draw per seed.

    ``E[h_0²] = 1`` per coordinate, so ``rms(h_0) ≈ 1`` as the study assumes.
    """
    rows = [
        torch.randn(batch, width, generator=seeded_generator(s, STREAM_INPUT), dtype=torch.float64)
        for s in seeds
    ]
    return torch.stack(rows).to(device=device, dtype=dtype)




def subset_indices(total: int, n: int, seed: int = 0) -> Tensor | None:
    """A fixed random subset of ``n`` of ``range(total)`` (int64 ``(n,)``, CPU), drawn from
    ``seeded_generator(seed, STREAM_INPUT)``; None when ``n ≥ total`` (take them all, in order).
    Data sets stored sorted by class need this rather than their first ``n`` items."""
    if n >= total:
        return None
    return torch.randperm(int(total), generator=seeded_generator(seed, STREAM_INPUT))[: int(n)]
