"""The general block of Eq. 17, h_l = R(h_{l−1} + β B(f(P(h_{l−1})))): P, B, R chosen
independently, the placements as its presets, closed forms and torch.func against autograd, the
config surface, and Figure 4b's sweep through the analysis."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir
from test_engine import live_model  # the first seeds whose tiny ReLU nets are differentiable
from torch.func import jacrev

from rankexp.config import config_hash, register_configs, resolved_container, validate
from rankexp.models import build_model
from rankexp.models.activations import ACTIVATIONS
from rankexp.models.mlp import PLACEMENTS, ResidualMLP
from rankexp.models.norms import NORM_OPS, PRESET_SLOTS, block_ops
from rankexp.probes import jacobian as J
from rankexp.probes.branch import projection_split
from rankexp.seeding import gaussian_input

REPO = Path(__file__).resolve().parents[1]
SEEDS = [3, 4]
SLOT_CHOICES = ("none", *NORM_OPS)
SCALAR = [a for a in ACTIVATIONS if a != "swiglu"]
#: every P × B × R, each with an activation, M and skip spacing taken in turn (all are covered)
PBR = [
    (p, b, r, SCALAR[i % len(SCALAR)], 1 + i % 2, (1, 0, 3)[i % 3])
    for i, (p, b, r) in enumerate(itertools.product(SLOT_CHOICES, repeat=3))
]


def _rel(a, b, floor=1e-2 * 6**0.5):
    a, b = a.detach(), b.detach()
    return float((torch.linalg.matrix_norm(a - b) / torch.linalg.matrix_norm(b).clamp(min=floor)).max())


def _reverse_partials(model, h0):
    out = []
    for e in range(model.members):
        def traj(x, e=e):
            xs = h0.clone()
            xs[e, 0] = x
            return torch.stack([h[e, 0] for h in model.trajectory(xs)[1:]])

        out.append(jacrev(traj)(h0[e, 0]))
    return torch.stack(out)


@pytest.mark.parametrize("pre,out,post,activation,matrices,skip_every", PBR)
def test_every_pbr_block_equals_autograd(pre, out, post, activation, matrices, skip_every):
    """Closed-form J_b (formed and applied) and J_R equal reverse mode; the sweep's partials
    equal reverse mode of the whole trajectory (≤ 1e-12, float64)."""
    model, seeds = live_model(expansion=1.5, matrices=matrices, activation=activation, placement="none",
                              pre=pre, out=out, post=post, alpha=1.3, beta=0.7, skip_every=skip_every)
    assert (model.pre_op, model.out_op, model.post_op) == tuple(None if v == "none" else v for v in (pre, out, post))
    h0 = gaussian_input(seeds, 6)
    u = torch.randn(2, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    states = {0: h0}
    for lj in J.layer_jacobians(model, h0):
        ref = J.branch_jacobian(lj.block, lj.h_in)  # torch.func on the module
        assert _rel(lj.linear.dense(), ref) <= 1e-12
        torch.testing.assert_close(lj.linear.apply(u), lj.linear.dense() @ u, rtol=1e-12, atol=1e-13)
        if post != "none":
            s = lj.block.branch(lj.h_in)
            s = s if lj.skip_from is None else states[lj.skip_from] + s
            assert _rel(lj.residual.dense(6), J.member_jacobian(lambda _, se, b=lj.block: b.res_norm(se), s)) <= 1e-12
        else:
            assert lj.residual is None
        states[lj.layer] = lj.h_out
    ours = torch.stack(J.forward_sweep(model, h0, keep_partials=True).partials, 1)
    assert _rel(ours.flatten(0, 1), _reverse_partials(model, h0).flatten(0, 1)) <= 1e-12


@pytest.mark.parametrize("pre,out,post", [("rmsnorm", "layernorm", "detached"), ("meansub", "none", "rmsnorm")])
def test_gated_branch_falls_back_to_torch_func_in_the_general_block(pre, out, post):
    model = ResidualMLP(6, 3, expansion=2, activation="swiglu", placement="none", pre=pre, out=out, post=post,
                        seeds=SEEDS)
    h0 = gaussian_input(SEEDS, 6)
    ours = torch.stack(J.forward_sweep(model, h0, keep_partials=True).partials, 1)
    assert _rel(ours.flatten(0, 1), _reverse_partials(model, h0).flatten(0, 1)) <= 1e-12


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("op", NORM_OPS)
def test_placements_are_presets_of_the_slots(placement, op):
    """norm=<placement> with op X is exactly the general block with X in the preset's slots."""
    slots = {s: (op if s in PRESET_SLOTS[placement] else "none") for s in ("pre", "out", "post")}
    preset = ResidualMLP(8, 4, placement=placement, norm_op=op, seeds=SEEDS)
    explicit = ResidualMLP(8, 4, placement="none", norm_op="rmsnorm", seeds=SEEDS, **slots)
    h0 = gaussian_input(SEEDS, 8)
    assert torch.equal(preset(h0), explicit(h0))
    assert torch.equal(J.forward_sweep(preset, h0).io_unit, J.forward_sweep(explicit, h0).io_unit)


def test_block_ops_rejects_unknown_ops():
    with pytest.raises(ValueError, match="norm.post='magic'"):
        block_ops("pre", "rmsnorm", post="magic")
    with pytest.raises(ValueError, match="placement='sideways'"):
        block_ops("sideways", "rmsnorm")
    assert block_ops("peri", "meansub", out="none") == ("meansub", None, None)


# --------------------------------------------------------------------------- config surface
@pytest.fixture(scope="module")
def composer():
    register_configs()
    with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
        yield lambda *ov: compose("config", overrides=list(ov))


@pytest.mark.parametrize(
    "overrides,ops",
    [
        ((), ("rmsnorm", None, None)),
        (("norm=post",), (None, None, "rmsnorm")),
        (("norm=post", "norm.op=layernorm"), (None, None, "layernorm")),
        (("norm=peri", "norm.op=meansub"), ("meansub", "meansub", None)),
        (("norm=none",), (None, None, None)),
        (("norm.placement=output",), (None, "rmsnorm", None)),
        (("norm=pre", "norm.post=detached"), ("rmsnorm", None, "detached")),
        (("norm=post", "norm.op=layernorm", "norm.pre=rmsnorm"), ("rmsnorm", None, "layernorm")),
        (("norm=none", "norm.out=meansub"), (None, "meansub", None)),
    ],
)
def test_config_builds_the_general_block(composer, overrides, ops):
    s = validate(composer("width=8", "depth=2", "seeds=1", *overrides))
    model = build_model(s)
    assert (model.pre_op, model.out_op, model.post_op) == ops
    assert {(b.pre_op, b.out_op, b.post_op) for b in model.blocks} == {ops}


def test_slots_that_repeat_their_preset_leave_the_config_hash_alone(composer):
    """Every config v1 could express keeps its hash (resume finds its finished runs)."""
    def h(*ov):
        return config_hash(resolved_container(composer(*ov)))

    for preset in PLACEMENTS:
        c = resolved_container(composer(f"norm={preset}", "norm.op=layernorm"))
        v1 = {**c, "norm": {"placement": c["norm"]["placement"], "op": c["norm"]["op"]}}
        assert config_hash(c) == config_hash(v1)
    assert h("norm=pre") == h("norm=pre", "norm.pre=rmsnorm", "norm.post=none")
    assert h("norm=pre") != h("norm=pre", "norm.post=detached") != h("norm=pre", "norm.post=rmsnorm")


def test_bad_slot_fails_before_any_run(tmp_path):
    p = subprocess.run([sys.executable, "-m", "rankexp", "norm.post=magic", "tracking=off"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert p.returncode != 0 and "norm.post" in p.stderr and "detached" in p.stderr


# --------------------------------------------------------------------------- projection split
def test_projection_split_of_a_pre_plus_post_network():
    """With P = rmsnorm and R set, the split's references are the general block's own variants."""
    seeds, d = [0, 1], 32
    kw = dict(expansion=1, alpha=1.5, seeds=seeds)
    model = ResidualMLP(d, 12, placement="pre", post="rmsnorm", **kw)
    h0 = gaussian_input(seeds, d)
    out = projection_split(model, h0)

    def erank(m):
        return J.forward_sweep(m, h0).erank[:, -1] / d

    torch.testing.assert_close(out["erank_post"], erank(model), rtol=1e-9, atol=0)
    torch.testing.assert_close(out["erank_post_noproj"], erank(ResidualMLP(d, 12, placement="pre", post="detached", **kw)),
                               rtol=1e-9, atol=0)
    torch.testing.assert_close(out["erank_unnormalized"], erank(ResidualMLP(d, 12, placement="pre", **kw)),
                               rtol=1e-9, atol=0)
    with pytest.raises(ValueError, match="placement='post'"):
        projection_split(ResidualMLP(d, 2, placement="pre", seeds=seeds), h0)


# --------------------------------------------------------------------------- Figure 4b end to end
def test_fig4_sweeps_and_the_control_panel(tmp_path):
    """``rankexp experiment=fig4 size=smoke -m``: its placements grid and its Figure 4b control
    grid in one sweep into one store; the analysis draws panel (b) from the runs with the
    Pre-RMSNorm control and keeps them out of panel (a)'s bars."""
    from analysis.core.runner import main as analysis_main

    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RANKEXP_STAMP"))}
    env.update(OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "rankexp", "experiment=fig4", "size=smoke", "width=8",
                        "-m"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert analysis_main(["placements", "--experiment", "fig4", "--uri", uri, "--out", str(tmp_path / "f")]) == 0
    control = pd.read_csv(tmp_path / "f" / "fig4" / "placements_control_erank_io.csv")
    from analysis.core.runs import load_runs

    runs = load_runs(["fig4"], uri)
    for _, row in control.iterrows():
        sel = runs[(runs["norm.pre"] == "rmsnorm") & (runs["norm.post"] == row["norm.post"])
                   & (runs["depth"].astype(float) == row["depth"])]
        assert len(sel) == row["count"] >= 1
        assert row["mean"] == pytest.approx(sel["erank_io"].astype(float).mean(), rel=1e-12)
    assert sorted(control["norm.post"].unique()) == ["detached", "layernorm", "meansub", "none", "rmsnorm"]
    assert sorted(control["depth"].unique()) == [8, 16]
    bars = pd.read_csv(tmp_path / "f" / "fig4" / "placements_erank_io.csv").set_index("config")
    assert set(bars.index) == {"pre/rmsnorm", "output/rmsnorm", "post/rmsnorm", "post/detached", "none"}
    # one run per cell (norm=none pools its two ops): the control grid is not averaged in, and
    # its R = none, L = 8 point is the placements grid's Pre-RMSNorm run, run once
    assert bars["count"].to_dict() == {"pre/rmsnorm": 1, "output/rmsnorm": 1, "post/rmsnorm": 1,
                                       "post/detached": 1, "none": 2}
    assert np.isfinite(control["mean"]).all()


def test_figure4_bars_leave_out_the_figure_4b_runs():
    """Figure 4's bars (and its claims) read the preset runs at the main depth only: a Pre-RMSNorm
    run with R = rmsnorm, or one at another depth, must not count as a 'pre' bar."""
    from analysis.study.fig4 import figure4_runs

    rows = [  # placement, op, pre, out, post, depth, erank_io
        ("pre", "rmsnorm", "rmsnorm", "none", "none", 96, 0.30),
        ("pre", "rmsnorm", "rmsnorm", "none", "none", 96, 0.31),
        ("post", "rmsnorm", "none", "none", "rmsnorm", 96, 0.05),
        ("pre", "rmsnorm", "rmsnorm", "none", "rmsnorm", 96, 0.01),  # Figure 4b: R = rmsnorm
        ("pre", "rmsnorm", "rmsnorm", "none", "none", 384, 0.02),    # Figure 4b: another depth
    ]
    df = pd.DataFrame(rows, columns=["norm.placement", "norm.op", "norm.pre", "norm.out",
                                     "norm.post", "depth", "erank_io"])
    bars = figure4_runs(df)
    assert sorted(bars["erank_io"]) == [0.05, 0.30, 0.31]
    pre = bars[bars["norm.placement"] == "pre"]
    assert pre["erank_io"].min() == 0.30
