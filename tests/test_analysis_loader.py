"""The analysis loader's bulk series reads and their cache (issue 14 item 7), on real stores:
a SQLite store written by the real RunLogger, and an `mlflow ui` server in front of it."""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import pandas as pd
import pytest
from services import client, mlflow_ui

import analysis.core.runs as runs_mod
from analysis.core import select as common
from rankexp import tracking

EXP = "loader"
KEYS = ["erank_profile", "rms", "never_logged"]


def logged(i: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    layers = np.arange(1, 7)
    rng = np.random.default_rng(i)
    series = {"erank_profile": (layers, rng.random(6)), "rms": (layers, rng.random(6) + 1)}
    if i == 0:
        series["rms"][1][2] = math.nan  # a NaN point survives the round trip
    return series


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Five finished runs (run 4 without ``rms``) and one still running."""
    root = tmp_path_factory.mktemp("loader")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    exp = tracking.prepare_experiment(uri, EXP)
    ids = []
    for i in range(5):
        with tracking.RunLogger(uri, exp, f"run{i}", {"seed": i}, {"config_hash": str(i)}) as run:
            series = logged(i)
            if i == 4:
                del series["rms"]
            run.log_metrics({"erank_io": float(i)}, series)
            ids.append(run.run_id)
    running = client(uri).create_run(exp, run_name="running").info.run_id
    return {"uri": uri, "ids": ids, "running": running, "root": root}


def as_lists(got):
    return {k: (v[0].tolist(), v[1].tolist()) for k, v in got.items()}


@pytest.mark.parametrize("finished_only", [True, False])
def test_sql_runs_table_equals_mlflow_search_runs(store, finished_only):
    fast = tracking.runs_table([EXP], store["uri"], finished_only=finished_only)
    # any filter makes runs_table ask mlflow.search_runs instead
    slow = tracking.runs_table([EXP], store["uri"], "attributes.run_name != 'no such run'",
                               finished_only=finished_only)
    assert len(fast) == (5 if finished_only else 6)
    assert list(fast["run_id"]) == list(slow["run_id"])  # same order (newest first)
    assert set(fast.columns) == set(slow.columns), set(fast.columns) ^ set(slow.columns)
    for col in slow.columns:
        a, b = fast[col].reset_index(drop=True), slow[col].reset_index(drop=True)
        if col.startswith("metrics."):
            np.testing.assert_array_equal(a.astype(float), b.astype(float), err_msg=col)
        elif col.endswith("_time"):
            assert (a.isna() == b.isna()).all() and (a[a.notna()] == b[b.notna()]).all(), col
        else:
            assert a.fillna("∅").astype(str).tolist() == b.fillna("∅").astype(str).tolist(), col


def test_bulk_histories_equal_one_call_per_run_and_key(store):
    uri, ids = store["uri"], store["ids"] + [store["running"]]
    got = tracking.metric_histories(uri, ids, KEYS)
    mlflow_client, want = client(uri), {}
    for rid in ids:
        for k in KEYS:
            hist = sorted(mlflow_client.get_metric_history(rid, k), key=lambda m: m.step)
            if hist:
                want[(rid, k)] = (np.array([m.step for m in hist]), np.array([m.value for m in hist]))
    assert set(got) == set(want) and len(want) == 9  # 5 erank + 4 rms
    for k, (steps, values) in want.items():
        np.testing.assert_array_equal(got[k][0], steps)
        np.testing.assert_array_equal(got[k][1], values)  # NaN == NaN here
    assert np.isnan(got[(store["ids"][0], "rms")][1][2])


def test_bulk_histories_through_a_tracking_server_equal_the_database_read(store, tmp_path):
    ids = store["ids"]
    direct = tracking.metric_histories(store["uri"], ids, KEYS)
    with mlflow_ui(store["uri"], tmp_path / "ui.log") as url:
        served = tracking.metric_histories(url, ids, KEYS)
    assert set(served) == set(direct)
    for k in direct:
        np.testing.assert_array_equal(served[k][0], direct[k][0])
        np.testing.assert_array_equal(served[k][1], direct[k][1])


def test_load_runs_puts_series_in_columns_and_serves_them_from_the_cache(store, tmp_path,
                                                                        monkeypatch):
    uri, cache = store["uri"], tmp_path / "cache"
    table = runs_mod.load_runs(EXP, uri, series=KEYS[:2], cache_dir=cache)
    assert len(table) == 5 and table["end_time"].notna().all()
    for seed, erank, rms in zip(table["seed"], table["series:erank_profile"], table["series:rms"],
                                strict=True):
        want = logged(int(seed))
        np.testing.assert_array_equal(erank[1], want["erank_profile"][1])
        if int(seed) == 4:
            assert rms is None
        else:
            np.testing.assert_array_equal(rms[0], want["rms"][0])
    assert len(list(cache.rglob("*.npz"))) == 5

    def offline(*a, **k):
        raise AssertionError("read MLflow although every series is cached")

    runs_mod.forget()  # a fresh process: only the disk cache is left
    monkeypatch.setattr(runs_mod, "metric_histories", offline)
    again = runs_mod.load_runs(EXP, uri, series=KEYS[:2], cache_dir=cache)
    for a, b in zip(table["series:erank_profile"], again["series:erank_profile"], strict=True):
        np.testing.assert_array_equal(a[1], b[1])
    assert again["series:rms"].isna().sum() == 1  # "never logged" is cached too


def test_a_rerun_finish_time_invalidates_its_cached_series(store, tmp_path):
    uri, cache = store["uri"], tmp_path / "cache"
    exp = tracking.prepare_experiment(uri, "loader_rerun")
    with tracking.RunLogger(uri, exp, "rerun", {"seed": 0}, {}) as run:
        run.log_metrics({}, {"erank_profile": ([1, 2], [0.5, 0.25])})
    first = runs_mod.load_runs("loader_rerun", uri, series=["erank_profile"], cache_dir=cache)
    assert first["series:erank_profile"][0][1].tolist() == [0.5, 0.25]
    # the run is re-terminated with a new point (as a sync of a job directory could do)
    c = client(uri)
    time.sleep(0.01)
    c.log_metric(run.run_id, "erank_profile", 42.0, step=7)
    c.set_terminated(run.run_id, "FINISHED")
    runs_mod.forget()
    second = runs_mod.load_runs("loader_rerun", uri, series=["erank_profile"], cache_dir=cache)
    assert second["end_time"][0] > first["end_time"][0]
    steps, values = second["series:erank_profile"][0]
    assert steps.tolist() == [1, 2, 7] and values.tolist() == [0.5, 0.25, 42.0]


def test_damaged_cache_file_is_read_again(store, tmp_path, caplog):
    uri, cache = store["uri"], tmp_path / "cache"
    first = runs_mod.load_runs(EXP, uri, series=["erank_profile"], cache_dir=cache)
    victim = sorted(cache.rglob("*.npz"))[0]
    victim.write_bytes(b"garbage")
    runs_mod.forget()
    with caplog.at_level(logging.WARNING, logger="analysis"):
        again = runs_mod.load_runs(EXP, uri, series=["erank_profile"], cache_dir=cache)
    assert f"ignoring series cache {victim}" in caplog.text
    pd.testing.assert_series_equal(first["series:erank_profile"].map(lambda v: v[1].tolist()),
                                   again["series:erank_profile"].map(lambda v: v[1].tolist()))


def test_figure_loops_cost_one_bulk_read_per_key(store, monkeypatch, tmp_path):
    """common.series in a per-run loop (how the figure modules read) prefetches the key for
    every loaded run on its first miss."""
    monkeypatch.setenv("RANKEXP_ANALYSIS_CACHE", str(tmp_path / "cache"))
    runs_mod.forget()
    calls = []
    real = runs_mod.metric_histories
    monkeypatch.setattr(runs_mod, "metric_histories",
                        lambda uri, ids, keys: calls.append((len(ids), list(keys))) or real(uri, ids, keys))
    args = type("Args", (), {"experiment": [EXP], "uri": store["uri"], "filter": "", "where": []})
    df = common.load(args)
    for rid in df["run_id"]:
        common.series(store["uri"], rid, "erank_profile")
    assert calls == [(5, ["erank_profile"])]
    with pytest.raises(KeyError, match="has no series 'rms'"):
        for rid in df["run_id"]:
            common.series(store["uri"], rid, "rms")
    assert calls[1:] == [(5, ["rms"])]
    assert len(list((tmp_path / "cache").rglob("*.npz"))) == 5


def test_a_sqlite_stores_series_cache_sits_beside_it(tmp_path):
    store = tmp_path / "sub" / "mlflow.db"
    assert runs_mod.default_cache_dir(f"sqlite:///{store}") == tmp_path / "sub" / "mlflow.db.series-cache"
    assert runs_mod.default_cache_dir("http://127.0.0.1:5000") == runs_mod.DEFAULT_CACHE_DIR


def test_the_heatmap_refuses_the_readmes_own_mix(tmp_path, capsys):
    """The README's headline sweep, then its one-probe example, into one store: ``python -m
    analysis heatmap --experiment rankexp`` refuses (exit 2, naming task.probes) and draws
    nothing — no empty panel, no caption counting runs it did not draw."""
    from services import clean_env, rankexp

    from analysis.core.runner import main as analysis_main

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    small = ("width=16", "seeds=2", f"tracking.uri={uri}")  # the README's commands, CPU-sized
    rankexp("norm=post", "alpha=1,2", "depth=48,96", *small, "-m", cwd=tmp_path, env=clean_env()).check()
    rankexp("norm=post", "alpha=2", "depth=96", "task.probes=[io_jacobian]", *small, cwd=tmp_path,
            env=clean_env()).check()
    capsys.readouterr()
    rc = analysis_main(["heatmap", "--experiment", "rankexp", "--uri", uri, "--out", str(tmp_path / "figs")])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "runs in one cell differ in task.probes" in err and "--filter" in err
    assert not list((tmp_path / "figs").rglob("*.png"))


def test_the_analysis_commands_load_without_torch():
    """Issue 28 row 7: ``python -m analysis heatmap`` (every command is registered on start)
    imports no torch: half a GB and seconds a figure from logged runs does not need."""
    import subprocess
    import sys

    code = ("import sys; from analysis.core.runner import commands; commands(); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
