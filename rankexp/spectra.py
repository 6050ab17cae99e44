"""Effective rank (Eq. 3) and stable rank, batched over ``(..., N, K)`` or ``(..., n)`` values."""

from __future__ import annotations

import torch
from torch import Tensor


def singular_values(a: Tensor) -> Tensor:
    """Singular values ``s_1 ≥ … ≥ s_n`` of ``a`` ``(..., N, K)`` → ``(..., min(N, K))``."""
    return torch.linalg.svdvals(a)


def erank_from_sv(s: Tensor) -> Tensor:
    """Effective rank ``exp(−Σ p_k ln p_k)``, ``p_k = s_k / Σ s_j`` (Eq. 3; Roy & Vetterli 2007):
    ``(..., n)`` → ``(...)`` in ``[1, n]``; NaN for a zero matrix."""
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


def gram_eigenvalues(a: Tensor, *, smaller: bool = True) -> Tensor:
    """Eigenvalues ``(..., m)``, ascending, ≥ 0, of the smaller Gram matrix of ``a`` ``(..., n, k)``
    (``smaller=False``: of ``aᵀa``); from an SVD where LAPACK does not converge."""
    n, k = a.shape[-2:]
    right = n >= k or not smaller
    try:
        return torch.linalg.eigvalsh(a.mT @ a if right else a @ a.mT).clamp(min=0)
    except torch.linalg.LinAlgError:
        ev = singular_values(a).square().flip(-1)
        if right and n < k:  # aᵀa has k − n zero eigenvalues more than a has singular values
            ev = torch.cat([ev.new_zeros(*ev.shape[:-1], k - n), ev], -1)
        return ev


GRAM_TOLERANCE = 1e-10


def gram_error_estimate(lam: Tensor, frobenius_sq: Tensor) -> Tensor:
    """First-order ``|δ erank| / erank`` ``(...)`` of erank from eigenvalues ``lam`` ``(..., n)`` of
    ``AᵀA`` (``frobenius_sq`` = ``‖A‖_F²``): rounding moves each by ``η ≈ 2ε‖A‖_F²``."""
    eps = torch.finfo(lam.dtype).eps
    eta = (2 * eps) * frobenius_sq[..., None]
    lam = lam.clamp(min=0)
    s = lam.sqrt()
    total = s.sum(-1, keepdim=True)
    p = s / total
    h = -torch.special.xlogy(p, p).sum(-1, keepdim=True)
    good = lam > 4 * eta
    ds = eta / s.clamp(min=torch.finfo(s.dtype).tiny)
    linear = torch.where(good, (torch.log(p.clamp(min=torch.finfo(p.dtype).tiny)) + h).abs() * ds, 0.0)
    x = (5 * eta).sqrt() / total
    noise = (~good).sum(-1, keepdim=True) * 2 * (-torch.special.xlogy(x, x))
    return (linear.sum(-1, keepdim=True) / total + noise)[..., 0]


def gram_ranks(a: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(erank, stable rank, exact)`` of ``a`` ``(..., n, k)`` from the eigenvalues of ``aᵀa``;
    ``exact``: :func:`gram_error_estimate` ≤ :data:`GRAM_TOLERANCE`. No host sync.
    """
    try:
        lam = torch.linalg.eigvalsh(a.mT @ a).clamp(min=0)
    except torch.linalg.LinAlgError:  # no convergence (many repeated eigenvalues): SVDs for all
        er, sr = spectral_ranks(a, "svd")
        return er, sr, torch.ones_like(er, dtype=torch.bool)
    s = lam.sqrt()
    return erank_from_sv(s), stable_rank_from_sv(s), gram_error_estimate(lam, lam.sum(-1)) <= GRAM_TOLERANCE


def spectral_ranks(a: Tensor, method: str = "gram") -> tuple[Tensor, Tensor]:
    """``(erank, stable rank)`` of ``a`` ``(..., n, k)`` (Eq. 3) by ``gram`` (:func:`gram_ranks`,
    SVD where inexact) or ``svd``. Raises ValueError: an unknown method."""
    if method == "svd":
        s = singular_values(a)
        return erank_from_sv(s), stable_rank_from_sv(s)
    if method != "gram":
        raise ValueError(f"method={method!r} is not one of gram, svd")
    er, sr, exact = gram_ranks(a)
    redo = torch.nonzero(~exact.reshape(-1)).squeeze(1)
    if redo.numel():
        s = singular_values(a.reshape(-1, *a.shape[-2:]).index_select(0, redo))
        er = er.reshape(-1).index_copy(0, redo, erank_from_sv(s)).reshape(er.shape)
        sr = sr.reshape(-1).index_copy(0, redo, stable_rank_from_sv(s)).reshape(sr.shape)
    return er, sr
