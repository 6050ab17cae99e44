"""He et al.'s CIFAR ConvNets (rankexp/models/convnet.py) against a hand-built reference."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from rankexp.models.convnet import (
    HE_DEPTHS,
    HE_PARAMS_M,
    CifarResNet,
    blocks_per_stage,
    shortcut_option_a,
)


# --------------------------------------------------------------------------- the reference
class RefBlock(nn.Module):
    """torch.nn layers, the shortcut written out as He et al. describe option A."""

    def __init__(self, c_in, c_out, stride, residual):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.c_in, self.c_out, self.stride, self.residual = c_in, c_out, stride, residual

    def shortcut(self, x):
        x = x[:, :, :: self.stride, :: self.stride]
        zeros = x.new_zeros(x.shape[0], self.c_out - self.c_in, *x.shape[2:])
        return torch.cat([x, zeros], 1)

    def forward(self, x):
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + self.shortcut(x) if self.residual else y)


class RefNet(nn.Module):
    def __init__(self, depth, residual, width=16):
        super().__init__()
        n = (depth - 2) // 6
        self.conv = nn.Conv2d(3, width, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        blocks, c_in = [], width
        for stage in range(3):
            for b in range(n):
                c_out = width * 2**stage
                blocks.append(RefBlock(c_in, c_out, 2 if stage and not b else 1, residual))
                c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(c_in, 10)

    def forward(self, x):
        h = self.blocks(F.relu(self.bn(self.conv(x))))
        return self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1))


def reference_of(model: CifarResNet, e: int) -> RefNet:
    """A RefNet holding member e's weights."""
    ref = RefNet(model.depth, model.residual, model.base_width).to(torch.float64)
    ours = [model.stem] + [c for b in model.blocks for c in (b.conv1, b.conv2)]
    bns = [model.stem_bn] + [m for b in model.blocks for m in (b.bn1, b.bn2)]
    theirs = [ref.conv] + [c for b in ref.blocks for c in (b.conv1, b.conv2)]
    their_bns = [ref.bn] + [m for b in ref.blocks for m in (b.bn1, b.bn2)]
    with torch.no_grad():
        for a, b in zip(ours, theirs, strict=True):
            b.weight.copy_(a.weight[e])
        for a, b in zip(bns, their_bns, strict=True):
            b.weight.copy_(a.weight[e])
            b.bias.copy_(a.bias[e])
            b.running_mean.copy_(a.running_mean[e])
            b.running_var.copy_(a.running_var[e])
        ref.fc.weight.copy_(model.fc_weight[e])
        ref.fc.bias.copy_(model.fc_bias[e])
    return ref


def perturb(model: CifarResNet, seed: int = 0) -> None:
    """Non-trivial BN parameters and statistics (the initial ones are 1/0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if "bn" in name or "fc_bias" in name:
                noise = torch.rand(t.shape, generator=g, dtype=t.dtype)
                t.copy_(0.5 + noise if "var" in name or "weight" in name else noise - 0.5)


# --------------------------------------------------------------------------- tests
def test_option_a_subsamples_and_zero_pads_channels():
    x = torch.arange(2 * 2 * 4 * 4, dtype=torch.float64).view(1, 2 * 2, 4, 4)  # E=2 members, C=2
    y = shortcut_option_a(x, members=2, c_out=4, stride=2)
    assert y.shape == (1, 2 * 4, 2, 2)
    for e in range(2):
        for c in range(2):
            assert torch.equal(y[0, e * 4 + c], x[0, e * 2 + c, ::2, ::2])  # pixels (0,0),(0,2),…
        assert torch.equal(y[0, e * 4 + 2 : e * 4 + 4], torch.zeros(2, 2, 2, dtype=torch.float64))
    assert shortcut_option_a(x, 2, 2, 1) is x


@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("train_mode", [True, False])
def test_network_equals_the_hand_built_reference_for_every_member(residual, train_mode):
    model = CifarResNet(14, residual=residual, base_width=4, seeds=[3, 4, 5], dtype=torch.float64)
    perturb(model)
    x = torch.randn(6, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    model.train(train_mode)
    logits = model(x.flatten(1))
    assert logits.shape == (3, 6, 10)
    for e in range(3):
        ref = reference_of(model, e).train(train_mode)
        torch.testing.assert_close(logits[e], ref(x), rtol=1e-10, atol=1e-10)
    # the plain and residual networks differ exactly by the shortcuts
    other = CifarResNet(14, residual=not residual, base_width=4, seeds=[3, 4, 5],
                        dtype=torch.float64)
    other.load_state_dict(model.state_dict())
    assert not torch.allclose(other.train(train_mode)(x), logits)


def test_layer_counts_shapes_and_parameter_counts():
    for depth in HE_DEPTHS:
        n = blocks_per_stage(depth)
        model = CifarResNet(depth)
        assert len(model.convs) == model.conv_layers == 6 * n + 1 == depth - 1  # + the FC layer
        assert len(model.blocks) == 3 * n
        assert [i for i, b in enumerate(model.blocks) if b.downsamples] == [n, 2 * n]
        # closed form: convs 3·16·9 + Σ c_in c_out 9, BN 2C per conv, FC 64·10 + 10
        widths = [(3, 16)] + [(16, 16)] * (2 * n) + [(16, 32)] + [(32, 32)] * (2 * n - 1) + [
            (32, 64)] + [(64, 64)] * (2 * n - 1)
        expected = sum(9 * a * b + 2 * b for a, b in widths) + 64 * 10 + 10
        assert model.parameter_count() == expected
        assert model.parameter_count() == pytest.approx(HE_PARAMS_M[depth] * 1e6, rel=0.02)
        assert CifarResNet(depth, residual=False).parameter_count() == expected  # A: no params
    model = CifarResNet(8, seeds=[0, 1])
    shapes = []
    model(torch.zeros(2, 3072), on_response=lambda layer, r: shapes.append((layer, r.shape[1:])))
    assert shapes == [(1, (32, 32, 32)), (2, (32, 32, 32)), (3, (32, 32, 32)),
                      (4, (64, 16, 16)), (5, (64, 16, 16)), (6, (128, 8, 8)), (7, (128, 8, 8))]
    assert model(torch.zeros(5, 3, 32, 32)).shape == (2, 5, 10)
    print({d: CifarResNet(d).parameter_count() for d in HE_DEPTHS})  # the table's 0.27…1.7 M


def test_depth_must_be_six_n_plus_two():
    for bad in (7, 9, 48, 0, True):
        with pytest.raises(ValueError, match="6n\\+2"):
            CifarResNet(bad)


def test_members_are_their_seeds_and_init_is_he_fan_out():
    batched = CifarResNet(8, seeds=[7, 8], dtype=torch.float64)
    for e, seed in enumerate([7, 8]):
        single = CifarResNet(8, seeds=[seed], dtype=torch.float64)
        for name, t in single.state_dict().items():
            assert torch.equal(batched.state_dict()[name][e], t[0]), name
    conv = CifarResNet(20, seeds=[0], dtype=torch.float64).blocks[-1].conv2.weight[0]
    assert conv.std().item() == pytest.approx(math.sqrt(2 / (9 * 64)), rel=0.02)
    assert abs(conv.mean().item()) < 3 * math.sqrt(2 / (9 * 64)) / math.sqrt(conv.numel())
    fc = CifarResNet(20, seeds=[0], dtype=torch.float64).fc_weight[0]
    assert fc.abs().max() <= 1 / 8 and fc.abs().max() > 0.12  # U(±1/√64)


def test_lesion_replaces_exactly_one_block_by_its_shortcut():
    model = CifarResNet(14, residual=True, base_width=4, seeds=[0], dtype=torch.float64).eval()
    perturb(model)
    x = torch.randn(3, 3072, dtype=torch.float64)
    for lesioned in range(len(model.blocks)):
        h = model.stem_forward(x)
        for i, blk in enumerate(model.blocks):
            h = blk.shortcut(h) if i == lesioned else blk(h)
        torch.testing.assert_close(model(x, lesion=lesioned), model.head(h), rtol=0, atol=0)
    assert not torch.allclose(model(x, lesion=0), model(x))


def test_configs_of_the_family_are_checked_before_any_run():
    """Depth 6n+2, the family's own probes, lesion only after training, one LR when a
    trained network is measured; the other families refuse the ConvNet probes."""
    from hydra import compose, initialize_config_dir

    from rankexp.cli import CONF_DIR
    from rankexp.config import ConfigError, validate

    def config(*overrides: str):
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            return validate(compose("config", list(overrides)))

    ok = config("model=cifar_resnet", "depth=56", "model.residual=false",
                "task.probes=[init_gradient_norms,layer_response]")
    assert ok.model.residual is False and ok.depth == 56
    config("model=cifar_resnet", "depth=8", "task=train", "task.lrs=[0.1]", "task.probes=[lesion]")
    # every learning rate of a sweep is probed (issue 21): no one-rate restriction
    config("model=cifar_resnet", "depth=8", "task=train", "task.lrs=[0.1,0.05]", "task.probes=[lesion]")
    for overrides, match in (
        (["model=cifar_resnet", "depth=21", "task.probes=[init_gradient_norms]"], "6n\\+2"),
        (["model=cifar_resnet", "depth=20"], "not probes of model=cifar_resnet"),  # MLP defaults
        (["model=cifar_resnet", "depth=20", "task.probes=[lesion]"], "trained network"),
        (["task.probes=[layer_response]"], "need model=cifar_resnet"),
        (["model=plain", "task.probes=[init_gradient_norms]"], "need model=cifar_resnet"),
        (["model=cifar_resnet", "model.base_width=0", "task.probes=[layer_response]"], "base_width"),
    ):
        with pytest.raises(ConfigError, match=match):
            config(*overrides)
