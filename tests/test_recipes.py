"""He et al.'s recipe pieces (rankexp/tasks/recipes.py): per-member SGD, step decay, warm-up."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rankexp.models.convnet import CifarResNet
from rankexp.tasks.augment import PadCropFlip
from rankexp.tasks.data import DeviceDataset
from rankexp.tasks.optim import ADAM
from rankexp.tasks.recipes import MemberSGD, StepSchedule, decays, recipe
from rankexp.tasks.train import member_losses, train


def task(**kw):
    base = dict(optimizer="adam", momentum=0.9, weight_decay=0.0, schedule="constant",
                milestones=[0.5, 0.75], gamma=0.1, warmup_steps=0, warmup_factor=0.1,
                warmup_min_depth=0, augment="none", pad=4)
    return SimpleNamespace(**{**base, **kw})


HE = dict(optimizer="sgd", weight_decay=1e-4, schedule="step", warmup_steps=400,
          warmup_min_depth=110, augment="pad_crop_flip")


def images(n: int, seed: int = 0) -> DeviceDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3 * 32 * 32, generator=g, dtype=torch.float64)
    y = torch.randint(0, 10, (n,), generator=g)
    return DeviceDataset(x, y, x[:8], y[:8], torch.zeros(3), torch.ones(3))


def test_member_sgd_equals_torch_sgd_per_member_with_decay_off_bn_and_biases():
    lrs = [0.1, 0.03]
    model = CifarResNet(8, base_width=4, seeds=[1, 1], dtype=torch.float64)
    opt = MemberSGD(list(model.parameters()), lrs, momentum=0.9, weight_decay=1e-2,
                    decay=[decays(p) for p in model.parameters()])
    refs = [CifarResNet(8, base_width=4, seeds=[1], dtype=torch.float64) for _ in lrs]
    ref_opts = []
    for ref, lr in zip(refs, lrs, strict=True):
        decayed = [p for p in ref.parameters() if p.dim() > 2]
        plain = [p for p in ref.parameters() if p.dim() <= 2]
        assert len(plain) == 2 * 7 + 1  # BN scale + shift of 7 convs, the FC bias
        ref_opts.append(torch.optim.SGD([{"params": decayed, "weight_decay": 1e-2},
                                         {"params": plain, "weight_decay": 0.0}],
                                        lr=lr, momentum=0.9))
    data = images(16)
    alive = torch.ones(2, dtype=torch.bool)
    for step in range(4):
        x, y = data.x_train[4 * step:4 * step + 4], data.y_train[4 * step:4 * step + 4]
        model.zero_grad()
        member_losses(model(x), y).sum().backward()
        opt.step(alive, lr_scale=0.5 if step == 3 else 1.0)
        for ref, ref_opt in zip(refs, ref_opts, strict=True):
            for group in ref_opt.param_groups:
                group["lr"] = lrs[refs.index(ref)] * (0.5 if step == 3 else 1.0)
            ref.zero_grad()
            member_losses(ref(x), y).sum().backward()
            ref_opt.step()
    for e, ref in enumerate(refs):
        for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p[e], q[0], rtol=1e-12, atol=1e-14, msg=name)


def test_frozen_member_keeps_its_weights_and_state_round_trips():
    model = CifarResNet(8, base_width=4, seeds=[0, 0], dtype=torch.float64)
    opt = MemberSGD(list(model.parameters()), [0.1, 0.1], weight_decay=1e-4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    member_losses(model(images(4).x_train), images(4).y_train).sum().backward()
    for p in model.parameters():
        p.grad[1] = float("nan")  # a diverged member's gradient
    opt.step(torch.tensor([True, False]))
    for name, p in model.named_parameters():
        assert torch.equal(p[1], before[name][1]), name
        assert torch.isfinite(p).all() and not torch.equal(p[0], before[name][0]), name
    other = MemberSGD(list(model.parameters()), [0.1, 0.1], weight_decay=1e-4)
    other.load_state_dict(opt.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(other.velocity, opt.velocity, strict=True))
    with pytest.raises(ValueError, match="constants differ"):
        MemberSGD(list(model.parameters()), [0.1, 0.1]).load_state_dict(opt.state_dict())


def test_step_schedule_and_warm_up_at_depth_110_only():
    he = StepSchedule((0.5, 0.75), 0.1, warmup_steps=400, warmup_factor=0.1)
    steps = 63960
    factors = {s: he(s, steps) for s in (0, 399, 400, 31979, 31980, 47969, 47970, 63959)}
    # (× the base rate 0.1: lr 0.01 while warming up, then 0.1, 0.01, 0.001)
    assert factors == pytest.approx({0: 0.1, 399: 0.1, 400: 1.0, 31979: 1.0, 31980: 0.1,
                                     47969: 0.1, 47970: 0.01, 63959: 0.01}, rel=1e-12)
    dev = torch.device("cpu")
    kw = dict(steps=100, batch_size=8, seed=0, fill=None, device=dev)
    deep, shallow = recipe(task(**HE), depth=110, **kw), recipe(task(**HE), depth=56, **kw)
    assert deep.schedule(0, 100) == pytest.approx(0.1) and shallow.schedule(0, 100) == 1.0
    assert deep.name != shallow.name and "warmup(400x0.1)" in deep.name
    assert isinstance(deep.batch_transform, PadCropFlip)
    assert recipe(task(), depth=20, **kw) is ADAM  # the study's recipe keeps its identity


def test_he_recipe_trains_a_convnet_through_the_loop():
    """The loop with the SGD recipe: the same run twice is bit-identical, the schedule is the
    lr that was applied (one step at factor s equals one step at lr·s), and a graph-safe
    transform sees the device step counter."""
    data = images(64)
    seen = []

    class Spy(PadCropFlip):
        def __call__(self, x, step):
            assert isinstance(step, torch.Tensor) and step.dim() == 0
            seen.append(int(step))
            return super().__call__(x, step)

    def run():
        r = recipe(task(**HE), depth=8, steps=6, batch_size=16, seed=3, fill=None,
                   device=torch.device("cpu"))
        r = type(r)(r.name, r.optimizer, r.schedule, Spy(10, 16, 3))
        model = CifarResNet(8, base_width=4, seeds=[2], dtype=torch.float64)
        res = train(model, data, [0.1], steps=6, batch_size=16, eval_every=3, progress=False,
                    recipe=r)
        return model, res

    (a, ra), (b, rb) = run(), run()
    assert seen[:6] == list(range(6))
    np.testing.assert_array_equal(ra.loss, rb.loss)
    np.testing.assert_array_equal(ra.train_error, rb.train_error)
    assert ra.train_error.shape == (6, 1) and ((ra.train_error >= 0) & (ra.train_error <= 1)).all()
    for name, w in a.state_dict().items():
        assert torch.equal(b.state_dict()[name], w), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_he_recipe_with_augmentation_is_captured_by_cuda_graphs():
    """The ConvNet step (augmentation indexed by the device step, SGD, BN statistics) replayed
    as one CUDA graph trains like the eager step."""
    cpu = images(256)
    data = DeviceDataset(*(t.cuda() for t in (cpu.x_train.float(), cpu.y_train, cpu.x_test.float(),
                                              cpu.y_test)), cpu.mean, cpu.std)

    def run(graphs: bool):
        r = recipe(task(**HE), depth=8, steps=10, batch_size=32, seed=3, fill=None,
                   device=torch.device("cuda"))
        model = CifarResNet(8, base_width=4, seeds=[2], device="cuda")
        res = train(model, data, [0.1], steps=10, batch_size=32, eval_every=5, progress=False,
                    recipe=r, cuda_graphs=graphs)
        return model, res

    (a, ra), (b, rb) = run(False), run(True)
    np.testing.assert_allclose(rb.loss, ra.loss, rtol=1e-3)
    for name, w in a.state_dict().items():
        torch.testing.assert_close(b.state_dict()[name], w, rtol=1e-3, atol=1e-4, msg=name)
