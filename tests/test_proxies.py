"""The zero-cost proxies (rankexp/probes/proxies.py) against closed forms and autograd.

* synflow of a linear chain (Tanaka et al. 2020): each layer's ``Σ θ ∂R/∂θ`` is R (R is
  homogeneous of degree 1 in every layer), so the score is L·R with R = 1ᵀ(Π|W_l|)1;
  of a linear residual stack ``A_l = I + β|W_l|`` it is Σ_l 1ᵀ(Π_{k>l}A_k) β|W_l| (Π_{k<l}A_k) 1;
* jacob_cov (Mellor et al. 2021 v1) of a linear network: every input has the same Jacobian,
  the correlation matrix is all ones, its eigenvalues N, 0, …, 0;
* grad_norm of one linear layer: ∂ℓ/∂W = v (Xᵀg/B)ᵀ, norm ‖v‖ ‖Xᵀg‖/B.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.func import jacrev

from rankexp.models.mlp import ResidualMLP
from rankexp.models.plain import PlainNet
from rankexp.probes import INIT_PROBES, PROBES
from rankexp.probes.gradients import random_readout
from rankexp.probes.proxies import input_jacobians, jacob_cov_score, log_synflow
from rankexp.seeding import gaussian_input
from rankexp.tasks.measure import run_probes

PROXIES = ("grad_norm_proxy", "jacob_cov", "synflow")


def test_synflow_of_a_linear_chain_is_depth_times_the_product_of_absolute_weights():
    depth, n = 6, 12
    net = PlainNet(n, depth, activation="linear", alpha=1.3, seeds=[3, 4])
    got = log_synflow(net).numpy()
    for e in range(2):
        prod = np.eye(n)
        for layer in net.blocks:
            prod = np.abs(layer.w[e].detach().numpy()) @ prod
        r = prod.sum()
        np.testing.assert_allclose(got[e], math.log(depth * r), rtol=0, atol=1e-10)
    # the network itself keeps its signed weights
    assert (net.blocks[0].w < 0).any()


def test_synflow_of_a_linear_residual_stack_matches_its_path_sum():
    n, depth, beta = 8, 5, 0.7
    net = ResidualMLP(n, depth, matrices=1, activation="linear", placement="none", beta=beta,
                      seeds=[1])
    ws = [np.abs(b.w[0].detach().numpy()) for b in net.blocks]
    a = [np.eye(n) + beta * w for w in ws]
    one = np.ones(n)
    total = 0.0
    for layer in range(depth):
        left = np.eye(n)
        for k in range(depth - 1, layer, -1):
            left = left @ a[k]
        right = np.eye(n)
        for k in range(layer):
            right = a[k] @ right
        total += one @ left @ (beta * ws[layer]) @ right @ one
    np.testing.assert_allclose(log_synflow(net).numpy()[0], math.log(total), atol=1e-10)
    # a wrong relation (the chain's L·R) is far off: the check separates the two
    r = one @ np.linalg.multi_dot(a[::-1]) @ one
    assert abs(math.log(depth * r) - math.log(total)) > 0.1


def test_jacob_cov_score_is_mellors_numpy_formula():
    gen = torch.Generator().manual_seed(0)
    jac = torch.randn(2, 10, 30, generator=gen, dtype=torch.float64)
    got = jacob_cov_score(jac).numpy()
    for e in range(2):
        v = np.linalg.eigvalsh(np.corrcoef(jac[e].numpy()))
        np.testing.assert_allclose(got[e], -np.sum(np.log(v + 1e-5) + 1.0 / (v + 1e-5)), rtol=1e-10)
    with pytest.raises(ValueError, match="at least 2"):
        jacob_cov_score(jac[:, :1])


def test_jacob_cov_of_a_linear_network_has_one_eigenvalue_n():
    n, k = 16, 1e-5
    net = ResidualMLP(12, 4, matrices=2, expansion=1, activation="linear", placement="none",
                      seeds=[0])
    m = run_probes(net, ["jacob_cov"], options={"jacob_cov": {"batch": n}})
    closed = -(math.log(n + k) + 1 / (n + k) + (n - 1) * (math.log(k) + 1 / k))
    np.testing.assert_allclose(m.scalars["jacob_cov"], closed, rtol=1e-9)
    # a ReLU network's Jacobians differ by input: more than one nonzero eigenvalue, higher score
    relu = run_probes(ResidualMLP(12, 4, expansion=1, placement="none", seeds=[0]), ["jacob_cov"],
                      options={"jacob_cov": {"batch": n}})
    assert relu.scalars["jacob_cov"] > closed + 1e5


def test_input_jacobians_are_autograds_per_input_gradients():
    net = ResidualMLP(10, 3, expansion=2, placement="post", seeds=[0, 1])
    x = gaussian_input(net.seeds, 10, batch=4)
    got = input_jacobians(net, x)
    for e in range(2):
        for i in range(4):
            def f(xi, e=e, i=i):
                full = x.clone()
                full[e, i] = xi
                return net(full)[e, i].sum()
            torch.testing.assert_close(got[e, i], jacrev(f)(x[e, i]), rtol=1e-10, atol=1e-12)


def test_grad_norm_proxy_of_one_linear_layer_is_its_closed_form_and_per_member():
    n, b = 9, 32
    net = PlainNet(n, 1, activation="linear", seeds=[5, 6])
    m = run_probes(net, ["grad_norm_proxy"], options={"grad_norm_proxy": {"batch": b}})
    x = gaussian_input(net.seeds, n, batch=b)
    v, g = random_readout(net.seeds, n, b)
    closed = v.norm(dim=1) * (x.mT @ g[..., None])[..., 0].norm(dim=1) / b
    np.testing.assert_allclose(m.arrays["grad_norm_proxy"], closed.numpy(), rtol=1e-12)
    # member e is its own seed: the two-member network's values are the one-member ones
    one = run_probes(PlainNet(n, 1, activation="linear", seeds=[6]), ["grad_norm_proxy"],
                     options={"grad_norm_proxy": {"batch": b}})
    np.testing.assert_allclose(one.arrays["grad_norm_proxy"][0], m.arrays["grad_norm_proxy"][1])
    # every weight matrix counts: M = 2 has 2L terms, more than the L of w_down alone
    two = ResidualMLP(8, 3, expansion=1, seeds=[0])
    total = run_probes(two, ["grad_norm_proxy"]).scalars["grad_norm_proxy"]
    assert total > 0 and math.isfinite(total)


def test_the_proxies_are_init_probes_with_options_in_the_catalog():
    assert set(PROXIES) <= set(INIT_PROBES)
    assert PROBES["jacob_cov"].options == {"batch": 128, "k": 1e-5}
    assert "Mellor" in PROBES["jacob_cov"].doc and "Tanaka" in PROBES["synflow"].doc
    with pytest.raises(ValueError, match="allowed"):
        run_probes(ResidualMLP(8, 2, seeds=[0]), ["jacob_cov"], options={"jacob_cov": {"n": 3}})


def test_synflow_overflow_is_infinite_not_nan():
    net = PlainNet(64, 300, activation="relu", alpha=4.0, seeds=[0])  # ≈ e^{3.2 L} > e^709
    assert log_synflow(net).item() == math.inf


def test_a_training_run_of_many_rates_takes_init_and_trained_probes():
    """The initial network is the one every rate starts from (the members share the seed): its
    probes run with the LR sweep; a probe of the trained network measures every rate's network
    (issue 21: probes during training on every member), so it is accepted too; an unknown
    probe is still refused."""
    from hydra import compose, initialize_config_dir

    from rankexp.cli import CONF_DIR
    from rankexp.config import ConfigError, validate

    def check(probes: str) -> None:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            validate(compose("config", ["task=train", "width=8", "depth=2",
                                        "task.lrs=[0.001,0.01]", f"task.probes={probes}"]))

    check("[grad_norm_proxy,jacob_cov,synflow]")
    check("[synflow,io_jacobian]")
    with pytest.raises(ConfigError, match=r"task.probes"):
        check("[synflow,deep_linear_bogus]")
