"""Probes during training (issue 21 item 1): the schedule knobs, every learning rate probed,
training unchanged by probing, and a killed-and-resumed run ending with the same probe series."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rankexp.config import ConfigError, config_hash
from rankexp.config.hashing import resolved_container
from rankexp.config.schema import probe_schedule
from rankexp.models.mlp import ResidualMLP
from rankexp.tasks import probing
from rankexp.tasks.data import DeviceDataset
from rankexp.tasks.measure import run_probes
from rankexp.tasks.train import Classifier, train

PROBES = ["io_jacobian", "branch_ratio", "path_order", "representation"]
LRS = [1e-3, 1e-2, 3e-2]
IN = 3072


def compose(*overrides: str):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from rankexp.cli import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return hydra_compose("config", list(overrides))


# --------------------------------------------------------------------------- the schedule
def test_schedule_forms():
    assert probe_schedule(300, 50, None) == [0, 50, 100, 150, 200, 250, 300]
    assert probe_schedule(300, 70, None) == [0, 70, 140, 210, 280, 300]  # the end always
    assert probe_schedule(300, None, "log") == [0, 1, 2, 5, 10, 20, 50, 100, 200, 300]
    assert probe_schedule(5000, None, "log") == [0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000,
                                                  2000, 5000]
    assert probe_schedule(300, None, [100, 0, 100]) == [0, 100]
    assert probe_schedule(300, None, None) == []


@pytest.mark.parametrize("overrides,match", [
    (["task.probe_every=0"], r"task.probe_every=0 — must be an integer ≥ 1"),
    (["task.probe_every=5", "task.probe_steps=log"], "set one of them"),
    (["task.probe_steps=lin"], r"task.probe_steps='lin' — a list of steps"),
    (["task.probe_steps=[0,301]"], r"in 0 … 300"),
    (["task.probe_steps=[]"], "non-empty list"),
    (["task.probe_every=5", "task.probes=[]"], "schedules task.probes, which is empty"),
])
def test_bad_schedule_is_one_line_before_any_run(overrides, match):
    from rankexp.config import validate

    cfg = compose("task=train", "task.steps=300", "task.probes=[io_jacobian]", *overrides)
    with pytest.raises(ConfigError, match=match) as err:
        validate(cfg)
    assert "\n" not in str(err.value)


def test_knobs_at_their_defaults_leave_the_hash_and_set_ones_change_it():
    base = resolved_container(compose("task=train"))
    explicit = resolved_container(compose("task=train", "task.probe_every=null", "task.probe_steps=null"))
    assert config_hash(base) == config_hash(explicit)
    # the v1 config had no such keys: removing them leaves the hash
    v1 = {**base, "task": {k: v for k, v in base["task"].items() if not k.startswith("probe_")}}
    assert config_hash(v1) == config_hash(base)
    every = resolved_container(compose("task=train", "task.probe_every=50", "task.probes=[io_jacobian]"))
    assert config_hash(every) != config_hash(resolved_container(compose("task=train", "task.probes=[io_jacobian]")))


def test_multi_lr_probes_accepted_and_memory_checked(monkeypatch):
    """Every learning rate is probed (the one-rate rule is gone); the probes' memory — all
    rates at once — is refused before any run when the device could never hold it."""
    from rankexp import memory
    from rankexp.config import check_fits, validate

    s = validate(compose("task=train", "task.probe_every=100", "task.probes=[io_jacobian]"))
    check_fits(s)  # 6 rates × d = 256: small
    need = memory.probe_bytes(s, 6)
    assert need == 6 * memory.seed_bytes(s)
    monkeypatch.setattr(memory, "total_memory_bytes", lambda device: (need * 0.99, "a tiny device"))
    with pytest.raises(ConfigError, match="6 learning rates"):
        check_fits(s)
    monkeypatch.setattr(memory, "total_memory_bytes", lambda device: (need * 1.01, "a device"))
    check_fits(s)


# --------------------------------------------------------------------------- the engine
def synthetic(n_train=128, n_test=32) -> DeviceDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n_train + n_test, IN, generator=g)
    y = (x[:, :16] @ torch.randn(16, 10, generator=g)).argmax(1)
    return DeviceDataset(x[:n_train], y[:n_train], x[n_train:], y[n_train:], torch.zeros(3), torch.ones(3))


def model(placement="pre") -> Classifier:
    return Classifier(ResidualMLP(width=8, depth=3, expansion=1.0, placement=placement, alpha=1.0,
                                  seeds=[3] * len(LRS), dtype=torch.float32))


def probe_fn(net, data):
    def on_probe(step):
        m = probing.probe_members(net.stack, data, probing.probes_at(step, PROBES), {},
                                  trained=step > 0, dtype=torch.float64)
        return probing.member_values(m, len(LRS))
    return on_probe


KW = dict(steps=12, batch_size=16, seed=1, eval_every=6, progress=False)


def test_probes_are_per_member_and_equal_a_fresh_measurement():
    """Step 0's values are the measure task's on the initial network, member by member (the
    members share a seed: equal at init), in float64; later ones differ between rates."""
    data, m = synthetic(), model()
    res = train(m, data, LRS, probe_at=[0, 6, 12], on_probe=probe_fn(m, data), **KW)
    assert sorted(res.probes) == [0, 6, 12] and res.probe_seconds > 0
    fresh = run_probes(ResidualMLP(width=8, depth=3, expansion=1.0, placement="pre", alpha=1.0,
                                   seeds=[3] * len(LRS), dtype=torch.float64), PROBES)
    for name in ("erank_io", "branch_ratio_last", "mean_path_order", "rep_erank_final"):
        np.testing.assert_allclose(res.probes[0][name].numpy(), fresh.arrays[name], rtol=1e-6)
        assert res.probes[0][name].shape == (len(LRS),)
        assert np.ptp(res.probes[12][name].numpy()) > 0  # the rates trained apart
    assert res.probes[6]["branch_ratio"].shape == (len(LRS), 3)  # per layer


def test_training_with_probes_is_bit_identical_to_training_without():
    data = synthetic()
    plain = model()
    ref = train(plain, data, LRS, **KW)
    probed = model()
    res = train(probed, data, LRS, probe_at=range(13), on_probe=probe_fn(probed, data), **KW)
    assert np.array_equal(ref.loss, res.loss) and np.array_equal(ref.test_acc, res.test_acc)
    for k, v in plain.state_dict().items():
        assert torch.equal(v, probed.state_dict()[k]), k
    # the check sees a probe that changes the network (one weight by 1e-6 at step 6)
    bad = model()
    good = probe_fn(bad, data)

    def meddling(step):
        if step == 6:
            with torch.no_grad():
                next(bad.parameters()).view(-1)[0] += 1e-6
        return good(step)

    off = train(bad, data, LRS, probe_at=range(13), on_probe=meddling, **KW)
    assert not np.array_equal(ref.loss, off.loss)


def test_killed_and_resumed_training_ends_with_the_same_probes(tmp_path):
    data = synthetic()
    whole_model = model()
    whole = train(whole_model, data, LRS, probe_at=[0, 3, 6, 9, 12], on_probe=probe_fn(whole_model, data), **KW)
    ckpt = tmp_path / "c.pt"
    first = model()
    train(first, data, LRS, probe_at=[0, 3, 6, 9, 12], on_probe=probe_fn(first, data),
          checkpoint_path=ckpt, checkpoint_every=4, stop_after=10, **KW)  # killed at 10: ckpt 8
    again = model()
    seen = []
    on = probe_fn(again, data)
    res = train(again, data, LRS, probe_at=[0, 3, 6, 9, 12],
                on_probe=lambda st: seen.append(st) or on(st), checkpoint_path=ckpt,
                checkpoint_every=4, **KW)
    assert seen == [9, 12]  # 0, 3, 6 came from the checkpoint
    assert sorted(res.probes) == sorted(whole.probes)
    for st in whole.probes:
        for k, v in whole.probes[st].items():
            assert torch.equal(v, res.probes[st][k]), (st, k)


# --------------------------------------------------------------------------- the task
class Recorder:
    """Stands in for the job's run: the per-member series as the store would hold them."""

    def __init__(self):
        self.points: dict[str, dict[int, float]] = {}

    def log_metrics(self, scalars, series):
        for name, (steps, values) in series.items():
            self.points.setdefault(name, {}).update(zip(map(int, steps), map(float, values), strict=True))

    def open_members(self, lrs):
        self.lrs = [float(lr) for lr in lrs]

    def log_member_series(self, steps, metrics):
        """Each member's plain-named points, kept as ``<name>_lr<lr>`` (its member run's)."""
        from rankexp.tasks.train import _lr_key

        steps = np.atleast_1d(np.asarray(steps))
        for name, values in metrics.items():
            values = np.asarray(values, dtype=float).reshape(len(steps), len(self.lrs))
            for e, lr in enumerate(self.lrs):
                self.points.setdefault(f"{name}_{_lr_key(lr)}", {}).update(
                    zip(map(int, steps), map(float, values[:, e]), strict=True))

    def log_dataset(self, *a, **k):
        pass


def test_task_logs_a_series_per_lr_and_a_resumed_job_backfills_it(tmp_path, monkeypatch):
    """``task=train`` logs ``erank_io_lr<lr>`` at every probed step for every rate, one
    ``result/probes/step_*.npz`` each, its cost; killed at step 10 (checkpoint at 8) and rerun, it
    ends with the same points (3 and 6 from the checkpoint, backfilled)."""
    from rankexp.config import validate
    from rankexp.tasks import train as task

    monkeypatch.setattr(task, "dataset_for", lambda s, device, dtype: synthetic())
    s = validate(compose("task=train", "depth=3", "width=8", "expansion=1", "task.steps=12",
                         "task.batch_size=16", "task.eval_every=6", "task.log_every=2",
                         "task.checkpoint_every=4", "task.probe_every=3",
                         f"task.lrs=[{','.join(map(str, LRS))}]",
                         "task.probes=[io_jacobian,branch_ratio]",
                         f"task.checkpoint_dir={tmp_path / 'ckpt'}"))

    def job(name, **kill):
        run, jobdir = Recorder(), tmp_path / name
        real = task.train
        if kill:
            def killed(*a, **k):
                real(*a, **k, **kill)
                raise KeyboardInterrupt  # the process dies after step 10
            monkeypatch.setattr(task, "train", killed)
        try:
            out = task.task_train(s, torch.device("cpu"), jobdir, run, name)
        except KeyboardInterrupt:
            out = None
        monkeypatch.setattr(task, "train", real)
        return run, out, jobdir

    whole, out, jobdir = job("whole")
    for lr in LRS:
        assert sorted(whole.points[f"erank_io_lr{lr:g}"]) == [0, 3, 6, 9, 12]
    assert sorted(p.name for p in (jobdir / "result/probes").iterdir()) == [
        f"step_{st:06d}.npz" for st in (0, 3, 6, 9, 12)]
    assert np.load(jobdir / "result/probes/step_000006.npz")["branch_ratio"].shape == (len(LRS), 3)
    assert 0 < out.scalars["probe_seconds"] < out.scalars["train_seconds"]
    killed, _, _ = job("resumed", stop_after=10)
    assert sorted(killed.points["erank_io_lr0.01"]) == [0, 3, 6, 9]
    resumed, _, _ = job("resumed")
    assert resumed.points["erank_io_lr0.01"].keys() == {0, 3, 6, 9, 12}
    for name, pts in whole.points.items():
        if name.startswith(("erank_io", "branch_ratio")):
            assert resumed.points[name] == pts, name


def test_convnet_training_with_probes_keeps_bn_statistics_and_weights():
    """A ConvNet probed at every step (BN in training mode at 0, as tested later; lesion runs
    the test set through it) trains bit-identically: running statistics and weights equal."""
    from rankexp.models.convnet import CifarResNet

    data = synthetic(n_train=64, n_test=16)
    kw = dict(KW, steps=4, eval_every=2)
    opts = {"layer_response": {"images": 16, "batch": 16}, "lesion": {"images": 16},
            "init_gradient_norms": {"batch": 16}}
    probes = ["init_gradient_norms", "layer_response", "lesion"]

    def net():
        return CifarResNet(8, base_width=4, seeds=[3, 3], dtype=torch.float32)

    plain, probed = net(), net()
    ref = train(plain, data, [1e-3, 1e-2], **kw)

    def on_probe(step):
        m = probing.probe_members(probed, data, probing.probes_at(step, probes), opts, trained=step > 0)
        return probing.member_values(m, 2)

    res = train(probed, data, [1e-3, 1e-2], probe_at=range(5), on_probe=on_probe, **kw)
    assert np.array_equal(ref.loss, res.loss)
    for k, v in plain.state_dict().items():
        assert torch.equal(v, probed.state_dict()[k]), k
    assert "response_std_mean" in res.probes[4] and res.probes[4]["response_std_mean"].shape == (2,)
    # the check sees a probe that runs the network itself in training mode (BN statistics move)
    touched = net()

    def in_place(step):
        with torch.no_grad():
            touched(data.x_test[:8])
        return {}

    train(touched, data, [1e-3, 1e-2], probe_at=[2], on_probe=in_place, **kw)
    assert not all(torch.equal(v, touched.state_dict()[k]) for k, v in plain.state_dict().items())


def test_probes_leave_the_global_rng_where_it_was():
    """The representation probe draws inputs; under the forked RNG the global stream (which a
    recipe's transform could read) is where it was — and a draw outside the fork is seen."""
    net = model().stack
    torch.manual_seed(11)
    before = torch.get_rng_state()
    probing.probe_members(net, synthetic(), PROBES, {}, trained=False, dtype=torch.float64)
    assert torch.equal(torch.get_rng_state(), before)
    torch.randn(1)
    assert not torch.equal(torch.get_rng_state(), before)
