"""The weight draws (rankexp.seeding): each (seed, stream, draw) its own NumPy generator, and the
invariances the models rely on — members, chunks, threads, dtypes, devices — bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from rankexp import seeding as S
from rankexp.models.convnet import CifarResNet
from rankexp.models.mlp import ResidualMLP
from rankexp.models.plain import PlainNet


def test_streams_and_draws_are_independent_generators():
    firsts = {S.block_generator(s, t, k).standard_normal() for s in range(20) for t in range(4)
              for k in range(5)}
    assert len(firsts) == 400
    inputs = {S.seeded_generator(s, t).initial_seed() for s in range(50) for t in range(4)}
    assert len(inputs) == 200


def test_draws_follow_their_laws_at_their_scale():
    out = torch.empty(2, 200_000, dtype=torch.float64)
    S.normal_(out, [3, 4], block=7, scale=0.3)
    assert stats.kstest(out.numpy().ravel() / 0.3, "norm").pvalue > 1e-4
    assert not torch.equal(out[0], out[1])
    u = S.uniform_(torch.empty(1, 200_000, dtype=torch.float64), [3], block=7, low=-2, high=3)
    assert -2 <= u.min() and u.max() < 3
    assert stats.kstest((u.numpy().ravel() + 2) / 5, "uniform").pvalue > 1e-4


def test_members_calls_and_threads_do_not_change_a_draw():
    seeds = [5, 9, 11]
    shapes = [(3, 300, 70), (3, 70, 300), (3, 5)]

    def draw():
        outs = [torch.empty(shape, dtype=torch.float64) for shape in shapes]
        S.normal_many_([(o, 10 + i, 0.5 + i) for i, o in enumerate(outs)], seeds)
        return outs

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = draw()
        torch.set_num_threads(2)
        assert S.draw_threads(9) == 2
        two = draw()
    finally:
        torch.set_num_threads(threads)
    for i, (a, b) in enumerate(zip(one, two, strict=True)):
        assert torch.equal(a, b)
        alone = S.normal_(torch.empty(1, *shapes[i][1:], dtype=torch.float64), [9], 10 + i,
                          scale=0.5 + i)
        assert torch.equal(a[1], alone[0])
        scaled = torch.from_numpy(S.block_generator(9, S.STREAM_WEIGHTS, 10 + i)
                                  .standard_normal(shapes[i][1:])) * (0.5 + i)
        assert torch.equal(a[1], scaled)


def test_refuses_an_out_without_its_member_axis():
    with pytest.raises(ValueError, match="2 members first"):
        S.normal_(torch.empty(3, 4), [1, 2], 0)


def test_mlp_weights_are_the_documented_draws():
    """Block by block, matrices in ``weight_names`` order, draw number (l−1)·M + j, each
    α/√fan_in · N(0, 1) row-major."""
    alpha = 1.7
    net = ResidualMLP(12, 3, expansion=2, alpha=alpha, seeds=[3, 5])
    k = 0
    for block in net.blocks:
        for name in block.weight_names():
            p = getattr(block, name)
            ref = S.normal_(torch.empty_like(p), [3, 5], k, scale=alpha / math.sqrt(p.shape[-1]))
            assert torch.equal(p, ref), name
            k += 1
    assert k == 6


def build(family, seeds, dtype=torch.float64, device="cpu"):
    if family == "mlp":
        return ResidualMLP(10, 4, expansion=2, activation="swiglu", seeds=seeds, dtype=dtype,
                           device=device)
    if family == "plain":
        return PlainNet(10, 4, bias=0.3, seeds=seeds, dtype=dtype, device=device)
    if family == "orthogonal":
        return PlainNet(10, 4, init="orthogonal", bias=0.3, seeds=seeds, dtype=dtype, device=device)
    return CifarResNet(8, base_width=4, seeds=seeds, dtype=dtype, device=device)


FAMILIES = ["mlp", "plain", "orthogonal", "cifar_resnet"]


@pytest.mark.parametrize("family", FAMILIES)
def test_member_e_is_the_one_member_network_of_its_seed(family):
    batch, one = build(family, [4, 7, 9]), build(family, [7])
    for (name, p), q in zip(batch.named_parameters(), one.parameters(), strict=True):
        assert torch.equal(p[1], q[0]), name


@pytest.mark.parametrize("family", ["mlp", "plain", "cifar_resnet"])
def test_float32_weights_are_the_float64_ones_rounded(family):
    f64, f32 = build(family, [1, 2]), build(family, [1, 2], torch.float32)
    for (name, p), q in zip(f64.named_parameters(), f32.parameters(), strict=True):
        assert q.dtype == torch.float32 and torch.equal(q, p.to(torch.float32)), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cuda_holds_the_cpu_weights(dtype):
    cpu, cuda = build("mlp", [1, 2], dtype), build("mlp", [1, 2], dtype, "cuda")
    for p, q in zip(cpu.parameters(), cuda.parameters(), strict=True):
        assert q.is_cuda and torch.equal(q.cpu(), p)


def test_plain_orthogonal_weights_are_sigma_w_haar():
    net = PlainNet(16, 3, init="orthogonal", alpha=1.3, seeds=[0, 1])
    for layer in net.blocks:
        q = layer.w / 1.3
        torch.testing.assert_close(q @ q.mT, torch.eye(16, dtype=q.dtype).expand(2, 16, 16),
                                   rtol=0, atol=1e-14)


def test_init_scales_are_the_documented_ones():
    """MLP α²/fan_in, plain σ_b², He fan-out 2/(9 c_out) of the convs, ±1/√fan_in classifier."""
    mlp = ResidualMLP(64, 2, alpha=1.5, seeds=[0, 1])
    w = mlp.blocks[0].w_down  # fan_in = 256
    assert w.var().item() == pytest.approx(1.5**2 / 256, rel=0.02)
    plain = PlainNet(64, 40, bias=0.5, seeds=[0])
    assert torch.stack([layer.b for layer in plain.blocks]).std().item() == pytest.approx(0.5, rel=0.05)
    net = CifarResNet(20, base_width=16, seeds=[0])
    conv = net.blocks[-1].conv2
    assert conv.weight.var().item() == pytest.approx(2 / (9 * 64), rel=0.03)
    bound = 1 / np.sqrt(64)
    assert -bound <= net.fc_weight.min() and net.fc_weight.max() < bound
