"""Spectra cheaper than SVDs where accuracy allows, and a sweep that never waits for the device
(issue 18 items 4–5): the profile's Gram spectra against float64 SVDs to 1e-10 on the study's
Jacobians (collapsed ones included), and the sync-free path (masked units as exact zeros, the
spectra in one batched call after the last block) against the CPU path to 1e-12 — on the CPU,
with every call the sync-free loop makes recorded."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from rankexp import spectra as S
from rankexp.models.mlp import ResidualMLP
from rankexp.probes import jacobian as J
from rankexp.seeding import gaussian_input

#: (placement, α, L, m/d, skip_every): well-conditioned and collapsed profiles of the study
CASES = [("pre", 1.0, 64, 4, 1), ("pre", 2.0, 64, 1, 1), ("post", 1.0, 64, 1, 1),
         ("none", 1.0, 32, 1, 1), ("output", 1.0, 64, 1, 1), ("peri", 1.0, 32, 2, 1),
         ("pre", 1.0, 32, 1, 4), ("pre", 1.0, 16, 1, 0)]


def partials(width, placement, alpha, depth, expansion, skip):
    model = ResidualMLP(width, depth, expansion=expansion, placement=placement, alpha=alpha,
                        skip_every=skip, seeds=[0, 1])
    sweep = J.forward_sweep(model, gaussian_input([0, 1], width), keep_partials=True)
    u = torch.stack(sweep.partials, 1)
    return u / torch.linalg.matrix_norm(u)[..., None, None]


def rel(a, b):
    return float(((a - b) / b).abs().max())


@pytest.mark.parametrize("width", [32, 128])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_gram_spectra_equal_float64_svd_to_1e_10_and_the_estimate_bounds_their_error(width, case):
    u = partials(width, *case)
    s = torch.linalg.svdvals(u)
    er, sr = S.spectral_ranks(u, "gram")
    assert rel(er, S.erank_from_sv(s)) <= 1e-10 and rel(sr, S.stable_rank_from_sv(s)) <= 1e-10
    # the estimate that decides Gram or SVD is ≥ 10× the true error of the Gram erank, everywhere
    # (up to the two spectra's own rounding, ≈ 1e-16 relative)
    lam = torch.linalg.eigvalsh(u.mT @ u).clamp(min=0)
    err = ((S.erank_from_sv(lam.sqrt()) - S.erank_from_sv(s)) / S.erank_from_sv(s)).abs()
    assert (err <= 0.1 * S.gram_error_estimate(lam, lam.sum(-1)) + 1e-14).all()


def test_the_gram_path_is_taken_where_exact_and_refused_where_collapsed():
    """Pre-Norm at d = 128: every layer's Gram spectrum is exact; Post-Norm collapses and every
    deep layer needs the SVD — forcing the Gram spectrum there misses erank by far more than 1e-10."""
    good = partials(128, "pre", 1.0, 64, 4, 1)
    assert S.gram_ranks(good)[2].all()
    bad = partials(128, "post", 1.0, 64, 1, 1)
    er, _, exact = S.gram_ranks(bad)
    assert not exact[:, -32:].any()
    truth = S.erank_from_sv(torch.linalg.svdvals(bad))
    assert rel(er, truth) > 1e-8


@pytest.mark.parametrize("case", [("pre", 1.0, 48, 4, 1), ("post", 1.0, 48, 1, 1)])
def test_the_sweeps_profile_by_gram_equals_the_svd_profile(case):
    placement, alpha, depth, expansion, skip = case
    model = ResidualMLP(96, depth, expansion=expansion, placement=placement, alpha=alpha, seeds=[3, 4])
    h0 = gaussian_input([3, 4], 96)
    gram, svd = (J.forward_sweep(model, h0, spectra_method=m) for m in ("gram", "svd"))
    assert rel(gram.erank, svd.erank) <= 1e-10 and rel(gram.stable_rank, svd.stable_rank) <= 1e-10
    assert torch.equal(gram.io_singular_values, svd.io_singular_values)  # always an SVD's
    assert torch.equal(gram.log_gain, svd.log_gain)


SYNC_CASES = [dict(placement="pre"), dict(placement="post", expansion=1),
              dict(placement="peri", activation="gelu"), dict(matrices=1, skip_every=4),
              dict(placement="none", skip_every=0, expansion=2), dict(activation="abs", expansion=1)]


@pytest.mark.parametrize("kw", SYNC_CASES, ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()))
def test_the_sync_free_path_agrees_with_the_cpu_path_to_1e_12(kw):
    model = ResidualMLP(40, 12, **{"expansion": 3, **kw}, seeds=[0, 1, 2])
    h0 = gaussian_input([0, 1, 2], 40)
    a = J.forward_sweep(model, h0)
    b = J.forward_sweep(model, h0, sync_free=True)
    for name in ("erank", "stable_rank", "log_gain", "branch_ratio", "accumulated_branch", "rms",
                 "io_unit", "io_singular_values"):
        x, y = getattr(a, name), getattr(b, name)
        torch.testing.assert_close(y, x, rtol=1e-12, atol=1e-14, msg=name)


class Calls(TorchFunctionMode):
    """Every torch function and tensor method called while active, by name."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


SYNCS = {"nonzero", "item", "tolist", "__bool__", "numpy", "__int__", "__float__", "cpu"}
LINALG = {"linalg_svdvals", "svdvals", "linalg_eigvalsh", "eigvalsh"}


@pytest.mark.parametrize("probes", [{"io_jacobian"}, None])
def test_the_sync_free_sweep_never_reads_the_device_inside_its_loop(probes):
    """What waits for an accelerator — nonzero, .item(), bool(tensor), .cpu() — is never called
    in the loop over blocks: the spectra come after it, a fixed number of batched calls whatever
    the depth (on CUDA each linalg call reads its error flag, and choosing which Gram spectra
    need an SVD is one nonzero: a few syncs per sweep, none per block)."""
    counts = {}
    for depth in (4, 12):
        model = ResidualMLP(16, depth, expansion=2, seeds=[0, 1])
        h0 = gaussian_input([0, 1], 16)
        with Calls() as calls:
            J.forward_sweep(model, h0, needs=probes, sync_free=True)
        first = next(i for i, n in enumerate(calls.names) if n in LINALG)
        loop, after = calls.names[:first], calls.names[first:]
        assert not SYNCS & set(loop), sorted(SYNCS & set(loop))
        assert sum(n == "linalg_matrix_norm" or n == "matrix_norm" for n in loop) >= depth
        counts[depth] = [sum(n in LINALG | SYNCS for n in after)]
    assert counts[4] == counts[12] and counts[4][0] <= 6
    with Calls() as calls:  # the CPU path lists active units: it does read the device
        J.forward_sweep(ResidualMLP(16, 4, expansion=2, seeds=[0]), gaussian_input([0], 16))
    assert "nonzero" in calls.names


def test_a_gram_eigensolver_that_does_not_converge_falls_back_to_the_svd(monkeypatch):
    """LAPACK's syevd can fail on a collapsed representation's Gram matrix (seen at d = 8, M = 1
    ReLU, 16 layers): the spectra then come from an SVD, the same numbers."""
    a = torch.randn(3, 12, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ref = torch.linalg.svdvals(a).square().flip(-1)
    full = torch.linalg.eigvalsh(a.mT @ a)
    wide = a.mT.contiguous()  # 5 × 12: aᵀa has 7 zero eigenvalues beyond the 5 squared s.v.

    def fails(*args, **kwargs):
        raise torch.linalg.LinAlgError("linalg.eigh: The algorithm failed to converge (error code: 6)")

    ok_small, ok_right = S.gram_eigenvalues(a), S.gram_eigenvalues(wide, smaller=False)
    monkeypatch.setattr(torch.linalg, "eigvalsh", fails)
    torch.testing.assert_close(S.gram_eigenvalues(a), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(S.gram_eigenvalues(a), ok_small, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(S.gram_eigenvalues(wide, smaller=False), ok_right, rtol=1e-12, atol=1e-12)
    er, sr, exact = S.gram_ranks(a.mT @ a)
    assert exact.all() and torch.isfinite(er).all()
    assert full.shape == (3, 5)
