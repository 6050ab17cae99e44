"""The degradation replication on real CIFAR-10 (issue 11): gradients at initialization, smoke
training with He et al.'s recipe, lesions, resume — and the experiment through the CLI and the
analysis commands.

Cost on a 2-core CPU: the init-gradient claim at depths 20 and 56 (four networks, batch 256,
≈ 25 s) and a smoke pair of depth-14 networks (width 8, 150 steps, ≈ 1–2 min) run by default;
depth 110 (the heaviest, ≈ 40 s more) is ``-m slow``.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rankexp.models.convnet import CifarResNet
from rankexp.probes.convnet import (
    ImageProbeContext,
    probe_init_gradient_norms,
    probe_layer_response,
    probe_lesion,
)
from rankexp.seeding import subset_indices
from rankexp.tasks.data import ARCHIVE_NAME, DEFAULT_CACHE_DIR, DEFAULT_ROOT, DeviceDataset
from rankexp.tasks.recipes import recipe
from rankexp.tasks.train import train

pytestmark = pytest.mark.skipif(
    not (DEFAULT_ROOT / ARCHIVE_NAME).is_file(), reason=f"no {DEFAULT_ROOT / ARCHIVE_NAME}"
)
HE = SimpleNamespace(optimizer="sgd", momentum=0.9, weight_decay=1e-4, schedule="step",
                     milestones=[0.5, 0.75], gamma=0.1, warmup_steps=400, warmup_factor=0.1,
                     warmup_min_depth=110, augment="pad_crop_flip", pad=4)


@pytest.fixture(scope="module")
def cifar() -> DeviceDataset:
    from rankexp.tasks.data import load_device_dataset

    return load_device_dataset(progress=False)


def test_gradient_norms_leave_the_network_as_it_was(cifar):
    model = CifarResNet(8, seeds=[0, 1])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = probe_init_gradient_norms(ImageProbeContext(model, cifar, {"init_gradient_norms": {"batch": 64}}))
    assert out.series["grad_norm"][1].shape == (7,) and out.arrays["grad_norm"].shape == (2, 7)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(p.grad is None for p in model.parameters()) and model.training
    # member e is its own seed: the batched norms are the one-member networks' norms
    single = probe_init_gradient_norms(ImageProbeContext(CifarResNet(8, seeds=[1]), cifar,
                                                         {"init_gradient_norms": {"batch": 64}}))
    np.testing.assert_allclose(out.arrays["grad_norm"][1], single.arrays["grad_norm"][0], rtol=1e-4)
    # at initialization BN (scale 1) normalizes each response: std √(1 − ε/(σ²+ε)) ≈ 1
    resp = probe_layer_response(ImageProbeContext(model, cifar, {"layer_response": {"images": 500}}))
    np.testing.assert_allclose(resp.arrays["response_std"], 1.0, atol=1e-3)
    with pytest.raises(ValueError, match="trained network"):
        probe_lesion(ImageProbeContext(model, cifar))


def grad_ratio(cifar, residual: bool, depth: int) -> float:
    """‖∇W₂‖/‖∇W_last‖ at initialization on the fixed batch of 256 training images, seed 0."""
    model = CifarResNet(depth, residual=residual, seeds=[0])
    return float(probe_init_gradient_norms(ImageProbeContext(model, cifar)).scalars["grad_ratio"])


def test_plain_gradient_ratio_explodes_with_depth_and_resnets_stay_near_one(cifar):
    """The chapter's BN paradox at depths 20 < 56 (110 in the slow test below)."""
    plain = {d: grad_ratio(cifar, False, d) for d in (20, 56)}
    resnet = {d: grad_ratio(cifar, True, d) for d in (20, 56)}
    print(f"grad ratio at init: plain {plain}, ResNet {resnet}")
    assert plain[20] < plain[56] and plain[56] > 10 * plain[20]  # geometric, not a drift
    assert all(0.1 <= r <= 10 for r in resnet.values())


@pytest.mark.slow
def test_plain_gradient_ratio_at_depth_110(cifar):
    plain56, plain110 = grad_ratio(cifar, False, 56), grad_ratio(cifar, False, 110)
    resnet110 = grad_ratio(cifar, True, 110)
    print(f"grad ratio at init, depth 110: plain {plain110:.4g}, ResNet {resnet110:.4g}")
    assert plain56 < plain110 and plain110 > 1e4
    assert 0.1 <= resnet110 <= 10


# --------------------------------------------------------------------------- smoke training
@pytest.fixture(scope="module")
def smoke(cifar):
    """Plain and residual depth-14 networks (n = 2, width 8) after 150 steps of He et al.'s
    recipe on the whole training set; test error on a fixed 2000 test images."""
    idx = subset_indices(cifar.y_test.shape[0], 2000)
    data = DeviceDataset(cifar.x_train, cifar.y_train, cifar.x_test[idx], cifar.y_test[idx],
                         cifar.mean, cifar.std)
    out = {}
    for residual in (False, True):
        model = CifarResNet(14, residual=residual, base_width=8, seeds=[0])
        r = recipe(HE, depth=14, steps=150, batch_size=128, seed=0,
                   fill=-cifar.mean / cifar.std, device=torch.device("cpu"))
        res = train(model, data, [0.1], steps=150, batch_size=128, eval_every=150,
                    progress=False, recipe=r)
        out[residual] = (model, res, data)
    return out


def test_smoke_training_beats_chance_clearly(smoke):
    for residual, (_, res, _) in smoke.items():
        print(f"residual={residual}: test acc {res.final_test_acc[0]:.3f} after 150 steps, "
              f"train error {res.train_error[:10].mean():.3f} → {res.train_error[-10:].mean():.3f}")
        assert res.final_test_acc[0] >= 0.25  # chance: 0.10
        assert res.train_error[-20:].mean() < res.train_error[:20].mean() - 0.1


def test_lesion_of_a_residual_block_changes_test_error_less_than_of_a_plain_block(smoke):
    increase = {}
    for residual, (model, _, data) in smoke.items():
        les = probe_lesion(ImageProbeContext(model, data, {"lesion": {"images": 2000}},
                                             trained=True))
        err, intact = les.arrays["lesion_error"][0], les.scalars["lesion_intact_error"]
        identity = [b - 1 for b in range(1, 7) if b not in les.arrays["lesion_downsampling_blocks"]]
        assert les.arrays["lesion_downsampling_blocks"].tolist() == [3, 5]
        increase[residual] = float(np.mean(err[identity] - intact))
        print(f"residual={residual}: intact {intact:.3f}, lesioned {np.round(err, 3)}")
    assert increase[True] < increase[False]


def test_resume_after_a_kill_is_bit_identical_on_cpu(cifar, tmp_path):
    """SGD + momentum, step decay with warm-up, augmentation, BN statistics: a run stopped
    without a final checkpoint (as a SIGKILL leaves it) resumes to the same bits."""
    idx = subset_indices(cifar.y_train.shape[0], 512, seed=3)
    data = DeviceDataset(cifar.x_train[idx], cifar.y_train[idx], cifar.x_test[:256],
                         cifar.y_test[:256], cifar.mean, cifar.std)
    he = SimpleNamespace(**{**vars(HE), "warmup_steps": 5, "warmup_min_depth": 0})

    def run(**kw):
        model = CifarResNet(8, base_width=4, seeds=[1])
        r = recipe(he, depth=8, steps=12, batch_size=32, seed=2, fill=-cifar.mean / cifar.std,
                   device=torch.device("cpu"))
        res = train(model, data, [0.1], steps=12, batch_size=32, eval_every=3, progress=False,
                    recipe=r, **kw)
        return model, res

    full_model, full = run()
    ckpt = tmp_path / "run.pt"
    _, partial = run(checkpoint_path=ckpt, checkpoint_every=4, stop_after=10)
    assert not partial.completed and torch.load(ckpt, weights_only=True)["step"] == 8
    model, resumed = run(checkpoint_path=ckpt, checkpoint_every=4)
    for key in ("loss", "train_error", "eval_steps", "test_acc"):
        np.testing.assert_array_equal(getattr(resumed, key), getattr(full, key), err_msg=key)
    for name, w in full_model.state_dict().items():  # weights and BN running statistics
        assert torch.equal(model.state_dict()[name], w), name


# --------------------------------------------------------------------------- CLI + analysis
def test_experiment_at_cpu_and_smoke_sizes_through_the_cli_and_every_plot(cli):
    """``experiment=degradation`` at size=cpu (measure) and size=smoke (train), shrunk by
    command-line overrides, into one store; every analysis command draws from it."""
    from conftest import runs_in

    from analysis.__main__ import main as analysis

    cache = f"data.cache_dir={DEFAULT_CACHE_DIR}"
    cli("experiment=degradation", "size=cpu", "depth=8,14", "seeds=1", cache,
        "task.options.layer_response.images=200", "task.options.init_gradient_norms.batch=32", "-m")
    ckpt = cli.cwd / "ckpt"
    cli("experiment=degradation", "size=smoke", "model.base_width=4", "task.steps=6",
        "task.eval_every=6", "task.log_every=3", "task.clean_train_images=200",
        "task.options.layer_response.images=200", "task.options.lesion.images=200",
        "task.options.init_gradient_norms.batch=32", f"task.checkpoint_dir={ckpt}", cache, "-m")
    runs = [r for r in runs_in(cli.uri, "degradation") if "mlflow.parentRunId" in r.data.tags]
    assert sorted((r.data.params["task.name"], r.data.params["model.residual"],
                   r.data.params["depth"]) for r in runs) == [
        ("measure", "False", "14"), ("measure", "False", "8"), ("measure", "True", "14"),
        ("measure", "True", "8"), ("train", "False", "8"), ("train", "True", "8")]
    assert {r.info.status for r in runs} == {"FINISHED"}
    train_run = next(r for r in runs if r.data.params["task.name"] == "train")
    m = train_run.data.metrics
    for key in ("final_test_error_lr0.1", "clean_train_error_lr0.1", "lesion_intact_error",
                "response_std_mean", "grad_ratio", "train_seconds"):
        assert np.isfinite(m[key]), key
    assert train_run.info.run_name in ("plain·L8·w4·train", "resnet·L8·w4·train")
    figures = cli.cwd / "figures"
    for command in ("init-gradients", "responses", "error-curves", "error-table", "lesion"):
        assert analysis([command, "--uri", cli.uri, "--out", str(figures)]) == 0, command
    for stem in ("init_gradient_norms", "layer_responses_train", "error_curves", "final_errors",
                 "lesion"):
        assert (figures / "degradation" / f"{stem}.png").stat().st_size > 10_000, stem
        assert (figures / "degradation" / f"{stem}.csv").is_file(), stem
    ratio = (figures / "degradation" / "init_gradient_ratio.md").read_text()
    assert "| 8 |" in ratio and "| 14 |" in ratio
