"""model=plain and the mean-field probes measured against theory and independent computations
(autograd, torch.func Jacobians and their SVDs, closed forms).  Wide networks where a test
compares with mean-field theory (n ≥ 1000), tolerances from the measured spread over seeds."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from torch.func import functional_call, jacfwd, vmap

from rankexp import theory
from rankexp.cli import CONF_DIR
from rankexp.config import ConfigError, config_hash, resolved_container, validate
from rankexp.models import build_model
from rankexp.models.plain import PlainNet, batchnorm
from rankexp.probes.gradients import (
    input_gradients,
    lag1_autocorrelation,
    random_readout,
    scalar_embedding,
)
from rankexp.probes.meanfield import correlated_inputs, fit_depth_scale, layer_chi, member_tangents
from rankexp.tasks.measure import run_probes


def compose_config(*overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", list(overrides))


def monte_carlo_ok(measured, std, seeds, expected, floor) -> np.ndarray:
    """|measured − expected| within 4 standard errors over seeds plus a finite-width floor.

    Along a series the spread over a handful of seeds is itself noisy, so the standard error
    is the RMS of the series' spreads."""
    se = np.sqrt(np.mean(np.square(std))) / math.sqrt(seeds)
    return np.abs(np.asarray(measured) - expected) <= 4 * se + floor


# --------------------------------------------------------------------------- the model family
@pytest.mark.parametrize("init", ["gaussian", "orthogonal"])
def test_members_are_bit_identical_to_one_member_models(init):
    kw = dict(activation="tanh", alpha=1.3, bias=0.2, init=init, depth=3)
    big = PlainNet(24, seeds=[5, 6, 7], **kw)
    one = PlainNet(24, seeds=[6], **kw)
    for p_big, p_one in zip(big.parameters(), one.parameters(), strict=True):
        assert torch.equal(p_big[1], p_one[0])
    x = torch.randn(3, 5, 24, dtype=torch.float64)
    assert torch.equal(big(x)[1], one(x[1:2])[0])


@pytest.mark.parametrize(("probe", "key", "kw"), [
    ("correlation", "mf_c", dict(norm_op="rmsnorm")),
    ("jacobian_spectrum", "lambda", {}),
    ("gradient_norms", "grad_norm", dict(norm_op="batchnorm")),
    ("shattered", "shattered_autocorr", dict(norm_op="batchnorm", skip_every=1)),
])
def test_a_members_probe_numbers_do_not_depend_on_the_other_seeds(probe, key, kw):
    def arrays(seeds):
        net = PlainNet(24, 3, activation="tanh", alpha=1.2, bias=0.1, seeds=seeds, **kw)
        return run_probes(net, [probe]).arrays[key]

    assert np.allclose(arrays([3, 4])[1], arrays([4])[0], rtol=1e-12, atol=1e-14)


def test_weight_laws():
    n, sw = 400, 1.7
    orth = PlainNet(n, 2, alpha=sw, init="orthogonal").blocks[0].w[0]
    assert torch.allclose(orth @ orth.T, sw**2 * torch.eye(n, dtype=orth.dtype), atol=1e-12)
    gauss = PlainNet(n, 1, alpha=sw, bias=0.3, seeds=[1])
    w, b = gauss.blocks[0].w[0], gauss.blocks[0].b[0]
    assert w.var().item() * n == pytest.approx(sw**2, rel=0.02)  # 160 000 entries
    assert b.std().item() == pytest.approx(0.3, rel=0.15)
    # σ_b = 0 keeps the draws of every other σ_b: the weights are the same numbers
    assert torch.equal(PlainNet(n, 1, alpha=sw, seeds=[1]).blocks[0].w, gauss.blocks[0].w)


def test_batchnorm_normalizes_over_the_batch_and_refuses_one_input():
    x = 3 + 2 * torch.randn(2, 64, 8, dtype=torch.float64)
    y = batchnorm(x)
    assert torch.allclose(y.mean(-2), torch.zeros(2, 8, dtype=y.dtype), atol=1e-12)
    assert torch.allclose(y.var(-2, unbiased=False), torch.ones(2, 8, dtype=y.dtype), atol=1e-5)
    with pytest.raises(ValueError, match="batch"):
        batchnorm(x[:, :1])


def test_config_knobs_and_refusals():
    small = ("width=8", "depth=2")
    s = validate(compose_config("model=plain", "bias=0.3", "init=orthogonal", *small))
    assert s.norm.placement.value == "none"  # the family's own default: no norm
    net = build_model(s, "cpu")
    assert isinstance(net, PlainNet) and net.sigma_b == 0.3 and net.init == "orthogonal"
    bn = build_model(validate(compose_config("model=plain", "norm=pre", "norm.op=batchnorm",
                                             "task.probes=[shattered]", *small)))
    assert bn.blocks[0].norm_op == "batchnorm"
    for overrides, key in ((["bias=0.1"], "bias"), (["init=orthogonal"], "init"),
                           (["norm.op=batchnorm"], "norm.op"),
                           (["norm.post=batchnorm"], "norm.post"),
                           (["model=plain", "norm=pre", "norm.post=rmsnorm"], "norm.post"),
                           (["model=plain", "norm=post"], "norm")):
        with pytest.raises(ConfigError, match=rf"{key}=.*model=plain"):
            validate(compose_config(*overrides))
    with pytest.raises(ConfigError, match="need model=plain"):
        validate(compose_config("task.probes=[correlation]"))
    with pytest.raises(ConfigError, match="batchnorm needs a batch"):  # default probes: one input
        validate(compose_config("model=plain", "norm=pre", "norm.op=batchnorm"))
    validate(compose_config("model=plain", "norm=pre", "norm.op=batchnorm", "task.probes=[shattered]"))
    # the new knobs at their defaults leave every existing config hash unchanged
    container = resolved_container(compose_config("norm=post", "alpha=2"))
    old = {k: v for k, v in container.items() if k not in ("bias", "init")}
    assert config_hash(container) == config_hash(old)
    assert config_hash({**container, "bias": 0.1}) != config_hash(container)


def test_plain_stack_fits_the_training_classifier():
    from rankexp.tasks.train import Classifier

    s = validate(compose_config("model=plain", "task=train", "width=8", "depth=3",
                                "activation=tanh", "bias=0.2"))
    clf = Classifier(build_model(s, "cpu", seeds=[0, 0], dtype=torch.float32), in_features=12)
    assert clf(torch.randn(5, 12)).shape == (2, 5, 10)
    assert all(p.shape[0] == 2 for p in clf.parameters())
    assert clf.architecture()["activation"] == "tanh"


# --------------------------------------------------------------------------- correlation
@pytest.mark.parametrize(("activation", "sw2", "sb2"), [("tanh", 1.5, 0.05), ("tanh", 3.0, 0.05),
                                                        ("relu", 2.0, 0.0)])
def test_lengths_and_correlations_follow_the_iterated_maps(activation, sw2, sb2):
    seeds, depth = 4, 6
    net = PlainNet(1000, depth, activation=activation, alpha=sw2**0.5, bias=sb2**0.5,
                   seeds=range(seeds))
    r = run_probes(net, ["correlation"], options={"correlation": {"c0": 0.6, "q0": 1.5}})
    q, q_std, q_th = (r.series[k][1] for k in ("mf_q", "mf_q_std", "mf_q_theory"))
    c, c_std, c_th = (r.series[k][1] for k in ("mf_c", "mf_c_std", "mf_c_theory"))
    assert q[0] == pytest.approx(1.5) and c[0] == pytest.approx(0.6)  # exact inputs
    assert monte_carlo_ok(q[1:], q_std[1:], seeds, q_th[1:], 0.01 * q_th[1:]).all()
    assert monte_carlo_ok(c[1:], c_std[1:], seeds, c_th[1:], 0.01).all()
    # the theory moved: it is not the input values carried along
    assert abs(c_th[-1] - 0.6) > 0.1


def test_chi1_is_the_mean_squared_singular_value_of_the_layer_jacobian():
    n = 200
    net = PlainNet(n, 3, activation="tanh", alpha=1.6, bias=0.2, seeds=[0, 1])
    x = correlated_inputs(net.seeds, n, 2, 0.5, 1.0)
    with torch.no_grad():
        h = net.trajectory(x)[2]  # the input of layer 3
    layer = net.blocks[2]
    chi = layer_chi(layer, h)  # (E, 2, 2)
    params = dict(layer.named_parameters())
    jac = vmap(jacfwd(lambda p, xe: functional_call(layer, p, (xe,)), argnums=1))(params, h[:, 0])
    s2 = torch.linalg.svdvals(jac.detach()).square().mean(-1)
    assert torch.allclose(chi[:, 0, 0], s2, rtol=1e-10)
    # and it is χ₁ of the mean-field theory at the layer's measured q, within 4 standard errors
    # of the n-unit mean σ_w² ⟨φ′(h)²⟩ it estimates
    q = h[:, 0].square().mean(-1)
    expected = torch.tensor([theory.chi_1("tanh", 1.6**2, float(v)) for v in q], dtype=s2.dtype)
    se = 1.6**2 * (1 - torch.tanh(h[:, 0]) ** 2).square().std(-1) / n**0.5
    assert ((s2 - expected).abs() <= 4 * se).all()
    # a per-sample norm op goes through the forward-mode estimator
    rms = PlainNet(n, 1, activation="tanh", alpha=1.6, norm_op="rmsnorm", seeds=[0])
    jr = vmap(jacfwd(lambda p, xe: functional_call(rms.blocks[0], p, (xe,)), argnums=1))(
        dict(rms.blocks[0].named_parameters()), x[:1, 0])
    est = layer_chi(rms.blocks[0], x[:1], member_tangents([0], n, 32))
    assert est[0, 0, 0].item() == pytest.approx(jr.square().sum().item() / n, rel=0.05)


def test_measured_depth_scale_matches_theory_away_from_criticality():
    net = PlainNet(500, 24, activation="tanh", alpha=1.0, bias=0.05**0.5, seeds=range(4))
    r = run_probes(net, ["correlation"]).scalars
    assert r["chi1"] == pytest.approx(r["chi1_theory"], rel=0.02)
    assert r["xi_c"] == pytest.approx(r["xi_c_theory"], rel=0.1)
    assert r["xi_c_theory"] == pytest.approx(3.627, rel=1e-3)


def test_depth_scale_fit_recovers_an_exponential():
    layers = np.arange(1, 60)
    xi, cinf = fit_depth_scale(layers, 0.3 + 0.5 * np.exp(-layers / 7.0))
    assert xi == pytest.approx(7.0, rel=1e-6) and cinf == pytest.approx(0.3, abs=1e-8)


# --------------------------------------------------------------------------- spectrum
def test_gaussian_linear_variance_is_depth_fuss_catalan():
    seeds = 6
    for depth in (3, 6):
        net = PlainNet(200, depth, activation="linear", seeds=range(seeds))
        r = run_probes(net, ["jacobian_spectrum"]).scalars
        assert r["lambda_var_theory"] == pytest.approx(depth, abs=1e-9)
        assert monte_carlo_ok(r["lambda_var"], r["lambda_var_std"], seeds, depth, 0.03 * depth)
        assert monte_carlo_ok(r["lambda_m2"], r["lambda_m2_std"], seeds, depth + 1, 0.03 * depth)


def test_orthogonal_linear_variance_is_zero_to_round_off():
    net = PlainNet(100, 12, activation="linear", alpha=1.3, init="orthogonal", seeds=[0, 1])
    r = run_probes(net, ["jacobian_spectrum"]).scalars
    assert abs(r["lambda_var"]) < 1e-12 and r["lambda_var_theory"] == 0
    assert r["log_lambda_mean"] == pytest.approx(12 * math.log(1.3**2), rel=1e-12)


def test_relu_spectrum_has_half_its_directions_in_the_kernel_and_variance_2L():
    net = PlainNet(300, 4, activation="relu", alpha=2**0.5, init="orthogonal", seeds=range(4))
    r = run_probes(net, ["jacobian_spectrum"]).scalars
    assert r["lambda_var_theory"] == pytest.approx(4.0)  # L (0 + 1)
    assert monte_carlo_ok(r["lambda_var"], r["lambda_var_std"], 4, 4.0, 0.3)
    assert r["lambda_zero_fraction"] == pytest.approx(0.5, abs=0.05)


# --------------------------------------------------------------------------- gradients
def gradient_ratios(norm_op, skip_every, beta_scaling="const"):
    out = {}
    for depth in (4, 8, 16):
        net = PlainNet(100, depth, activation="relu", alpha=2**0.5, norm_op=norm_op,
                       skip_every=skip_every, beta_scaling=beta_scaling, seeds=[0, 1])
        out[depth] = run_probes(net, ["gradient_norms"], options={"gradient_norms": {"batch": 128}}).scalars
    return out


def test_batchnorm_gradients_explode_toward_the_input_and_skips_keep_them_flat():
    plain = gradient_ratios("batchnorm", 0)
    assert plain[16]["grad_ratio"] > 3 * plain[8]["grad_ratio"] > 9 * plain[4]["grad_ratio"] / 3
    assert plain[16]["grad_ratio"] > 10
    # Yang et al. (2019): the squared norm grows by π/(π−1) per layer (large batch)
    assert plain[16]["grad_growth"] == pytest.approx(math.sqrt(math.pi / (math.pi - 1)), rel=0.05)
    skips = gradient_ratios("batchnorm", 1, "inv_sqrt_depth")
    assert all(0.5 < r["grad_ratio"] < 2 for r in skips.values())
    no_bn = gradient_ratios(None, 0)  # He-initialized plain ReLU: no explosion either
    assert no_bn[16]["grad_ratio"] < 4


def test_shattered_input_gradient_is_the_derivative_of_the_network():
    net = PlainNet(32, 5, activation="relu", alpha=2**0.5, norm_op="batchnorm", skip_every=1,
                   seeds=[0, 1])
    x = torch.linspace(-2, 2, 64, dtype=torch.float64)
    w, b = scalar_embedding(net.seeds, 32)
    v, _ = random_readout(net.seeds, 32, 1)
    fwd = input_gradients(net, x, w, b, v)  # (E, L, P) by forward mode
    xs = x.expand(2, -1).clone().requires_grad_(True)
    out = net(xs[..., None] * w[:, None] + b[:, None], detach_stats=True) @ v[:, :, None]
    (grad,) = torch.autograd.grad(out.sum(), xs)
    assert torch.allclose(fwd[:, -1], grad, rtol=1e-10, atol=1e-12)
    # without batchnorm the network is per point: a central difference agrees
    plain = PlainNet(32, 5, activation="tanh", alpha=1.5, bias=0.1, seeds=[0, 1])
    fwd = input_gradients(plain, x, w, b, v)[:, -1]

    def y(xv):
        with torch.no_grad():
            return (plain(xv[..., None] * w[:, None] + b[:, None]) @ v[:, :, None])[..., 0]

    h = 1e-5
    fd = (y(x.expand(2, -1) + h) - y(x.expand(2, -1) - h)) / (2 * h)
    assert torch.allclose(fwd, fd, rtol=1e-6, atol=1e-9)
    smooth = torch.sin(torch.linspace(0, 3, 200, dtype=torch.float64))
    noise = torch.randn(4000, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert lag1_autocorrelation(smooth) > 0.95 and abs(lag1_autocorrelation(noise)) < 0.05


def test_plain_batchnorm_gradients_shatter_and_residual_ones_do_not():
    def autocorr(skip_every):
        net = PlainNet(100, 16, activation="relu", alpha=2**0.5, norm_op="batchnorm",
                       skip_every=skip_every, seeds=range(3))
        return run_probes(net, ["shattered"]).series["shattered_autocorr"][1]

    plain, residual = autocorr(0), autocorr(1)
    assert plain[-1] < 0.3 and residual[-1] > 0.6
    assert plain[0] > 0.9  # one layer is smooth


def test_nominal_ratio_of_a_plain_residual_net_is_beta_sigma_w():
    """A plain net has one matrix per layer: its branch-to-skip ratio is β σ_w, not β σ_w^M."""
    from rankexp.app import derived_params

    small = ("width=8", "depth=4")
    plain = derived_params(validate(compose_config("model=plain", "alpha=1.5", "beta=0.5",
                                                   "skip_every=1", *small)))
    mlp = derived_params(validate(compose_config("alpha=1.5", "beta=0.5", "matrices=2", *small)))
    assert plain["nominal_ratio"] == pytest.approx(0.5 * 1.5)
    assert mlp["nominal_ratio"] == pytest.approx(0.5 * 1.5**2)
    assert plain["depth_factor"] == pytest.approx(0.75 * 2)


@pytest.mark.parametrize("skip_every", [0, 1])
def test_io_jacobian_of_a_plain_net_is_autograds(skip_every):
    """The engine's sweep on ``model=plain`` (its layers have no closed form: the ``torch.func``
    fallback per layer) gives ∂h_L/∂h_0 equal to ``jacrev`` of the whole network, per member,
    and the run's ``erank_io`` is that Jacobian's (a layer without R and without P)."""
    from torch.func import jacrev

    from rankexp.probes.jacobian import forward_sweep

    net = PlainNet(12, 5, activation="tanh", alpha=1.3, bias=0.2, skip_every=skip_every,
                   beta=0.7, seeds=[3, 4])
    h0 = torch.randn(2, 1, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    sweep = forward_sweep(net, h0, keep_partials=True)
    for e in range(2):
        def f(x, e=e):
            return net(x.expand(2, 1, 12))[e, 0]
        want = jacrev(f)(h0[e:e + 1])[:, 0, 0, :]
        torch.testing.assert_close(sweep.partials[-1][e], want, rtol=1e-12, atol=1e-12)
        p = torch.linalg.svdvals(want.detach())
        p = p / p.sum()
        assert float(sweep.erank[e, -1]) == pytest.approx(float(torch.exp(-(p * p.log()).sum())), rel=1e-10)
