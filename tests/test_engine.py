"""The measurement engine: closed-form block Jacobians against torch.func, only the work the
probes need, and memory-bounded seed chunks that change no number."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.func import functional_call, jacfwd, jacrev, vmap

from rankexp.models.activations import ACTIVATION_DERIVATIVES, ACTIVATIONS, activation_fn
from rankexp.models.mlp import PLACEMENTS, ResidualMLP
from rankexp.models.norms import NORM_FNS, NORM_OPS, norm_jacobian
from rankexp.probes import FOLDS, PROBES, ProbeContext
from rankexp.probes import jacobian as J
from rankexp.result import Measurement
from rankexp.seeding import gaussian_input
from rankexp.tasks.measure import join_seeds, measure_seeds, run_probes

SEEDS = [3, 4]
SCALAR_ACTIVATIONS = [a for a in ACTIVATIONS if a != "swiglu"]


def _member_jac(fn, x, params, mode):
    """vmap over members of jacfwd or jacrev: the two torch.func oracles."""
    jac = jacfwd if mode == "fwd" else jacrev
    return vmap(jac(fn, argnums=1))(params, x[:, 0])


def _branch_oracle(block, x, mode):
    params = dict(block.named_parameters())
    return _member_jac(lambda p, xe: functional_call(block, p, (xe,), {"part": "branch"}), x, params, mode)


def _rel(a, b, floor=1e-300):
    """max over members of ‖a − b‖_F / max(‖b‖_F, floor)."""
    a, b = a.detach(), b.detach()
    return float((torch.linalg.matrix_norm(a - b) / torch.linalg.matrix_norm(b).clamp(min=floor)).max())


def _alive(model) -> bool:
    """Whether no branch output of ``model`` is exactly zero at its input (a norm of zero has no
    Jacobian; a 6-unit ReLU branch dies with probability 2⁻⁶ a layer)."""
    hs = model.trajectory(gaussian_input(model.seeds, model.width))
    return all(bool((b.f(b.pre_norm(h)) != 0).any()) for b, h in zip(model.blocks, hs, strict=False))


def live_model(**kw):
    """``ResidualMLP(6, 3, **kw)`` of the first two seeds whose networks are differentiable at
    their inputs (:func:`_alive`), and those seeds."""
    found = (s for s in itertools.count() if _alive(ResidualMLP(6, 3, seeds=[s], **kw)))
    seeds = [next(found), next(found)]
    return ResidualMLP(6, 3, seeds=seeds, **kw), seeds


#: a relative-error floor for the tiny test networks, whose Jacobians are O(1): a plain M = 1 ReLU
#: layer with one live unit under an output norm has J_b = 0, and both sides hold rounding noise
FLOOR = 1e-2 * 6**0.5


# --------------------------------------------------------------------------- item 1: closed forms
def test_activation_derivatives_equal_autograd():
    x = torch.linspace(-4, 4, 801, dtype=torch.float64)
    x = torch.cat([x, torch.zeros(1, dtype=torch.float64)])  # the kinks: autograd's choice at 0
    for name in SCALAR_ACTIVATIONS:
        xs = x.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(activation_fn(name)(xs).sum(), xs)
        torch.testing.assert_close(ACTIVATION_DERIVATIVES[name](x), g, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("op", NORM_OPS)
def test_norm_jacobian_closed_form_equals_jacfwd_and_jacrev(op):
    x = gaussian_input([5, 6, 7], 11)
    nj = norm_jacobian(op, x[:, 0])
    dense = nj.dense(11)
    for mode in ("fwd", "rev"):
        ref = _member_jac(lambda _, xe: NORM_FNS[op](xe), x, {}, mode)
        assert _rel(dense, ref) <= 1e-12
    a = torch.randn(3, 11, 4, dtype=torch.float64)
    torch.testing.assert_close(nj.left(a), dense @ a, rtol=1e-13, atol=1e-13)
    b = torch.randn(3, 4, 11, dtype=torch.float64)
    torch.testing.assert_close(nj.right_(b.clone()), b @ dense, rtol=1e-13, atol=1e-13)


SHAPES = list(itertools.product((1, 2), (0, 1, 3)))  # (matrices, skip_every)
#: every block (placement, norm op, activation) at every shape under ``-m slow``; the default run
#: takes each block at one shape, the shapes in turn (each placement and op meets every shape)
BLOCK_CASES = [
    pytest.param(p, op, act, m, k, marks=[] if (m, k) == SHAPES[i % len(SHAPES)] else [pytest.mark.slow])
    for i, (p, op, act) in enumerate(
        (p, op, act) for p, op, act in itertools.product(PLACEMENTS, NORM_OPS, SCALAR_ACTIVATIONS)
        if not (p == "none" and op != "rmsnorm"))
    for m, k in SHAPES
]


@pytest.mark.parametrize("placement,op,activation,matrices,skip_every", BLOCK_CASES)
def test_closed_form_block_jacobians_equal_torch_func(placement, op, activation, matrices, skip_every):
    """Every closed-form J_b (formed and applied) and J_R equals jacfwd and jacrev to ≤ 1e-12 in
    float64, and the sweep's partials (closed forms, factored where cheaper) equal reverse mode."""
    model, seeds = live_model(expansion=1.5, matrices=matrices, activation=activation,
                              placement=placement, norm_op=op, alpha=1.3, beta=0.7,
                              skip_every=skip_every)
    h0 = gaussian_input(seeds, 6)
    u = torch.randn(2, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    states = {0: h0}
    for lj in J.layer_jacobians(model, h0):
        assert lj.linear is not None  # every scalar activation has a closed form
        jb = lj.linear.dense()
        for mode in ("fwd", "rev"):
            assert _rel(jb, _branch_oracle(lj.block, lj.h_in, mode), FLOOR) <= 1e-12
        torch.testing.assert_close(lj.linear.apply(u), jb @ u, rtol=1e-12, atol=1e-13)
        if lj.residual is not None:
            s = lj.block.branch(lj.h_in)
            if lj.skip_from is not None:
                s = states[lj.skip_from] + s
            for mode in ("fwd", "rev"):
                ref = _member_jac(lambda _, se, b=lj.block: b.res_norm(se), s, {}, mode)
                assert _rel(lj.residual.dense(6), ref) <= 1e-12
        states[lj.layer] = lj.h_out
    ours = torch.stack(J.forward_sweep(model, h0, needs={"io_jacobian"}, keep_partials=True).partials, 1)
    ref = _trajectory_jacobians(model, h0)
    assert _rel(ours.flatten(0, 1), ref.flatten(0, 1), FLOOR) <= 1e-12

def _trajectory_jacobians(model, h0):
    out = []
    for e in range(model.members):
        def traj(x, e=e):
            xs = h0.clone()
            xs[e, 0] = x
            return torch.stack([h[e, 0] for h in model.trajectory(xs)[1:]])

        out.append(jacrev(traj)(h0[e, 0]))
    return torch.stack(out)


def test_swiglu_falls_back_to_torch_func():
    model = ResidualMLP(6, 3, expansion=2, activation="swiglu", placement="peri", seeds=SEEDS)
    h0 = gaussian_input(SEEDS, 6)
    for lj in J.layer_jacobians(model, h0):
        assert lj.linear is None
        assert _rel(lj.branch, _branch_oracle(lj.block, lj.h_in, "rev")) <= 1e-12


def test_masked_relu_uses_only_active_units():
    model = ResidualMLP(32, 2, expansion=4, seeds=[0, 1])
    lj = next(J.layer_jacobians(model, gaussian_input([0, 1], 32)))
    z = lj.block.preactivation(lj.h_in)[:, 0]
    for a, zi in zip(lj.linear.active, z, strict=True):
        assert torch.equal(a, torch.nonzero(zi > 0).squeeze(1))
    assert 0.3 * 128 < sum(map(len, lj.linear.active)) / len(lj.linear.active) < 0.7 * 128
    assert lj.linear.apply_is_cheaper() is False  # |a| ≈ m/2 = 2d > d: forming J_b is cheaper


def test_factored_and_dense_products_agree_at_m_over_d_1():
    """m/d = 1 ReLU: |a| ≈ d/2 < d, so the io-only sweep applies J_b without forming it."""
    model = ResidualMLP(24, 12, expansion=1, seeds=SEEDS, placement="post")
    h0 = gaussian_input(SEEDS, 24)
    lj = next(J.layer_jacobians(model, h0))
    assert lj.linear.apply_is_cheaper()
    io = J.forward_sweep(model, h0, needs={"io_jacobian"})
    full = J.forward_sweep(model, h0)  # branch norms force the dense route
    assert _rel(io.io_unit, full.io_unit) <= 1e-12
    torch.testing.assert_close(io.log_gain[:, -1], full.log_gain[:, -1], rtol=1e-13, atol=0)


# --------------------------------------------------------------------------- item 2: only the work asked for
def _count(monkeypatch, module, name):
    calls = {"n": 0}
    fn = getattr(module, name)

    def counted(*a, **k):
        calls["n"] += 1
        return fn(*a, **k)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_io_jacobian_alone_does_one_svd(monkeypatch):
    svds = _count(monkeypatch, J, "singular_values")
    grams = _count(monkeypatch, J, "gram_ranks")
    model = ResidualMLP(16, 9, seeds=[0])
    m = run_probes(model, ["io_jacobian"])
    assert svds["n"] == 1 and grams["n"] == 0
    ref = run_probes(model, ["io_jacobian", "profile"])
    assert m.scalars["erank_io"] == pytest.approx(ref.scalars["erank_io"], rel=1e-12)
    # the profile asks for every layer's spectrum: 8 Gram spectra (exact here) and the last SVD
    assert (svds["n"], grams["n"]) == (1 + 1, 8)


def test_branch_ratio_forms_no_running_product(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the running product was computed")

    monkeypatch.setattr(J, "advance", refuse)
    model = ResidualMLP(16, 5, seeds=[0, 1], placement="post")
    m = run_probes(model, ["branch_ratio", "accumulated_branch"])
    assert m.scalars["branch_ratio_last"] > 0


def test_stream_is_forward_only(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a Jacobian was computed")

    monkeypatch.setattr(J, "layer_jacobians", refuse)
    model = ResidualMLP(16, 6, seeds=[0, 1])
    m = run_probes(model, ["stream"])
    monkeypatch.undo()
    sweep = J.forward_sweep(model, gaussian_input([0, 1], 16))  # v1's stream: the sweep's own input
    np.testing.assert_array_equal(m.arrays["rms"], sweep.rms.numpy())


def test_stream_with_many_inputs_estimates_kappa():
    """``task.options.stream.inputs=64``: the mean-rms² estimator of κ = E[relu²] = ½; averaging
    the inputs removes the per-input noise (what is left is the weights' seed-to-seed noise)."""
    model = ResidualMLP(64, 48, expansion=2, seeds=list(range(6)))
    many = run_probes(model, ["stream"], options={"stream": {"inputs": 64}}).scalars
    one = run_probes(model, ["stream"]).scalars
    assert many["stream_kappa"] == pytest.approx(0.5, abs=0.05)
    assert many["stream_kappa_std"] < 0.7 * one["stream_kappa_std"]
    with pytest.raises(ValueError, match="unknown key"):
        run_probes(model, ["stream"], options={"stream": {"n": 3}})


def test_shared_sweep_forms_each_block_jacobian_once(monkeypatch):
    calls = _count(monkeypatch, J, "linearize_branch")
    model = ResidualMLP(12, 7, seeds=[0, 1])
    m = run_probes(model, ["io_jacobian", "profile", "branch_ratio", "accumulated_branch", "path_order"])
    assert calls["n"] == 7
    assert m.scalars["path_reconstruction_error"] < 1e-12


def test_probe_context_rejects_unknown_needs():
    model = ResidualMLP(8, 2, seeds=[0])
    with pytest.raises(ValueError, match="unknown need"):
        ProbeContext(model, gaussian_input([0], 8), needs={"hessian"}, folds=FOLDS)


def test_measure_imports_neither_scipy_stats_nor_dynamo():
    """Heavy imports are lazy: a relu io_jacobian measurement loads neither scipy.stats (the
    theory module's distributions) nor torch._dynamo (torch.func's first call)."""
    code = (
        "import sys\n"
        "from rankexp.tasks.measure import run_probes\n"
        "from rankexp.models.mlp import ResidualMLP\n"
        "run_probes(ResidualMLP(16, 4, seeds=[0]), ['io_jacobian', 'profile', 'stream', 'branch_ratio'])\n"
        "print(sorted(m for m in ('scipy.stats._stats_py', 'torch._dynamo', 'matplotlib') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- item 3: seed chunks
ALL_PROBES = ["io_jacobian", "profile", "stream", "branch_ratio", "accumulated_branch", "path_order",
              "representation", "backward_representation", "branch_jacobian", "activation_spike",
              "projection_split"]
OPTIONS = {"representation": {"n": 16}, "backward_representation": {"n": 16},
           "activation_spike": {"n": 32}, "stream": {"inputs": 3}}


def _assert_identical(a: Measurement, b: Measurement):
    assert a.scalars.keys() == b.scalars.keys()
    for k in a.scalars:
        assert a.scalars[k] == b.scalars[k] or (math.isnan(a.scalars[k]) and math.isnan(b.scalars[k])), k
    assert a.series.keys() == b.series.keys()
    for k in a.series:
        np.testing.assert_array_equal(a.series[k][0], b.series[k][0])
        np.testing.assert_array_equal(a.series[k][1], b.series[k][1], err_msg=k)
    assert a.arrays.keys() == b.arrays.keys()
    for k in a.arrays:
        np.testing.assert_array_equal(a.arrays[k], b.arrays[k], err_msg=k)


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_seed_chunks_give_the_one_batch_result_exactly(placement):
    def build(seeds):
        return ResidualMLP(12, 5, expansion=2, placement=placement, seeds=list(seeds))

    seeds = range(10, 15)
    one = measure_seeds(build, seeds, ALL_PROBES, chunk=5, options=OPTIONS)
    for chunk in (1, 2):
        _assert_identical(measure_seeds(build, seeds, ALL_PROBES, chunk=chunk, options=OPTIONS), one)
    _assert_identical(one, run_probes(build(seeds), ALL_PROBES, options=OPTIONS))


def test_join_refuses_pooled_values_without_reduce():
    a, b = Measurement(), Measurement()
    a.add_seed_stat("x", torch.tensor([1.0, 2.0]))
    b.add_seed_stat("x", torch.tensor([3.0]))
    a.scalars["pooled"], b.scalars["pooled"] = 1.0, 2.0
    with pytest.raises(ValueError, match="pooled"):
        join_seeds([a, b])
    b.scalars["pooled"] = 1.0
    j = join_seeds([a, b])
    assert j.scalars["x"] == 2.0 and j.scalars["x_std"] == pytest.approx(1.0)


def test_every_probe_declares_a_memory_estimate():
    from rankexp.probes import CIFAR_PROBES
    from rankexp.probes.catalog import ConvShape, ModelShape

    mlp, conv = ModelShape(256, 48, 1024, 2, 1, 8), ConvShape(110, 16, 4)  # the ConvNets' own shape
    for name, probe in PROBES.items():
        assert probe.memory(conv if name in CIFAR_PROBES else mlp, {}) > 0, name


def test_cli_chunks_seeds_to_the_budget_and_reports_peak_memory(tmp_path):
    cmd = [sys.executable, "-m", "rankexp", "width=16", "depth=3", "seeds=3", "task.max_memory_gb=1e-6",
           "tracking=off", "device=cpu", f"hydra.run.dir={tmp_path}/run"]
    one_thread = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    subprocess.run(cmd, cwd=tmp_path, check=True, capture_output=True, env=one_thread)
    s = json.loads((tmp_path / "run" / "result" / "result.json").read_text())["scalars"]
    assert s["seed_chunk"] == 1.0
    assert 0.05 < s["peak_memory_gb"] < 64
    for part in ("build", "measure"):  # one thread: CPU seconds never exceed the wall's
        assert 0 < s[f"{part}_cpu_seconds"] <= s[f"{part}_seconds"] + 1e-3, part
    bad = subprocess.run([*cmd[:-1], "task.max_memory_gb=-1", f"hydra.run.dir={tmp_path}/bad"],
                         cwd=tmp_path, capture_output=True, text=True)
    assert bad.returncode != 0 and "task.max_memory_gb" in bad.stderr
