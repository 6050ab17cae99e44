"""The degradation analysis end to end: ``experiment=degradation`` at size=cpu (task=measure,
seeds in memory chunks) and size=smoke (task=train), shrunk by command-line overrides, into one
real SQLite store; every analysis command then draws from it through ``figure_checks.checked``
(the house figure checks), and the tables are checked against what MLflow holds.

Cost: two CLI sweeps of two depth-8 networks each (width 4, 6 training steps) and five
in-process analysis commands, ≈ 40 s on a 2-core CPU.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from conftest import REPO, runs_in
from figure_checks import checked, legend_texts

from rankexp.tasks.data import ARCHIVE_NAME, DEFAULT_CACHE_DIR, DEFAULT_ROOT

pytestmark = pytest.mark.skipif(
    not (DEFAULT_ROOT / ARCHIVE_NAME).is_file(), reason=f"no {DEFAULT_ROOT / ARCHIVE_NAME}"
)
SMALL = ("model.base_width=4", "task.options.layer_response.images=200",
         "task.options.init_gradient_norms.batch=32", f"data.cache_dir={DEFAULT_CACHE_DIR}")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """``(cwd, uri)`` of a store with the degradation experiment at size=cpu and size=smoke."""
    cwd = tmp_path_factory.mktemp("degradation")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RANKEXP_STAMP"))}
    env["PYTHONPATH"] = str(REPO)

    def cli(*args: str) -> None:
        p = subprocess.run([sys.executable, "-m", "rankexp", "experiment=degradation", *args, "-m"],
                           cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=600)
        assert p.returncode == 0, p.stdout[-4000:]

    # size=cpu: init-time measurements (its short-training grid left out: the smoke sweep below
    # trains); a tiny memory budget puts each seed in its own chunk
    cli("size=cpu", "~hydra.sweeper.grids.trained", "depth=8", "seeds=2", "task.max_memory_gb=1e-6",
        *SMALL)
    cli("size=smoke", "task.steps=6", "task.eval_every=6", "task.log_every=3",
        "task.clean_train_images=200", "task.options.lesion.images=200",
        f"task.checkpoint_dir={cwd / 'ckpt'}", *SMALL)
    return cwd, f"sqlite:///{cwd / 'mlflow.db'}"


def job_runs(uri: str):
    return {(r.data.params["task.name"], r.data.params["model.residual"]): r
            for r in runs_in(uri, "degradation") if "mlflow.parentRunId" in r.data.tags}


def test_both_sizes_log_every_measurement(store):
    _, uri = store
    runs = job_runs(uri)
    assert sorted(runs) == [("measure", "False"), ("measure", "True"), ("train", "False"),
                            ("train", "True")]
    assert {r.info.status for r in runs.values()} == {"FINISHED"}
    measure = runs[("measure", "False")].data.metrics
    assert measure["seed_chunk"] == 1.0  # two seeds, one per chunk
    # the two seeds differ: both were measured (a scalar's seed spread is the tag seed_std.<m>)
    assert float(runs[("measure", "False")].data.tags["seed_std.grad_ratio"]) > 0
    train = runs[("train", "True")].data.metrics
    for key in ("final_test_error_lr0.1", "clean_train_error_lr0.1", "lesion_intact_error",
                "response_std_mean", "grad_ratio", "train_seconds"):
        assert np.isfinite(train[key]), key


def analyse(store, command: str, *extra: str):
    cwd, uri = store
    return checked([command, "--uri", uri, "--out", str(cwd / "figures"), *extra])


def test_init_gradients_table_is_the_runs_ratios_and_the_figure_shows_the_mean_field_rate(store):
    cwd, uri = store
    with analyse(store, "init-gradients", "--task", "measure") as (rc, figs):
        assert rc == 0
        assert r"\sqrt{\pi/(\pi-1)}" in legend_texts(figs["init_gradient_norms"])
    table = pd.read_csv(cwd / "figures" / "degradation" / "init_gradient_norms.csv", index_col=0)
    runs = job_runs(uri)
    for residual, column in (("False", "plain"), ("True", "ResNet")):
        ratio = runs[("measure", residual)].data.metrics["grad_ratio"]
        assert table.loc[8, column] == pytest.approx(ratio, rel=1e-9)
        assert table.loc[8, f"{column}_per_layer"] == pytest.approx(ratio ** (1 / 5), rel=1e-9)


def test_responses_in_layer_order_and_sorted(store):
    cwd, _ = store
    with analyse(store, "responses") as (rc, figs):
        assert rc == 0 and set(figs) == {"layer_responses_train"}
    with analyse(store, "responses", "--task", "measure") as (rc, figs):
        assert rc == 0
    init = pd.read_csv(cwd / "figures" / "degradation" / "layer_responses_measure.csv")
    assert len(init) == 2 * 7  # two networks × 6n+1 layers
    np.testing.assert_allclose(init["std"], 1.0, atol=1e-3)  # BN at init with batch statistics


def test_error_curves_error_table_and_lesion(store):
    cwd, uri = store
    for command in ("error-curves", "error-table", "lesion"):
        with analyse(store, command) as (rc, _):
            assert rc == 0, command
    out = cwd / "figures" / "degradation"
    errors = pd.read_csv(out / "final_errors.csv", index_col=0)
    runs = job_runs(uri)
    assert errors.loc[8, "ResNet_test"] == pytest.approx(
        100 * runs[("train", "True")].data.metrics["final_test_error_lr0.1"], rel=1e-9)
    lesion = pd.read_csv(out / "lesion.csv")
    assert sorted(lesion.loc[lesion["downsampling"], "block"].unique()) == [2, 3]  # n = 1


def test_claims_are_registered_and_judged_without_errors(store):
    from analysis.core import claims
    from analysis.core.registry import default

    _, uri = store
    ours = list(default()["degradation"].bound_claims())
    assert len(ours) == 8 and {c.experiment for c in ours} == {"degradation"}
    runs = claims.Runs(uri)
    try:
        verdicts = {v.claim.id: v for v in claims.evaluate(runs, ours)}
    finally:
        runs.close()
    assert claims.ERROR not in {v.verdict for v in verdicts.values()}
    # one depth only: the growth claims cannot be judged, and say so
    assert verdicts["degradation.plain_grad_ratio_grows"].verdict == claims.NOT_RUN
    assert verdicts["degradation.resnet_grad_ratio_bounded"].verdict in (claims.HOLDS,
                                                                         claims.FAILS)
