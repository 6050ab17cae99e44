"""Residual representations and the mean spike (Figure 7/14/15, Table 1/6, Appendix C)."""

from __future__ import annotations

import math
import resource
import time

import pytest
import torch
from torch.nn import functional as F

from rankexp.models.mlp import ResidualMLP
from rankexp.probes.representation import (
    STREAM_BACKWARD,
    backward_representation,
    output_gradient,
    representation,
    stack_spectrum,
)
from rankexp.seeding import gaussian_input, seeded_generator
from rankexp.spectra import erank_from_sv
from rankexp.tasks.measure import run_probes


def _rep(matrices, activation, seeds=(0, 1), depth=48, width=96, n=384):
    model = ResidualMLP(
        width, depth, expansion=2, matrices=matrices, activation=activation, seeds=list(seeds)
    )
    return run_probes(model, ["representation"], options={"representation": {"n": n}}).scalars


def test_one_matrix_relu_spike():
    """M = 1, ReLU, Pre-RMSNorm: per-input cross-layer cosine = c = 1/π, ‖Σ m_k‖ ∝ l, Z collapses."""
    s = _rep(1, "relu")
    assert s["branch_input_cos_cross"] == pytest.approx(1 / math.pi, abs=0.03)
    assert s["coherence_theory"] == pytest.approx(1 / math.pi, abs=1e-12)
    assert s["branch_mean_sum_exponent"] == pytest.approx(1.0, abs=0.08)
    assert s["branch_mean_snr"] > 5  # the means are far above the probe-size noise floor
    assert s["rep_top_energy_final"] > 0.9
    assert s["rep_erank_final"] < 0.25


def test_two_matrix_relu_no_spike():
    """M = 2: W_down scatters the means — cosine ≈ 0, ‖Σ m_k‖ ∝ √l, rank survives."""
    s = _rep(2, "relu", seeds=range(4))
    assert abs(s["branch_input_cos_cross"]) < 0.03
    assert abs(s["branch_mean_cos_cross"]) < 0.05
    assert s["branch_mean_sum_exponent"] == pytest.approx(0.5, abs=0.15)
    assert s["rep_erank_final"] > 0.4
    assert s["rep_top_energy_final"] < 0.7


@pytest.mark.parametrize("activation", ["tanh", "swiglu"])
def test_zero_mean_activations_have_no_spike(activation):
    """c = 0 (tanh; the gated unit's u is symmetric): means sit at the noise floor."""
    s = _rep(1 if activation == "tanh" else 2, activation)
    assert abs(s["branch_input_cos_cross"]) < 0.02
    assert s["branch_mean_snr"] < 3
    assert s["rep_top_energy_final"] < 0.25
    assert s["coherence_theory"] == 0.0


def test_stack_spectrum_matches_svd():
    for n, d in ((50, 20), (20, 50)):
        z = torch.randn(3, n, d, dtype=torch.float64) + 2.0
        er, top = stack_spectrum(z)
        s = torch.linalg.svdvals(z)
        torch.testing.assert_close(er, erank_from_sv(s) / d, rtol=1e-10, atol=0)
        torch.testing.assert_close(top, s[:, 0] ** 2 / (s**2).sum(-1), rtol=1e-10, atol=0)


@pytest.mark.parametrize("skip_every,placement", [(1, "pre"), (2, "post"), (0, "none")])
def test_representation_stream_equals_the_model(skip_every, placement):
    model = ResidualMLP(
        16, 6, expansion=2, skip_every=skip_every, placement=placement, seeds=[0, 1]
    )
    h0 = gaussian_input([0, 1], 16, batch=40)
    rep = representation(model, h0)
    er, top = stack_spectrum(model(h0).detach())
    torch.testing.assert_close(rep["erank"][:, -1], er)
    torch.testing.assert_close(rep["top_energy"][:, -1], top)
    # branch means: the first layer's by hand
    b1 = model.blocks[0].branch(h0).detach().mean(1)
    torch.testing.assert_close(rep["branch_means"][:, 0], b1)


@pytest.mark.parametrize(
    "skip_every,placement,activation",
    [(1, "pre", "relu"), (3, "post", "gelu"), (1, "output", "swiglu")],
)
def test_backward_gradients_match_autograd(skip_every, placement, activation):
    """δ_0 from the checkpointed walk has the spectrum of autograd's ∂⟨δ_L, h_L⟩/∂h_0."""
    seeds = [0, 1]
    model = ResidualMLP(
        12,
        10,
        expansion=2,
        skip_every=skip_every,
        placement=placement,
        activation=activation,
        seeds=seeds,
    )
    h0 = gaussian_input(seeds, 12, batch=30)
    for kind in ("random", "cross_entropy"):
        br = backward_representation(model, h0, delta=kind)
        x = h0.clone().requires_grad_(True)
        out = model(x)
        (g,) = torch.autograd.grad(out, x, output_gradient(model, out.detach(), kind))
        er, top = stack_spectrum(g)
        torch.testing.assert_close(br["erank"][:, 0], er, rtol=1e-9, atol=0)
        torch.testing.assert_close(
            br["log_rms"][:, 0], g.square().mean((1, 2)).sqrt().log(), rtol=1e-9, atol=0
        )


def test_cross_entropy_delta_is_the_loss_gradient():
    model = ResidualMLP(8, 2, seeds=[4])
    h = torch.randn(1, 5, 8, dtype=torch.float64, requires_grad=True)
    delta = output_gradient(model, h.detach(), "cross_entropy", classes=3)
    g = seeded_generator(4, STREAM_BACKWARD)
    w = torch.randn(3, 8, generator=g, dtype=torch.float64) / math.sqrt(8)
    y = torch.randint(3, (5,), generator=g)
    loss = F.cross_entropy(h[0] @ w.T, y, reduction="sum")
    (expected,) = torch.autograd.grad(loss, h)
    torch.testing.assert_close(delta, expected)
    with pytest.raises(ValueError, match="delta='mse'"):
        output_gradient(model, h.detach(), "mse")


def test_backward_probe_keys():
    model = ResidualMLP(16, 5, expansion=2, seeds=[0, 1])
    m = run_probes(
        model, ["backward_representation"], options={"backward_representation": {"n": 24}}
    )
    steps, er = m.series["grad_erank"]
    assert list(steps) == list(range(6)) and ((er > 0) & (er <= 1)).all()
    assert {
        "grad_erank_input",
        "grad_erank_min",
        "grad_top_energy_input",
        "grad_log_gain",
    } <= m.scalars.keys()
    with pytest.raises(ValueError, match="unknown key"):
        run_probes(
            model, ["backward_representation"], options={"backward_representation": {"inputs": 3}}
        )


@pytest.mark.slow
def test_full_size_L384_d256():
    """L = 384, d = 256, M = 1 relu, n = 1024: forward and backward, time and memory."""
    model = ResidualMLP(256, 384, matrices=1, seeds=[0])
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    m = run_probes(model, ["representation", "backward_representation"])
    dt = time.perf_counter() - t
    rss = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    print(f"representation+backward L=384 d=256 n=1024: {dt:.1f} s, peak RSS +{rss:.0f} MB")
    assert m.scalars["branch_mean_sum_exponent"] == pytest.approx(1.0, abs=0.05)
    assert m.scalars["rep_erank_final"] < 0.1
