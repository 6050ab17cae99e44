"""Spectral measures of matrices (science.md §2).

All functions take a batch of matrices ``(..., N, K)`` or of singular values
``(..., n)`` and reduce over the last axes, so seeds and layers stay batched.
"""

from __future__ import annotations

import torch
from torch import Tensor


def singular_values(a: Tensor) -> Tensor:
    """Singular values ``s_1 ≥ … ≥ s_n`` of ``a`` ``(..., N, K)`` → ``(..., min(N, K))``."""
    return torch.linalg.svdvals(a)


def erank_from_sv(s: Tensor) -> Tensor:
    """Effective rank ``exp(−Σ p_k ln p_k)``, ``p_k = s_k / Σ s_j`` (Eq. 3; Roy & Vetterli 2007).

    Args:
        s: singular values ``(..., n)``, non-negative.

    Returns:
        ``(...)`` in ``[1, n]`` (unnormalized; divide by d for ``erank/d``).
        Scale invariant: ``erank(c·A) = erank(A)``. A zero matrix gives NaN.
    """
    p = s / s.sum(dim=-1, keepdim=True)
    return torch.exp(-torch.special.xlogy(p, p).sum(dim=-1))


def stable_rank_from_sv(s: Tensor) -> Tensor:
    """Stable rank ``‖A‖_F² / ‖A‖_2² = Σ s_k² / s_1²`` from singular values ``(..., n)`` → ``(...)``."""
    s2 = s.square()
    return s2.sum(dim=-1) / s2.amax(dim=-1)


def erank(a: Tensor) -> Tensor:
    """Effective rank (Eq. 3) of matrices ``(..., N, K)`` → ``(...)``, unnormalized."""
    return erank_from_sv(singular_values(a))


def stable_rank(a: Tensor) -> Tensor:
    """Stable rank ``‖A‖_F²/‖A‖_2²`` of matrices ``(..., N, K)`` → ``(...)``."""
    return stable_rank_from_sv(singular_values(a))
