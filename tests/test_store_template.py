"""A new SQLite store is a copy of MLflow's own empty store (issue 20 item 3, issue 18 item 1):
:func:`rankexp.tracking.store_template` is made once per MLflow version by MLflow's schema
creation, :func:`rankexp.tracking.new_store` copies it under the store lock, and the result is
the store MLflow itself makes — with no migration in the process that needs it, and with two
processes creating one store at once both succeeding."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

import pytest
from mlflow.store.db import utils as db_utils
from mlflow.tracking import MlflowClient

from rankexp import tracking


def _lines(sql: str | None) -> list[str]:
    """A CREATE statement's lines, in order of text: MLflow's migrations write a table's
    constraints in an order that differs from one store they create to the next."""
    return sorted(line.strip().rstrip(",") for line in (sql or "").splitlines())


def _schema(db: Path) -> dict:
    """Everything a store's file says about its schema and contents that is not a timestamp."""
    with sqlite3.connect(db) as c:
        return {
            "objects": sorted((t, n, tbl, _lines(sql)) for t, n, tbl, sql in c.execute(
                "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")),
            "revision": c.execute("SELECT version_num FROM alembic_version").fetchall(),
            "experiments": c.execute("SELECT experiment_id, name, artifact_location, lifecycle_stage, "
                                     "workspace FROM experiments ORDER BY experiment_id").fetchall(),
        }


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "rankexp" / "mlflow-stores"


def test_a_store_from_the_template_is_the_store_mlflow_makes(tmp_path, cache, monkeypatch):
    """Tables, indexes, triggers, the schema revision and the Default experiment (its artifact
    root MLflow's own, from where the store is opened) are those of a store MLflow creates; the
    template is in the cache, and a second new store runs no migration at all."""
    monkeypatch.chdir(tmp_path)
    ours, mlflows = tmp_path / "ours" / "mlflow.db", tmp_path / "mlflows" / "mlflow.db"
    ours.parent.mkdir()
    mlflows.parent.mkdir()
    tracking.check_store(f"sqlite:///{ours}")
    MlflowClient(f"sqlite:///{mlflows}").search_experiments()
    (template,) = cache.glob("mlflow-*.db")
    assert _schema(template)["experiments"] == []  # MLflow adds Default where the store is opened
    assert _schema(ours) == _schema(mlflows)
    assert _schema(ours)["revision"] == [(db_utils._get_latest_schema_revision(),)]
    assert _schema(ours)["experiments"][0][:2] == (0, "Default")

    def no_migrations(engine):
        raise AssertionError("a new store ran MLflow's migrations")

    monkeypatch.setattr(db_utils, "_initialize_tables", no_migrations)
    again = tmp_path / "again" / "mlflow.db"
    again.parent.mkdir()
    tracking.check_store(f"sqlite:///{again}")
    exp = tracking.prepare_experiment(f"sqlite:///{again}", "x")
    run = MlflowClient(f"sqlite:///{again}").create_run(exp)
    assert MlflowClient(f"sqlite:///{again}").get_run(run.info.run_id).info.status == "RUNNING"


def test_a_store_is_never_replaced_and_a_broken_template_is_not_copied(tmp_path, cache):
    """``new_store`` leaves an existing file alone (a store another program made meanwhile);
    a template whose revision is not MLflow's is made again, not copied."""
    db = tmp_path / "mlflow.db"
    db.write_bytes(b"someone else's")
    assert tracking.new_store(db) and db.read_bytes() == b"someone else's"
    (template,) = cache.glob("mlflow-*.db")
    with sqlite3.connect(template) as c:
        c.execute("UPDATE alembic_version SET version_num = 'stale'")
    fresh = tmp_path / "fresh.db"
    assert tracking.new_store(fresh)
    assert _schema(fresh)["revision"] == [(db_utils._get_latest_schema_revision(),)]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == []


ROUNDS = 12


def _creator(folder: str, barrier, errors) -> None:
    """One of two processes: in every round, the same moment as the other, make that round's
    store (a fresh cache in the first rounds: both build the template too), its experiment and
    a run."""
    import os

    from mlflow.tracking import MlflowClient

    from rankexp import tracking

    try:
        for i in range(ROUNDS):
            os.environ["XDG_CACHE_HOME"] = f"{folder}/cache{min(i, 2)}"
            uri = f"sqlite:///{folder}/store{i}/mlflow.db"
            barrier.wait(timeout=120)
            tracking.check_store(uri)
            exp = tracking.prepare_experiment(uri, "race")
            MlflowClient(uri).create_run(exp)
    except Exception as e:  # reported to the test, which fails with it
        errors.put(f"{os.getpid()} round {i}: {type(e).__name__}: {e}")


def test_two_processes_creating_one_store_at_once_both_succeed(tmp_path):
    """Two real processes, released together by a barrier, create the same new store
    :data:`ROUNDS` times (the first rounds also build the template at once): every round both
    succeed, and each store has its schema, one Default experiment (id 0), one ``race``
    experiment and both runs."""
    ctx = multiprocessing.get_context("spawn")
    barrier, errors = ctx.Barrier(2), ctx.Queue()
    for i in range(ROUNDS):
        (tmp_path / f"store{i}").mkdir()
    procs = [ctx.Process(target=_creator, args=(str(tmp_path), barrier, errors)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
    problems = [errors.get() for _ in range(errors.qsize())] if not errors.empty() else []
    assert problems == [] and [p.exitcode for p in procs] == [0, 0], problems
    head = db_utils._get_latest_schema_revision()
    for i in range(ROUNDS):
        db = tmp_path / f"store{i}" / "mlflow.db"
        s = _schema(db)
        assert s["revision"] == [(head,)], i
        assert [(e[0], e[1]) for e in s["experiments"]] == [(0, "Default"), (1, "race")], i
        with sqlite3.connect(db) as c:
            assert c.execute("SELECT count(*) FROM runs").fetchone() == (2,), i
