"""Table 2 and Table 3 probes against independent computations: autograd, the rank-one algebra
of Table 2, exact walk geometry, a dense product, and the theory module's walk."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rankexp.models.mlp import ResidualMLP
from rankexp.probes import PROBES
from rankexp.probes.base import ProbeContext
from rankexp.probes.walk import projection_product_eranks, sphere_walk
from rankexp.seeding import gaussian_input
from rankexp.spectra import erank_from_sv
from rankexp.theory import random_walk_projection_product

#: Table 2: how many directions each op's Jacobian removes
DEFICIT = {"rmsnorm": 1, "detached": 0, "meansub": 1, "layernorm": 2}


def table2_row(op: str, width: int = 12, seeds=(0, 1, 2)) -> dict:
    model = ResidualMLP(width, 1, placement="post", norm_op=op, seeds=list(seeds))
    ctx = ProbeContext(model, gaussian_input(list(seeds), width))
    return PROBES["norm_jacobian"](ctx).scalars


@pytest.mark.parametrize("op", list(DEFICIT))
def test_table2_closed_forms_equal_autograd_and_remove_what_the_table_says(op):
    s = table2_row(op)
    assert s["jac_autograd_error"] < 1e-13
    assert s["jac_rank_deficit"] == DEFICIT[op]
    assert s["jac_scale"] == pytest.approx(s["jac_scale_theory"], rel=1e-12)
    assert s["jac_sv_spread"] < 1e-12  # c times an orthogonal projection
    removes_xhat = op in ("rmsnorm", "layernorm")  # layernorm: x̂ ∈ span(x̂_c, 1)
    assert (s["jac_removes_xhat"] < 1e-12) is removes_xhat
    assert (s["jac_removes_ones"] < 1e-12) is (op in ("meansub", "layernorm"))
    assert (s["jac_removes_xhat_c"] < 1e-12) is (op == "layernorm")
    # the rescaling ops scale by √d/‖x‖ (c·rms(x) = 1); meansub does not rescale (c = 1)
    if op in ("rmsnorm", "detached"):
        assert s["jac_scale_rms"] == pytest.approx(1.0, rel=1e-12)
    if op == "meansub":
        assert s["jac_scale"] == pytest.approx(1.0, rel=1e-12) and s["jac_scale_rms"] > 1.05


def test_table2_refuses_a_network_without_a_post_residual_op():
    model = ResidualMLP(8, 1, placement="pre", seeds=[0])
    with pytest.raises(ValueError, match="post-residual op"):
        PROBES["norm_jacobian"](ProbeContext(model, gaussian_input([0], 8)))


def test_angle_walk_turns_by_exactly_epsilon_and_gaussian_walk_by_about_arctan():
    x = sphere_walk([0, 1], 32, 50, 0.3, "angle")
    assert torch.allclose(x.norm(dim=-1), torch.ones(2, 51, dtype=x.dtype), atol=1e-13)
    cos = (x[:, 1:] * x[:, :-1]).sum(-1)
    assert torch.allclose(cos, torch.full_like(cos, math.cos(0.3)), atol=1e-13)
    g = sphere_walk([0], 256, 200, 0.3, "gaussian")
    angle = torch.arccos((g[:, 1:] * g[:, :-1]).sum(-1)).mean().item()
    assert angle == pytest.approx(math.atan(0.3), rel=0.05)
    # each member is its own seed's walk, whatever it is batched with
    assert torch.equal(sphere_walk([1], 32, 50, 0.3, "angle")[0], x[1])


def test_projection_product_erank_matches_a_dense_product():
    x = sphere_walk([3], 16, 20, 0.6, "angle")
    q = torch.eye(16, dtype=x.dtype)
    want = {}
    for l in range(1, 21):
        u = x[0, l][:, None]
        q = (torch.eye(16, dtype=x.dtype) - u @ u.T) @ q
        want[l] = (erank_from_sv(torch.linalg.svdvals(q)) / 16).item()
    got = projection_product_eranks(x, [1, 7, 20])[0]
    assert got.tolist() == pytest.approx([want[1], want[7], want[20]], rel=1e-12)
    assert got[0].item() == pytest.approx(15 / 16, rel=1e-12)  # one projection: rank d − 1


def test_gaussian_walk_agrees_with_the_theory_module_in_law():
    """Same walk law as :func:`rankexp.theory.random_walk_projection_product` (other draws):
    the seed means of erank/d agree to well within the spread at d = 64, L = 192, ε = 0.6."""
    x = sphere_walk(list(range(6)), 64, 192, 0.6, "gaussian")
    ours = projection_product_eranks(x, [192])[:, 0].numpy()
    ref = []
    for s in range(6):
        sv = random_walk_projection_product(64, 192, 0.6, seed=100 + s)
        p = sv / sv.sum()
        p = p[p > 0]
        ref.append(np.exp(-(p * np.log(p)).sum()) / 64)
    assert abs(ours.mean() - np.mean(ref)) < 3 * np.std(ref) / np.sqrt(6) + 2e-3
    assert ours.max() < 63 / 64 + 1e-12  # at least the current direction is removed
