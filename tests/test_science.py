"""The study's claims about initialization rank, checked on the measurement engine."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from rankexp.models.mlp import PLACEMENTS, ResidualMLP
from rankexp.tasks.measure import run_probes

SEEDS = [0, 1, 2]


def measure(**kw):
    width = kw.pop("width", 48)
    depth = kw.pop("depth", 24)
    probes = kw.pop("probes", ("io_jacobian", "profile", "stream", "branch_ratio"))
    return run_probes(ResidualMLP(width, depth, seeds=kw.pop("seeds", SEEDS), **kw), probes)


@pytest.mark.parametrize("placement", ["pre", "post"])
@pytest.mark.parametrize("matrices", [1, 2])
def test_beta_alpha_M_symmetry_for_relu(placement, matrices):
    """Appendix A.4: for positively homogeneous σ, erank depends on (α, β) only through βα^M.

    With α a power of two, β = α^−M is exact in floating point and so is the
    scaling of every weight, so the symmetry must hold to rounding (≤ 1e-10).
    Other α (3, below) change the rounding of every weight; deep ReLU maps
    amplify that 1e-16 to ~1e-8, so they get a looser bound.
    """
    base = measure(placement=placement, matrices=matrices, alpha=1.0, beta=1.0)
    for alpha in (0.5, 2.0, 4.0):
        other = measure(placement=placement, matrices=matrices, alpha=alpha, beta=1.0 / alpha**matrices)
        assert other.scalars["erank_io"] == pytest.approx(base.scalars["erank_io"], abs=1e-10)
        assert abs(other.series["erank_profile"][1] - base.series["erank_profile"][1]).max() <= 1e-10
    inexact = measure(placement=placement, matrices=matrices, alpha=3.0, beta=1.0 / 3.0**matrices)
    assert inexact.scalars["erank_io"] == pytest.approx(base.scalars["erank_io"], abs=1e-6)
    # and it is not a tautology: a different βα^M gives a different erank
    moved = measure(placement=placement, matrices=matrices, alpha=2.0, beta=1.0)
    assert abs(moved.scalars["erank_io"] - base.scalars["erank_io"]) > 1e-3


def test_symmetry_breaks_for_tanh():
    """tanh is not positively homogeneous, so equal βα^M does not mean equal erank."""
    a = measure(placement="pre", activation="tanh", alpha=1.0, beta=1.0)
    b = measure(placement="pre", activation="tanh", alpha=2.0, beta=0.25)
    assert abs(a.scalars["erank_io"] - b.scalars["erank_io"]) > 1e-3


@pytest.mark.parametrize("alpha", [0.7, 1.0, 1.5])
def test_pre_norm_stream_grows_linearly_with_kappa(alpha):
    """science.md §2 item 3: rms(h_l)² − 1 = κ(βα^M)² l with κ = E[relu(z)²] = ½."""
    r = measure(placement="pre", alpha=alpha, width=128, depth=48, seeds=[0, 1, 2, 3], probes=("stream",))
    assert 0.45 <= r.scalars["stream_kappa"] <= 0.57
    steps, rms = r.series["rms"]
    growth = rms**2 - rms[0] ** 2
    half = growth[len(growth) // 2] / growth[-1]
    assert half == pytest.approx(0.5, abs=0.08)  # linear, not exponential


def test_post_norm_holds_the_ratio_and_pre_norm_decays_it():
    """Eq. 21/22: post keeps r_l at its nominal value; pre decays it as 1/sqrt(1 + κ(βα^M)²(l−1)).

    For the M = 2 branch ‖J_f‖_F/√d = α²√p with survival p = E[σ'(z)²] = ½ for ReLU,
    so the measured ratio is the nominal βα^M times √p.
    """
    alpha, depth, sqrt_p = 1.5, 32, 0.5**0.5
    nominal = alpha**2
    post = measure(placement="post", alpha=alpha, width=128, depth=depth, probes=("branch_ratio",))
    _, r_post = post.series["branch_ratio"]
    assert r_post.mean() == pytest.approx(sqrt_p * nominal, rel=0.1)
    assert r_post[-1] == pytest.approx(r_post[0], rel=0.15)
    pre = measure(placement="pre", alpha=alpha, width=128, depth=depth, probes=("branch_ratio",))
    _, r_pre = pre.series["branch_ratio"]
    layers = 1 + torch.arange(depth, dtype=torch.float64).numpy()
    predicted = sqrt_p * nominal / (1 + 0.5 * nominal**2 * (layers - 1)) ** 0.5
    assert abs(r_pre / predicted - 1).max() < 0.15
    assert r_pre[-1] < r_pre[0] / 3


def test_post_norm_collapses_below_pre_norm_at_large_alpha_and_depth():
    pre = measure(placement="pre", alpha=3.0, depth=64, width=64)
    post = measure(placement="post", alpha=3.0, depth=64, width=64)
    assert post.scalars["erank_io"] < 0.1 < pre.scalars["erank_io"]
    assert post.scalars["erank_io"] < pre.scalars["erank_io"] / 5
    # and post gets worse with depth and α
    shallow = measure(placement="post", alpha=1.0, depth=16, width=64)
    assert post.scalars["erank_io"] < shallow.scalars["erank_io"]


@pytest.mark.parametrize("alpha", [pytest.param(0.5, marks=pytest.mark.slow),  # 8 s each
                                   pytest.param(1.0, marks=pytest.mark.slow), 2.0])
def test_detached_rescaling_tracks_rmsnorm_under_post(alpha):
    """Figure 4: the post-residual *rescaling* collapses rank; the projection adds ≤ 0.4% of width.

    The two networks share their weights seed by seed, but erank/d of one network still moves
    by ≈ 0.011 (s.d. over seeds of the paired difference at α = 2, d = 64, L = 48; 0.002 at
    α = 0.5, where the projection's own effect is ≈ −0.007): 24 paired seeds make the 0.01 bound
    ≥ 4 s.d. of the mean (3 seeds left it at 1.5 s.d., a coin a fifth of the draws failed)."""
    seeds = list(range(24))
    rms = measure(placement="post", norm_op="rmsnorm", alpha=alpha, width=64, depth=48, seeds=seeds)
    det = measure(placement="post", norm_op="detached", alpha=alpha, width=64, depth=48, seeds=seeds)
    assert abs(rms.scalars["erank_io"] - det.scalars["erank_io"]) <= 0.01
    # the same rescaling before the branch or on its output (skip left alone) does not collapse
    for placement in ("pre", "output"):
        kept = measure(placement=placement, norm_op="rmsnorm", alpha=alpha, width=64, depth=48,
                       seeds=seeds)
        assert kept.scalars["erank_io"] > 0.2
        if alpha >= 1:
            assert kept.scalars["erank_io"] > 2 * rms.scalars["erank_io"]


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_float32_agrees_with_float64(placement):
    """float32 and float64 give the same erank/d within 1e-3 at L = 96 (α = 1)."""
    kw = dict(placement=placement, width=64, depth=96, seeds=[0, 1], probes=("io_jacobian", "profile"))
    r64 = measure(dtype=torch.float64, **kw)
    r32 = measure(dtype=torch.float32, **kw)
    assert abs(r64.scalars["erank_io"] - r32.scalars["erank_io"]) <= 1e-3
    assert abs(r64.series["erank_profile"][1] - r32.series["erank_profile"][1]).max() <= 1e-3


def test_plain_mlp_collapses_and_spaced_skips_make_a_sawtooth():
    """Figure 1: no skips → collapse; a skip every 4 blocks → troughs that recover at each skip."""
    plain = measure(skip_every=0, depth=24, width=48, probes=("profile",))
    res = measure(skip_every=1, depth=24, width=48, probes=("profile",))
    saw = measure(skip_every=4, depth=24, width=48, probes=("profile",))
    assert plain.scalars["erank_min"] < saw.scalars["erank_min"] < res.scalars["erank_min"] + 1e-9
    _, prof = saw.series["erank_profile"]
    # layers 4, 8, … (index 3, 7, …) carry a skip: rank jumps up there
    jumps = [prof[i] - prof[i - 1] for i in range(3, 24, 4)]
    assert all(j > 0 for j in jumps)


def test_accumulated_branch_norm_matches_direct_sum_and_grows_like_sqrt_depth_for_post():
    """Figure 5b: Post-Norm's accumulated branch ‖Σ βJ_l‖ grows ∝ √L (near the uncorrelated
    prediction); Pre-Norm's stays flat because r_l decays."""
    from rankexp.probes.jacobian import layer_jacobians
    from rankexp.seeding import gaussian_input

    model = ResidualMLP(16, 5, placement="post", alpha=1.3, seeds=[0, 1])
    h0 = gaussian_input([0, 1], 16)
    direct = sum(lj.branch for lj in layer_jacobians(model, h0))
    r = run_probes(model, ("accumulated_branch",), h0=h0)
    want = (torch.linalg.matrix_norm(direct) / 4).mean().item()
    assert r.series["accumulated_branch"][1][-1] == pytest.approx(want, rel=1e-12)

    post = measure(placement="post", width=64, depth=64, probes=("accumulated_branch",))
    _, acc = post.series["accumulated_branch"]
    assert acc[63] / acc[15] == pytest.approx(2.0, rel=0.25)  # √(64/16)
    assert post.scalars["accumulated_branch_excess"] == pytest.approx(1.0, abs=0.25)
    pre = measure(placement="pre", width=64, depth=64, probes=("accumulated_branch",))
    _, acc_pre = pre.series["accumulated_branch"]
    assert acc_pre[63] / acc_pre[15] < 1.6


# --------------------------------------------------------------------------- the general block (Eq. 17)
R_OPS = ("none", "rmsnorm", "detached", "meansub", "layernorm")


@functools.cache
def _post_ops(pre: str, depth: int) -> dict[str, float]:
    """erank(∂h_L/∂h_0)/d for every post-residual op R, P = ``pre``, B = identity, α = β = 1, m/d = 1."""
    return {
        r: measure(placement="none", pre=pre, post=r, expansion=1, depth=depth,
                   probes=("io_jacobian",)).scalars["erank_io"]
        for r in R_OPS
    }


def test_fig4b_with_a_pre_rmsnorm_rescaling_collapses_and_centring_keeps_a_floor():
    """Figure 4b: every config has a Pre-RMSNorm; R varies.  detached ≈ rmsnorm (the rescaling
    collapses rank; R's projection removes about one direction, ≤ 1/d — the study: 0.4 % of
    width at d = 256), layernorm collapses too, while meansub and none keep a floor, and the gap
    widens with depth."""
    shallow, deep = _post_ops("rmsnorm", 32), _post_ops("rmsnorm", 64)
    for e, factor in ((shallow, 2.5), (deep, 4.0)):
        assert abs(e["detached"] - e["rmsnorm"]) <= 1 / 48
        for floor in ("none", "meansub"):
            assert e[floor] > 0.3
            assert e[floor] > factor * max(e["rmsnorm"], e["detached"], e["layernorm"])
        assert abs(e["meansub"] - e["none"]) < 0.05  # centring alone does not rescale
    for collapsing in ("rmsnorm", "detached", "layernorm"):
        assert deep[collapsing] < 0.7 * shallow[collapsing]


def test_fig10a_without_the_control_no_op_and_meansub_collapse_like_rescaling():
    """Figure 10a: with P = identity the branch is unnormalized, the ratio stays at βα^M, and
    R = none or meansub collapse at nearly the rescaling rate: all five ops look alike."""
    free, controlled = _post_ops("none", 64), _post_ops("rmsnorm", 64)
    values = np.array(list(free.values()))
    assert values.max() < 1.5 * values.min()
    for op in ("none", "meansub"):
        assert free[op] < 0.4 * controlled[op]
    # the rescaling ops themselves barely notice the control (Figure 10b)
    for op in ("rmsnorm", "layernorm"):
        assert free[op] == pytest.approx(controlled[op], rel=0.2)
