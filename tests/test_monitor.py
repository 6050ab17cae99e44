"""``rankexp.SpectralMonitor`` and its Hugging Face ``TrainerCallback``.

Truths checked: every due step's frame arrives in a real SQLite MLflow store as metric series
(one point per checkpoint, the frame's numbers) and as a CSV artifact; training with the
monitor is bit-identical to training without it (it takes no gradients and draws no random
numbers); the callback, driven through transformers' own ``CallbackHandler`` and (where
``accelerate`` is installed) by a real ``Trainer``, measures at step 0 and at every due
``global_step``; bad settings and a missing run fail clearly.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import rankexp
from rankexp.instruments import SpectralMonitor

F64 = torch.float64


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def store(tmp_path, monkeypatch):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("monitor")
    yield uri
    mlflow.set_tracking_uri(None)


class Residual(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up, self.down = nn.Linear(d, 2 * d, dtype=F64), nn.Linear(2 * d, d, dtype=F64)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


def make_net(d=8):
    torch.manual_seed(0)
    return nn.Sequential(Residual(d), Residual(d), nn.Linear(d, 1, dtype=F64))


def train(monitor_kw=None, steps=5):
    """Adam on a fixed regression batch; ``monitor.step(k)`` after k optimizer steps (0 = init)."""
    net = make_net()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 8, generator=g, dtype=F64), torch.randn(16, 1, generator=g, dtype=F64)
    mon = None if monitor_kw is None else SpectralMonitor(net, x, blocks=["0", "1"], **monitor_kw)
    opt = torch.optim.Adam(net.parameters(), 1e-2)
    if mon:
        mon.step(0)
    for k in range(1, steps + 1):
        loss = (net(x) - y).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if mon:
            mon.step(k)
    return net, mon


def test_monitor_logs_to_a_real_mlflow_store(store):
    import mlflow
    from mlflow.tracking import MlflowClient

    with mlflow.start_run() as run:
        net, mon = train({"every": 2})
    frame = mon.frame
    assert sorted(frame["step"].unique()) == [0, 2, 4] and len(frame) == 6
    client = MlflowClient(store)
    hist = client.get_metric_history(run.info.run_id, "prefix_erank/block1")
    assert [m.step for m in hist] == [0, 2, 4]
    want = frame.query("block == 1")["prefix_erank"].to_numpy()
    assert [m.value for m in hist] == pytest.approx(list(want), rel=1e-12)
    keys = client.get_run(run.info.run_id).data.metrics
    assert {"branch_ratio/block2", "representation_erank/block1", "rms/block2", "spectra_seconds"} <= set(keys)
    assert not any(k.endswith("_err/block1") for k in keys)  # exact rows: no error series
    arts = [a.path for a in client.list_artifacts(run.info.run_id, "spectra")]
    assert arts == [f"spectra/step_{k:08d}.csv" for k in (0, 2, 4)]
    # the network trained as it would have without the monitor
    plain, _ = train(None)
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), plain.parameters(), strict=True))
    # and the rank it measured moved with training
    assert frame.query("step == 0")["branch_ratio"].to_numpy() != pytest.approx(
        frame.query("step == 4")["branch_ratio"].to_numpy(), rel=1e-6)


def test_custom_sink_and_matrix_free_errors():
    got = []
    _, mon = train({"every": 5, "log": lambda metrics, step: got.append((step, dict(metrics))),
                    "method": "matrix_free", "probes": ["branch"]})
    assert [s for s, _ in got] == [0, 5]
    metrics = got[0][1]
    assert {"branch_erank/block1", "branch_erank_err/block1", "branch_ratio_err/block2"} <= set(metrics)
    assert not any(k.startswith(("prefix", "rms")) for k in metrics)
    assert all(math.isfinite(v) for v in metrics.values())


def test_due_steps_and_settings():
    net = make_net()
    mon = SpectralMonitor(net, torch.randn(4, 8, dtype=F64), every=None, steps=[0, 10, 30],
                          blocks=["0"], log=None)
    assert [k for k in range(40) if mon.due(k)] == [0, 10, 30]
    assert mon.step(5) is None and mon.frame.empty
    assert list(mon.step(5, force=True)["step"]) == [5]
    with pytest.raises(ValueError, match="every=N and/or steps"):
        SpectralMonitor(net, None, every=None)
    with pytest.raises(ValueError, match="every=0"):
        SpectralMonitor(net, None, every=0)
    with pytest.raises(ValueError, match="probes: unknown"):
        SpectralMonitor(net, None, probes=["spectra"])
    with pytest.raises(ValueError, match="log="):
        SpectralMonitor(net, None, log="wandb")


def test_no_active_run(store, caplog):
    net = make_net()
    x = torch.randn(4, 8, dtype=F64)
    with pytest.raises(RuntimeError, match="no active MLflow run"):
        SpectralMonitor(net, x, blocks=["0"], log="mlflow").step(0)
    mon = SpectralMonitor(net, x, blocks=["0"])
    with caplog.at_level("WARNING"):
        mon.step(0)
        mon.step(100)
    assert caplog.text.count("no active MLflow run") == 1 and len(mon.frame) == 2


# --------------------------------------------------------------------------- Hugging Face
def tiny_llama():
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, vocab_size=50)
    return tf, tf.LlamaForCausalLM(cfg)


def test_callback_through_the_trainer_protocol():
    tf, model = tiny_llama()
    from transformers.trainer_callback import CallbackHandler, TrainerControl, TrainerState

    ids = torch.randint(0, 50, (2, 5))
    mon = SpectralMonitor(model, ids, every=2, log=None)
    cb = mon.callback()
    assert isinstance(cb, tf.TrainerCallback) and type(cb) is rankexp.SpectralCallback
    handler = CallbackHandler([cb], model, None, None, None)
    state, control, args = TrainerState(), TrainerControl(), object()
    handler.on_train_begin(args, state, control)
    for k in range(1, 6):
        state.global_step = k
        handler.on_step_end(args, state, control)
    assert sorted(mon.frame["step"].unique()) == [0, 2, 4]
    assert set(mon.frame["name"]) == {"model.layers.0", "model.layers.1"}
    state.is_world_process_zero = False  # other ranks of a distributed run measure nothing
    state.global_step = 6
    handler.on_step_end(args, state, control)
    assert 6 not in set(mon.frame["step"])


def test_callback_drives_a_real_trainer(store, tmp_path):
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate (not in the gpt2 extra)")
    import mlflow
    from mlflow.tracking import MlflowClient

    tf, model = tiny_llama()
    g = torch.Generator().manual_seed(0)
    data = [{"input_ids": t, "labels": t} for t in torch.randint(0, 50, (8, 6), generator=g)]
    mon = SpectralMonitor(model, data[0]["input_ids"][None], every=2)
    args = tf.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=2,
                                report_to="none", use_cpu=True, save_strategy="no", logging_strategy="no")
    trainer = tf.Trainer(model=model, args=args, train_dataset=data, callbacks=[mon.callback()])
    with mlflow.start_run() as run:
        trainer.train()
    hist = MlflowClient(store).get_metric_history(run.info.run_id, "branch_ratio/block1")
    assert [m.step for m in hist] == [0, 2, 4]
