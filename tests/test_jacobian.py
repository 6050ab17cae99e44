"""Jacobians from the forward sweep against autograd and against Table 2's closed forms."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch.func import jacrev

from rankexp.models.activations import ACTIVATIONS
from rankexp.models.mlp import PLACEMENTS, ResidualMLP
from rankexp.models.norms import NORM_FNS, NORM_OPS
from rankexp.probes.jacobian import forward_sweep, member_jacobian
from rankexp.seeding import gaussian_input

SEEDS = [3, 4]


def autograd_partials(model: ResidualMLP, h0):
    """Every ∂h_l/∂h_0 by reverse mode (jacrev of the whole trajectory), per member: (E, L, d, d)."""
    out = []
    for e in range(model.members):
        def traj(x, e=e):
            xs = h0.clone()
            xs[e, 0] = x
            return torch.stack([h[e, 0] for h in model.trajectory(xs)[1:]])

        out.append(jacrev(traj)(h0[e, 0]))
    return torch.stack(out)


CASES = [
    (p, op, act, m)
    for p, op, act, m in itertools.product(PLACEMENTS, NORM_OPS, ACTIVATIONS, (1, 2))
    if not (act == "swiglu" and m == 1) and not (p == "none" and op != "rmsnorm")
]


@pytest.mark.parametrize("placement,op,activation,matrices", CASES)
def test_partials_equal_autograd(placement, op, activation, matrices):
    model = ResidualMLP(6, 3, expansion=1.5, matrices=matrices, activation=activation, placement=placement,
                        norm_op=op, alpha=1.4, beta=0.8, seeds=SEEDS)
    h0 = gaussian_input(SEEDS, 6)
    sweep = forward_sweep(model, h0, keep_partials=True)
    ours = torch.stack(sweep.partials, 1)
    ref = autograd_partials(model, h0)
    err = (torch.linalg.matrix_norm(ours - ref) / torch.linalg.matrix_norm(ref)).max().item()
    assert err <= 1e-10, err


@pytest.mark.parametrize("skip_every", [0, 2, 3])
def test_spaced_skips_equal_autograd(skip_every):
    model = ResidualMLP(5, 7, placement="pre", skip_every=skip_every, seeds=SEEDS)
    h0 = gaussian_input(SEEDS, 5)
    ours = torch.stack(forward_sweep(model, h0, keep_partials=True).partials, 1)
    ref = autograd_partials(model, h0)
    assert (torch.linalg.matrix_norm(ours - ref) / torch.linalg.matrix_norm(ref)).max() <= 1e-10


def test_profile_spectra_match_direct_svd():
    model = ResidualMLP(16, 6, placement="post", alpha=2.0, seeds=SEEDS)
    h0 = gaussian_input(SEEDS, 16)
    sweep = forward_sweep(model, h0, keep_partials=True)
    for l, jac in enumerate(sweep.partials):
        s = torch.linalg.svdvals(jac)
        p = s / s.sum(-1, keepdim=True)
        er = torch.exp(-(p * p.log()).sum(-1))
        torch.testing.assert_close(sweep.erank[:, l], er, rtol=1e-10, atol=0)
        torch.testing.assert_close(sweep.stable_rank[:, l], (s**2).sum(-1) / s[:, 0] ** 2, rtol=1e-10, atol=0)
        torch.testing.assert_close(sweep.log_gain[:, l], torch.linalg.matrix_norm(jac).log(), rtol=1e-10, atol=1e-12)


def closed_form(op: str, x: torch.Tensor) -> torch.Tensor:
    """Table 2 Jacobians, x of shape (d,)."""
    d = x.numel()
    eye = torch.eye(d, dtype=x.dtype)
    center = eye - torch.ones(d, d, dtype=x.dtype) / d
    if op == "meansub":
        return center
    if op == "detached":
        return math.sqrt(d) / x.norm() * eye
    xc = center @ x if op == "layernorm" else x
    u = xc / xc.norm()
    proj = math.sqrt(d) / xc.norm() * (eye - torch.outer(u, u))
    return proj @ center if op == "layernorm" else proj


@pytest.mark.parametrize("op", NORM_OPS)
def test_norm_jacobians_match_table2(op):
    x = gaussian_input([7, 8], 9)
    jac = member_jacobian(lambda _, xe: NORM_FNS[op](xe), x)
    for e in range(2):
        torch.testing.assert_close(jac[e], closed_form(op, x[e, 0]), rtol=1e-12, atol=1e-12)


def test_detached_has_rmsnorm_forward():
    x = gaussian_input([1], 32)
    torch.testing.assert_close(NORM_FNS["detached"](x), NORM_FNS["rmsnorm"](x), rtol=0, atol=0)
    assert torch.allclose(NORM_FNS["rmsnorm"](x).square().mean(), torch.tensor(1.0, dtype=x.dtype))


def test_seed_batching_changes_nothing():
    """Member e of a batched model is exactly the one-member model with seed e."""
    batched = forward_sweep(ResidualMLP(12, 5, seeds=[0, 1, 2]), gaussian_input([0, 1, 2], 12))
    alone = forward_sweep(ResidualMLP(12, 5, seeds=[1]), gaussian_input([1], 12))
    torch.testing.assert_close(batched.erank[1], alone.erank[0], rtol=1e-12, atol=0)
    torch.testing.assert_close(batched.rms[1], alone.rms[0], rtol=1e-12, atol=0)


def test_init_variance_is_alpha_squared_over_fan_in():
    model = ResidualMLP(128, 2, expansion=2, alpha=1.7, seeds=[0, 1])
    w_up, w_down = model.blocks[0].w_up, model.blocks[0].w_down
    assert w_up.var().item() == pytest.approx(1.7**2 / 128, rel=0.02)
    assert w_down.var().item() == pytest.approx(1.7**2 / 256, rel=0.02)
    assert not torch.equal(w_up[0], w_up[1])
