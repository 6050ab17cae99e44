"""Issue 19 item 3: each learning rate of a batched training run is an MLflow run of its own
(nested under the training run: plain metric names, param ``lr``), the training run keeps the
config's summary, the analysis reads one row per config and resolves ``<name>_lr<k>`` to the
member's ``<name>`` (old-style runs: their own key), members end with their training run
(finished, failed, killed, superseded by a resumed attempt, orphaned) — and every figure the
analysis saves is attached to its runs' sweep parent.

Real SQLite stores and the real ``task_train`` on a small synthetic CIFAR-shaped data set
(the network, recipe, loop, checkpoint and logging are the real ones; seconds each)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from rankexp import interrupt, tracking
from rankexp.cli import CONF_DIR
from rankexp.config import check_job
from rankexp.tasks import train as train_task
from rankexp.tasks.data import DeviceDataset

LRS = (0.001, 0.01)
TRAIN = ("task=train", "width=8", "depth=2", "task.lrs=[0.001,0.01]", "task.steps=20",
         "task.eval_every=10", "task.log_every=5", "task.batch_size=16",
         "task.checkpoint_every=100000")
SERIES = ("train_loss", "train_error", "test_acc", "test_error")


def cifar_shaped(n_train: int = 64, n_test: int = 32) -> DeviceDataset:
    """A learnable problem with CIFAR-10's flattened shape (3072 features, 10 classes)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n_train + n_test, 3072, generator=g)
    y = (x[:, :40] @ torch.randn(40, 10, generator=g)).argmax(1)
    return DeviceDataset(x[:n_train], y[:n_train], x[n_train:], y[n_train:],
                         torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64))


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory) -> Path:
    """A migrated store with the experiment ``rankexp`` (MLflow's migrations take seconds)."""
    path = tmp_path_factory.mktemp("store") / "mlflow.db"
    uri = f"sqlite:///{path}"
    tracking.check_store(uri)
    tracking.prepare_experiment(uri, "rankexp")
    return path


@pytest.fixture
def store(tmp_path, monkeypatch, empty_store):
    monkeypatch.setattr(train_task, "dataset_for", lambda s, device, dtype: cifar_shaped())
    shutil.copyfile(empty_store, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    return uri, tracking.prepare_experiment(uri, "rankexp")


def settings(tmp_path):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", [*TRAIN, f"task.checkpoint_dir={tmp_path / 'ckpt'}", "tracking=off"])
    return check_job(cfg, device=False)


class Job(tracking.RunLogger):
    """A training job's run; at the live report of step ``stop_at`` it raises ``stop``
    (an interrupt request, honoured by the loop at that step's end, or an error)."""

    stop_at: int | None = None
    stop: str = "SIGTERM"

    def log_member_series(self, steps, metrics):
        n = super().log_member_series(steps, metrics)
        if np.ndim(steps) == 0 and steps == self.stop_at:
            if self.stop == "SIGTERM":
                interrupt.request("SIGTERM")  # inside the loop's deferred(): recorded
            else:
                raise RuntimeError(self.stop)
        return n


def run_job(tmp_path, uri, exp, chash="h1", parent=None, supersedes=None, **stop) -> Job:
    """One training job as :mod:`rankexp.app` runs it: create the run (superseding the
    earlier attempt), train, finish — or end KILLED / FAILED with the error."""
    tags = {"config_hash": chash, "task": "train", "sweep_id": "s", **tracking.owner_tags(),
            **({"mlflow.parentRunId": parent} if parent else {})}
    job = Job(uri, exp, "post·L2·train", {"depth": 2, "width": 8, "lr": None,
                                          "task.lrs": list(LRS)}, tags, tmp_path / "metrics.jsonl")
    vars(job).update(stop)
    job.start()
    if supersedes:
        tracking.supersede(uri, supersedes, job.run_id)
    try:
        out = train_task.task_train(settings(tmp_path), torch.device("cpu"), tmp_path, job, chash)
    except BaseException as e:
        interrupted = isinstance(e, interrupt.JobInterrupted)
        job.end("KILLED" if interrupted else "FAILED", "SIGTERM" if interrupted else "exception", str(e))
        interrupt.clear()
        if not isinstance(e, interrupt.JobInterrupted | RuntimeError):
            raise
        return job
    job.finish(out.scalars, out.series, None)
    return job


def client(uri):
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


def members_of(uri, exp, run_id, view=None):
    from mlflow.entities import ViewType

    return client(uri).search_runs([exp], run_view_type=view or ViewType.ACTIVE_ONLY,
                                   filter_string=f"tags.mlflow.parentRunId = '{run_id}'")


def history(uri, run_id, key):
    points = sorted(client(uri).get_metric_history(run_id, key), key=lambda m: m.step)
    return [m.step for m in points], [m.value for m in points]


def by_lr(runs):
    return {float(r.data.params["lr"]): r for r in runs}


def test_each_lr_is_a_member_run_with_plain_names_and_the_training_run_keeps_the_summary(
        store, tmp_path):
    uri, exp = store
    job = run_job(tmp_path, uri, exp)
    train = client(uri).get_run(job.run_id)
    members = by_lr(members_of(uri, exp, job.run_id))
    assert sorted(members) == list(LRS)
    for lr, m in members.items():
        assert m.info.status == "FINISHED"
        assert m.info.run_name == {0.001: "post·L2·train·lr1e-3", 0.01: "post·L2·train·lr0.01"}[lr]
        assert m.data.tags["rankexp.role"] == "member" and m.data.tags["rankexp.lr"] == f"{lr:g}"
        assert "config_hash" not in m.data.tags  # no rival claimant of the config
        assert (m.data.params["depth"], m.data.params["width"]) == ("2", "8")  # the config's
        k = f"lr{lr:g}"
        assert history(uri, m.info.run_id, "train_loss")[0] == [5, 10, 15, 20]
        assert history(uri, m.info.run_id, "test_acc")[0] == [10, 20]
        for name in ("final_test_acc", "final_test_error", "best_test_acc", "final_train_loss",
                     "diverged"):  # the training run's per-LR finals, under the plain name
            assert m.data.metrics[name] == train.data.metrics[f"{name}_{k}"], name
        assert not any(key.endswith(k) for key in m.data.metrics)
    summary = train.data.metrics
    assert {"best_test_accuracy", "best_lr", "max_stable_lr", "steps"} <= set(summary)
    assert summary["best_test_accuracy"] == max(m.data.metrics["final_test_acc"]
                                                for m in members.values())
    # the series are the members' only
    assert not any(key.startswith(SERIES) and "_lr" in key and not key.startswith("final")
                   for key in summary if key.split("_lr")[0] in SERIES)


def test_load_runs_gives_one_row_per_config_and_series_resolve_to_the_members(store, tmp_path):
    """A new-style run (series in its members) and an old-style one (``<name>_lr<k>`` on the
    training run itself, as logged before members existed) with the same points read back
    identical through ``series`` and ``load_runs(series=…)``, in one bulk query per key."""
    from analysis.core import runs as runs_mod
    from analysis.core.select import series

    uri, exp = store
    new = run_job(tmp_path, uri, exp, chash="new")
    members = by_lr(members_of(uri, exp, new.run_id))
    old = tracking.RunLogger(uri, exp, "old", {"depth": 2}, {"config_hash": "old"})
    old.start()
    logged = {}
    for lr, m in members.items():
        for name in SERIES:
            logged[name, lr] = history(uri, m.info.run_id, name)
    old.finish({"final_test_acc_lr0.001": 0.5},
               {f"{name}_lr{lr:g}": pts for (name, lr), pts in logged.items()}, None)
    runs_mod.forget()
    calls = []
    real = runs_mod.metric_histories
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runs_mod, "metric_histories", lambda *a: calls.append(a) or real(*a))
        df = runs_mod.load_runs("rankexp", uri, cache_dir=False)
        assert sorted(df["run_id"]) == sorted([new.run_id, old.run_id])  # no member rows
        for run_id in df["run_id"]:
            for (name, lr), (steps, values) in logged.items():
                got = series(uri, run_id, f"{name}_lr{lr:g}")
                np.testing.assert_array_equal(got[0], steps)
                np.testing.assert_array_equal(got[1], values)
    assert len(calls) == len(SERIES) * len(LRS)  # one per key, for both runs and all members
    runs_mod.forget()
    table = runs_mod.load_runs("rankexp", uri, series=["train_loss_lr0.01"], cache_dir=False)
    a, b = table["series:train_loss_lr0.01"]
    np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_array_equal(a[1], logged["train_loss", 0.01][1])
    # a member lacking the key falls back to none; an unknown lr is no member's
    runs_mod.forget()
    assert runs_mod.cached_series(uri, new.run_id, "train_loss_lr0.5") is None
    # a run no load has seen is looked up (one search per experiment)
    want = {new.run_id: {f"{lr:g}": m.info.run_id for lr, m in members.items()}}
    assert tracking.member_runs(uri, [new.run_id, old.run_id]) == want


def test_kill_and_resume_end_with_the_uninterrupted_member_series_and_none_live_twice(
        store, tmp_path):
    uri, exp = store
    ref_dir, job_dir = tmp_path / "ref", tmp_path / "job"
    ref_dir.mkdir(), job_dir.mkdir()
    ref = run_job(ref_dir, uri, exp, chash="ref")
    killed = run_job(job_dir, uri, exp, stop_at=15)
    assert client(uri).get_run(killed.run_id).info.status == "KILLED"
    first = members_of(uri, exp, killed.run_id)
    assert {m.info.status for m in first} == {"KILLED"} and len(first) == 2
    assert history(uri, first[0].info.run_id, "train_loss")[0] == [5, 10, 15]
    resumed = run_job(job_dir, uri, exp, supersedes=killed.run_id)
    got, want = by_lr(members_of(uri, exp, resumed.run_id)), by_lr(members_of(uri, exp, ref.run_id))
    for lr in LRS:
        for name in SERIES:
            assert history(uri, got[lr].info.run_id, name) == history(uri, want[lr].info.run_id, name)
        for name in ("final_test_acc", "final_train_loss"):
            assert got[lr].data.metrics[name] == want[lr].data.metrics[name]
    from mlflow.entities import ViewType

    every = client(uri).search_runs([exp], run_view_type=ViewType.ALL)
    assert not [r for r in every if r.info.status == "RUNNING"]
    live = [r for r in every if r.info.lifecycle_stage == "active"
            and r.data.tags.get("rankexp.role") == "member"]
    assert len(live) == 2 * len(LRS)  # the reference's and the resumed run's; none of the killed
    gone = members_of(uri, exp, killed.run_id, ViewType.DELETED_ONLY)
    reason = client(uri).get_run(killed.run_id).data.tags["rankexp.end_reason"]
    assert len(gone) == 2 and {m.data.tags["rankexp.end_reason"] for m in gone} == {reason}


def test_a_failed_job_leaves_failed_members(store, tmp_path):
    uri, exp = store
    job = run_job(tmp_path, uri, exp, stop_at=10, stop="the loss went away")
    assert client(uri).get_run(job.run_id).info.status == "FAILED"
    members = members_of(uri, exp, job.run_id)
    assert len(members) == 2
    assert {(m.info.status, m.data.tags["rankexp.end_reason"]) for m in members} == {
        ("FAILED", "exception")}
    assert {m.data.tags["error"] for m in members} == {"the loss went away"}


def test_members_of_a_killed_or_vanished_owner_are_closed_by_close_run_and_reconcile(store):
    """SIGKILL: nothing closes the runs.  ``close_run`` (reconcile's verdict on the training
    run) closes its members the same way; a member whose training run ended without closing
    it is closed with that run's status; a member of a live training run is left alone."""
    uri, exp = store
    c = client(uri)

    def open_run(name):
        run = tracking.RunLogger(uri, exp, name, {"depth": 2}, {"config_hash": name,
                                                                **tracking.owner_tags()})
        run.start()
        run.open_members(LRS)
        run.log_member_series(5, {"train_loss": [1.0, 2.0]})
        return run

    gone, ended, alive = open_run("gone"), open_run("ended"), open_run("alive")
    tracking.close_run(c, gone.run_id, "KILLED", "owner_gone", "process 1 ended")
    assert {(m.info.status, m.data.tags["rankexp.end_reason"])
            for m in members_of(uri, exp, gone.run_id)} == {("KILLED", "owner_gone")}
    c.set_terminated(ended.run_id, "FAILED")  # its members are left RUNNING
    closed = tracking.reconcile(uri, exp, stale_after_s=0.0)  # every heartbeat is stale now …
    assert {m.info.status for m in members_of(uri, exp, ended.run_id)} == {"FAILED"}
    assert set(closed) >= {m.info.run_id for m in members_of(uri, exp, ended.run_id)}
    # … but this process owns "alive": neither it nor its members are closed
    assert {m.info.status for m in members_of(uri, exp, alive.run_id)} == {"RUNNING"}
    assert c.get_run(alive.run_id).info.status == "RUNNING"


def test_log_member_series_refuses_values_of_another_shape(tmp_path):
    journal = tracking.Journal(tmp_path / "j.jsonl")
    with pytest.raises(ValueError, match="before open_members"):
        journal.log_member_series(1, {"train_loss": [1.0]})
    journal.open_members(LRS)
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        journal.log_member_series(1, {"train_loss": [1.0, 2.0, 3.0]})
    assert journal.log_member_series([1, 2], {"train_loss": [[1.0, 2.0], [3.0, 4.0]]}) == 4
    lrs, points = tracking.read_member_journal(tmp_path / "j.jsonl")
    assert lrs == list(LRS)
    assert [(i, p) for _, i, p in points] == [(0, [["train_loss", 1, 1.0], ["train_loss", 2, 3.0]]),
                                             (1, [["train_loss", 1, 2.0], ["train_loss", 2, 4.0]])]
    assert tracking.read_journal(tmp_path / "j.jsonl") == []  # the run's own points: none


def test_a_saved_figure_is_attached_to_its_runs_sweep_parent(store, tmp_path, caplog):
    import matplotlib.pyplot as plt

    from analysis.core import runs as runs_mod
    from analysis.core import style

    uri, exp = store
    c = client(uri)
    parent = c.create_run(exp, tags={"rankexp.role": "sweep"}).info.run_id
    jobs = []
    for tags in ({"mlflow.parentRunId": parent}, {}):
        run = tracking.RunLogger(uri, exp, "job", {"depth": 2}, {"config_hash": "x", **tags})
        jobs.append(run.start())
        run.finish({"erank": 1.0}, {}, None)
    c.set_terminated(parent)
    runs_mod.forget()
    df = runs_mod.load_runs("rankexp", uri, cache_dir=False)
    assert len(df) == 2  # the sweep parent is no row
    fig = plt.figure()
    style.caption(fig, df, "rankexp")
    paths = style.save(fig, tmp_path / "out", "demo", df[["run_id"]])
    assert sorted(a.path for a in c.list_artifacts(parent, "figures")) == [
        "figures/demo.csv", "figures/demo.pdf", "figures/demo.png"]
    assert not any(c.list_artifacts(j) for j in jobs)  # the jobs (one outside a sweep) get none
    # a store that refuses: a warning, the figure still written
    with pytest.MonkeyPatch.context() as mp, caplog.at_level(logging.WARNING, "analysis"):
        mp.setattr(runs_mod, "attach_files", lambda *a: (_ for _ in ()).throw(OSError("read-only")))
        fig = plt.figure()
        style.caption(fig, df, "rankexp")
        again = style.save(fig, tmp_path / "out2", "demo")
    assert all(p.is_file() for p in again) and all(p.is_file() for p in paths)
    assert "could not attach demo.png, demo.pdf" in caplog.text and "read-only" in caplog.text


def test_an_offline_training_job_synced_later_has_the_same_member_runs(store, tmp_path):
    """The store down for the whole job: its member series go to the journal
    (``metrics.jsonl``) only; ``rankexp.sync`` then logs the run *and* its members, whose
    series equal those of the same config trained online."""
    from rankexp.app import save_result
    from rankexp.sync import Syncer

    uri, exp = store
    online_dir, job_dir = tmp_path / "online", tmp_path / "job"
    online_dir.mkdir(), job_dir.mkdir()
    online = run_job(online_dir, uri, exp, chash="online")
    journal = tracking.Journal(job_dir / tracking.JOURNAL_FILE)  # what app uses offline
    out = train_task.task_train(settings(job_dir), torch.device("cpu"), job_dir, journal, "off")
    save_result(job_dir / tracking.RESULT_DIR, out, {"config_hash": "off", "run_id": None})
    tracking.write_json(job_dir / tracking.RUN_FILE, {
        "uri": uri, "experiment": "rankexp", "experiment_id": exp, "run_name": "post·L2·train",
        "params": {"depth": 2}, "tags": {"config_hash": "off"}, "config_hash": "off"})
    outcome, run_id = Syncer().sync(job_dir)
    assert outcome == "logged"
    got = by_lr(members_of(uri, exp, run_id))
    want = by_lr(members_of(uri, exp, online.run_id))
    assert sorted(got) == list(LRS)
    for lr in LRS:
        assert got[lr].info.status == "FINISHED"
        assert got[lr].info.run_name == want[lr].info.run_name
        for name in SERIES:
            assert history(uri, got[lr].info.run_id, name) == history(uri, want[lr].info.run_id, name)
        assert got[lr].data.metrics["final_test_acc"] == want[lr].data.metrics["final_test_acc"]
    synced = client(uri).get_run(run_id).data.metrics
    assert not any(k.startswith("train_loss") for k in synced)  # the series are the members'
    assert synced["best_test_accuracy"] == client(uri).get_run(online.run_id).data.metrics[
        "best_test_accuracy"]
