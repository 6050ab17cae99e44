"""Spectral summaries of one Jacobian ``J`` (``D_out × D``), exact or matrix-free.

:func:`slq_spectrum` uses ``A = JᵀJ`` products only: ``‖J‖_F² = tr A`` (Hutchinson 1989),
``‖J‖₂²`` the top Ritz value (Parlett 1998, Thm. 13.1.1), ``erank = exp(ln S − tr g(A)/S)``,
``S = tr A^{1/2}``, ``g(λ) = √λ ln √λ`` (Ubaru, Chen & Saad 2017); errors: probe spread plus
the quadrature's ``k⁻²`` tail.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..spectra import erank_from_sv, stable_rank_from_sv

DENSE, MATRIX_FREE = "dense", "matrix_free"


@dataclass(frozen=True)
class Spectrum:
    """``‖J‖_F²``, ``‖J‖₂²``, erank (Eq. 3) and stable rank of ``J`` with ``dim`` = D columns, each
    with one standard error (0 when exact)."""

    dim: int
    frobenius_sq: float
    top_sq: float
    erank: float
    stable_rank: float
    frobenius_sq_err: float = 0.0
    top_sq_err: float = 0.0
    erank_err: float = 0.0
    stable_rank_err: float = 0.0
    method: str = DENSE
    vectors: int = 0
    steps: int = 0

    @property
    def ratio(self) -> float:
        """``‖J‖_F / ‖I‖_F = ‖J‖_F/√D``: the branch-to-skip ratio r_l when J is a branch (Eq. 4)."""
        return math.sqrt(max(self.frobenius_sq, 0.0) / self.dim)

    @property
    def ratio_err(self) -> float:
        """Standard error of :attr:`ratio` (delta method)."""
        r = self.ratio
        if r == 0:
            return 0.0 if self.frobenius_sq_err == 0 else math.inf
        return self.frobenius_sq_err / (2 * r * self.dim)


def dense_spectrum(j: Tensor) -> Spectrum:
    """The exact :class:`Spectrum` of ``j`` ``(D_out, D)`` (float64; a zero matrix: NaN ranks)."""
    s = torch.linalg.svdvals(j.detach().to(torch.float64))
    fro = float(s.square().sum())
    return Spectrum(dim=j.shape[-1], frobenius_sq=fro, top_sq=float(s[0].square()),
                    erank=float(erank_from_sv(s)), stable_rank=float(stable_rank_from_sv(s)))


def rademacher(vectors: int, dim: int, *, seed: int, dtype: torch.dtype,
               device: torch.device | str) -> Tensor:
    """``(vectors, dim)`` ±1 entries drawn on the CPU from ``seed`` (the same on every device)."""
    g = torch.Generator().manual_seed(int(seed))
    v = torch.randint(0, 2, (vectors, dim), generator=g, dtype=torch.int8)
    return (v.to(torch.float64) * 2 - 1).to(device=device, dtype=dtype)


@dataclass(frozen=True)
class Lanczos:
    """Tridiagonal Lanczos coefficients of p runs: ``alpha`` ``(p, k)``, ``beta`` ``(p, k)`` (``beta[:, j]`` couples steps j, j+1)."""

    alpha: Tensor
    beta: Tensor

    @property
    def steps(self) -> int:
        return self.alpha.shape[1]

    def nodes_weights(self, k: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Gauss quadrature of the first ``k`` steps, float64 ``(p, k)`` each: nodes θ ≥ 0,
        weights τ², the eigenvectors' last components."""
        k = self.steps if k is None else k
        a, b = self.alpha[:, :k].double(), self.beta[:, : k - 1].double()
        t = torch.diag_embed(a) + torch.diag_embed(b, 1) + torch.diag_embed(b, -1)
        theta, u = torch.linalg.eigh(t)
        return theta.clamp(min=0), u[:, 0, :].square(), u[:, -1, :]


def lanczos(gram: Callable[[Tensor], Tensor], start: Tensor, steps: int, *,
            check: int = 8, converged: Callable[[Lanczos], bool] | None = None) -> Lanczos:
    """Lanczos, fully reorthogonalized, on ``gram`` ``(p, D) → (p, D)`` from ``start`` ``(p, D)``;
    every ``check`` steps ``converged(partial)`` may stop it."""
    p, dim = start.shape
    steps = max(1, min(int(steps), dim))
    basis = start.new_zeros(p, steps + 1, dim)
    basis[:, 0] = start / start.norm(dim=1, keepdim=True)
    alpha, beta = start.new_zeros(p, steps), start.new_zeros(p, steps)
    tiny = torch.finfo(start.dtype).eps * 64
    k = steps
    for j in range(steps):
        q = basis[:, j]
        w = gram(q)
        alpha[:, j] = (w * q).sum(1)
        scale = w.norm(dim=1)
        for _ in range(2):  # full reorthogonalization against q_0 … q_j (α, β terms included)
            w = w - torch.einsum("pk,pkd->pd", torch.einsum("pkd,pd->pk", basis[:, : j + 1], w),
                                 basis[:, : j + 1])
        b = w.norm(dim=1)
        alive = b > tiny * scale.clamp(min=torch.finfo(start.dtype).tiny)
        beta[:, j] = torch.where(alive, b, 0.0)
        basis[:, j + 1] = torch.where(alive[:, None], w / b.clamp(min=torch.finfo(b.dtype).tiny)[:, None], 0.0)
        done = j + 1 == steps
        if not done and (j + 1) % check == 0:  # host sync only every `check` steps
            part = Lanczos(alpha[:, : j + 1], beta[:, : j + 1])
            if not bool(alive.any()) or (converged is not None and converged(part)):
                k = j + 1
                break
    return Lanczos(alpha[:, :k], beta[:, :k])


@dataclass(frozen=True)
class _Quadrature:
    """Traces ``(p, 3)`` (``tr A, tr A^{1/2}, tr g(A)``), the top Ritz value, its residual bound."""

    traces: Tensor
    top: float
    top_bound: float

    def erank(self) -> tuple[float, float]:
        p = self.traces.shape[0]
        mean = self.traces.mean(0)
        s, t = float(mean[1]), float(mean[2])
        h = math.log(s) - t / s
        if p < 2:
            return math.exp(h), math.inf
        cov = torch.cov(self.traces.T) / p
        grad = torch.tensor([0.0, 1.0 / s + t / s**2, -1.0 / s], dtype=cov.dtype)
        var = float(grad @ cov @ grad)
        return math.exp(h), math.exp(h) * math.sqrt(max(var, 0.0))


def _quadrature(lz: Lanczos, dim: int, k: int | None = None) -> _Quadrature:
    theta, weight, last = lz.nodes_weights(k)
    root = theta.sqrt()
    traces = dim * torch.stack([(weight * theta).sum(1), (weight * root).sum(1),
                                (weight * torch.special.xlogy(root, root)).sum(1)], 1)
    best = int(theta.amax(1).argmax())
    j = int(theta[best].argmax())
    kk = theta.shape[1]
    resid = abs(float(lz.beta[best, kk - 1])) * abs(float(last[best, j]))
    return _Quadrature(traces, float(theta[best, j]), resid)


@dataclass(frozen=True)
class MatrixFree:
    """:func:`slq_spectrum` settings: Rademacher ``vectors``, ≤ ``steps`` Lanczos steps, stop at
    relative change < ``tol`` over ``check`` steps, probe ``seed``."""

    vectors: int = 16
    steps: int = 64
    tol: float = 1e-3
    check: int = 8
    seed: int = 0

    def __post_init__(self):
        if self.vectors < 2:
            raise ValueError(f"MatrixFree.vectors={self.vectors}: need ≥ 2 (the error is their spread)")
        if self.steps < 2 or self.check < 1:
            raise ValueError(f"MatrixFree.steps={self.steps}, check={self.check}: need steps ≥ 2, check ≥ 1")

    def basis_bytes(self, dim: int, itemsize: int) -> int:
        """Memory of the Lanczos basis for a ``dim``-column matrix."""
        return self.vectors * (min(self.steps, dim) + 1) * dim * itemsize


def slq_spectrum(gram: Callable[[Tensor], Tensor], dim: int, *, settings: MatrixFree = MatrixFree(),
                 seed_offset: int = 0, dtype: torch.dtype = torch.float64,
                 device: torch.device | str = "cpu") -> Spectrum:
    """Matrix-free :class:`Spectrum` of J from ``gram`` ``v ↦ Jᵀ(J v)``, ``(p, D) → (p, D)`` (probes
    seeded ``settings.seed + seed_offset``); ‖J‖₂²: a lower bound, the Ritz residual its error."""
    v = rademacher(settings.vectors, dim, seed=settings.seed + seed_offset, dtype=dtype, device=device)
    state: dict[str, tuple[float, float]] = {}

    def converged(part: Lanczos) -> bool:
        q = _quadrature(part, dim)
        now = (q.erank()[0], q.top)
        before, state["last"] = state.get("last"), now
        if before is None or part.steps < 2 * settings.check:
            return False
        return all(abs(a - b) <= settings.tol * abs(a) for a, b in zip(now, before, strict=True))

    lz = lanczos(gram, v, settings.steps, check=settings.check, converged=converged)
    q = _quadrature(lz, dim)
    er, er_se = q.erank()
    k = lz.steps
    quad_err = 0.0
    if k > settings.check:  # the k⁻² tail, from its last change
        change = abs(er - _quadrature(lz, dim, k - settings.check).erank()[0])
        quad_err = change * k / (2 * settings.check)
    p = settings.vectors
    fro = float(q.traces[:, 0].mean())
    fro_err = float(q.traces[:, 0].std() / math.sqrt(p))
    top, top_err = q.top, q.top_bound
    sr = fro / top if top > 0 else math.nan
    sr_err = sr * math.hypot(fro_err / fro, top_err / top) if top > 0 and fro > 0 else math.nan
    return Spectrum(dim=dim, frobenius_sq=fro, top_sq=top, erank=er, stable_rank=sr,
                    frobenius_sq_err=fro_err, top_sq_err=top_err, erank_err=math.hypot(er_se, quad_err),
                    stable_rank_err=sr_err, method=MATRIX_FREE, vectors=p, steps=k)
