"""Trainability analysis end to end: real sweeps on real CIFAR-10 into a real SQLite store,
then the analysis commands fig6, table5, fig16, curves; every number in the CSVs is
checked against what MLflow holds for the runs (read with MlflowClient, not through
``analysis``), and every figure they save passes the publication checks of
``figure_checks`` (run in the batch process on the figure objects)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO, member_history, runs_in

from rankexp.tasks.data import ARCHIVE_NAME, DEFAULT_CACHE_DIR, DEFAULT_ROOT

pytestmark = pytest.mark.skipif(
    not (DEFAULT_ROOT / ARCHIVE_NAME).is_file(), reason=f"no {DEFAULT_ROOT / ARCHIVE_NAME}"
)

LRS = (1e-3, 1e-2)


def train_overrides(ckpt: Path) -> tuple[str, ...]:
    """A tiny training job.  Data cache and checkpoints are absolute paths: a relative
    ``.cache`` would resolve to the scratch directory once its checkpoint folder exists
    there, and the data set would be decoded again into it."""
    return (
        "width=16",
        "task.steps=20",
        "task.eval_every=10",
        "task.log_every=10",
        f"task.lrs=[{','.join(f'{lr:g}' for lr in LRS)}]",
        f"task.checkpoint_dir={ckpt}",
        f"data.cache_dir={DEFAULT_CACHE_DIR}",
    )


def job_runs(uri: str, experiment: str):
    return [r for r in runs_in(uri, experiment) if r.data.tags.get("rankexp.role") != "sweep"]


# Runs analysis commands in one process (the sweeps' interpreter start-up is the slow part of
# this module): each argv goes through analysis.__main__.main, the function `python -m analysis`
# exits with, its stdout/stderr/logging captured apart.
BATCH = """
import contextlib, io, json, logging, sys
sys.path.insert(0, sys.argv[3])  # tests/, for figure_checks
from analysis.core.runner import main
from analysis.core.style import recording
from figure_checks import THEORY, legend_texts, problems

class Current:  # a logging stream that writes to whatever sys.stdout is at the time
    def write(self, s): sys.stdout.write(s)
    def flush(self): pass

logging.basicConfig(level=logging.INFO, format="%(message)s", stream=Current())
results = {}
for name, argv in json.loads(sys.argv[1]).items():
    buf = io.StringIO()
    with recording() as figs, contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        rc = main(argv)
        found = {f.get_label(): problems(f) for f in figs}
        for f in figs:
            for k, wants in THEORY.items():
                if f.get_label().startswith(k):
                    found[f.get_label()] += [f"no theory curve {w!r}" for w in wants
                                             if w not in legend_texts(f)]
    results[name] = {"rc": rc, "out": buf.getvalue(), "figures": found}
open(sys.argv[2], "w").write(json.dumps(results))
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One scratch directory with three experiments built by the real CLI: ``fig6`` (rank,
    8 runs), ``fig6_train`` (8 runs) and ``fig16`` (4 runs).  ``store(*args, module=)`` runs
    ``python -m <module> args`` there; ``store.analyse({name: argv})`` runs analysis commands."""
    cwd = tmp_path_factory.mktemp("training_store")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RANKEXP_STAMP"))}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")

    def run(*args: str, module: str = "rankexp", check: bool = True, prefix=("-m",)):
        p = subprocess.run(
            [sys.executable, *prefix, *((module,) if module else ()), *args],
            cwd=cwd,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=600,
        )
        if check and p.returncode != 0:
            raise AssertionError(
                f"`{module} {' '.join(args)}` exited {p.returncode}:\n{p.stdout[-4000:]}"
            )
        return p

    def analyse(commands: dict[str, list[str]]) -> dict[str, dict]:
        out = cwd / "analyses.json"
        run(json.dumps(commands), str(out), str(REPO / "tests"), module="", prefix=("-c", BATCH))
        return json.loads(out.read_text())

    small = train_overrides(cwd / "checkpoints")
    run(
        "experiment=fig6",
        "width=16",
        "seeds=2",
        "task.probes=[io_jacobian]",
        "depth=2,4",
        "alpha=1,2",
        "-m",
    )
    run("experiment=fig6_train", "depth=2,4", "alpha=1,2", *small, "-m")
    run("experiment=fig16", "matrices=1,2", "norm=none,pre", "depth=3", *small, "-m")
    run.cwd, run.uri, run.analyse = cwd, f"sqlite:///{cwd / 'mlflow.db'}", analyse
    return run


def median_final_accuracy(uri: str) -> float:
    """A stability threshold that about half of the (run, LR) pairs of fig6_train reach."""
    finals = sorted(
        r.data.metrics[f"final_test_acc_lr{lr:g}"]
        for r in job_runs(uri, "fig6_train")
        for lr in LRS
    )
    return finals[len(finals) // 2]


ERRORS = {
    "unknown experiment": (["table5", "--experiment", "nope"], "no experiment named ['nope']"),
    "unknown train experiment": (
        ["fig6", "--train-experiment", "nope"],
        "no experiment named ['nope']",
    ),
    "rank runs given to table5": (
        ["table5", "--experiment", "fig6"],
        "no column(s) ['max_stable_lr']",
    ),
    "unknown metric": (
        ["fig16", "--metric", "accuracy_at_init"],
        "no column(s) ['accuracy_at_init']",
    ),
    "filter leaves nothing": (
        ["fig6", "--filter", "params.width = '999'"],
        "no finished runs matching",
    ),
    "ambiguous run": (["curves", "--where", "depth=4"], "4 runs match"),
    "--experiment given to fig6": (["fig6", "--experiment", "fig6"], "not --experiment"),
}


@pytest.fixture(scope="module")
def analysed(store):
    """Every command of analysis/training.py over the store: ``{name: {"rc", "out"}}``."""
    commands = {
        "fig6": ["fig6"],
        "table5": ["table5", "--out", "figures/logged"],
        "table5 threshold": [
            "table5",
            "--stable-accuracy",
            repr(median_final_accuracy(store.uri)),
            "--out",
            "figures/recomputed",
        ],
        "fig16": ["fig16"],
        "fig16 of fig6_train": ["fig16", "--experiment", "fig6_train"],
        "curves": ["curves", "--where", "depth=4", "alpha=2", "norm.placement=post"],
        **{name: argv for name, (argv, _) in ERRORS.items()},
    }
    return store.analyse(commands)


def test_every_figure_is_publication_ready(analysed):
    """Each successful command saved figures, and none has a problem (figure_checks)."""
    for name, res in analysed.items():
        if res["rc"] != 0:
            continue
        assert res["figures"], f"{name}: no figure saved"
        bad = {stem: p for stem, p in res["figures"].items() if p}
        assert not bad, f"{name}: {bad}"


def by_cell(uri: str, experiment: str, keys: tuple[str, ...]) -> dict[tuple, object]:
    """``{(param values…): run}`` of an experiment's job runs (one run per cell here)."""
    out = {}
    for r in job_runs(uri, experiment):
        assert r.info.status == "FINISHED"
        cell = tuple(r.data.params[k] for k in keys)
        assert cell not in out, f"two runs in cell {cell}"
        out[cell] = r
    return out


def key(*values) -> tuple[str, ...]:
    """Param values as MLflow stores them (``alpha`` 1 → ``'1.0'``, ``depth`` 2 → ``'2'``)."""
    return tuple(str(v) for v in values)


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-12)


def test_configs_run_the_study_grids(store):
    rank = by_cell(store.uri, "fig6", ("norm.placement", "depth", "alpha"))
    train = by_cell(store.uri, "fig6_train", ("norm.placement", "depth", "alpha"))
    assert set(rank) == set(train) and len(train) == 8
    for r in list(rank.values()) + list(train.values()):
        p = r.data.params
        assert (p["expansion"], p["matrices"], p["beta"], p["width"]) == ("1.0", "2", "1.0", "16")
    assert {r.data.params["task.name"] for r in train.values()} == {"train"}
    assert {r.data.tags["task"] for r in rank.values()} == {"measure"}
    fig16 = by_cell(store.uri, "fig16", ("matrices", "norm.placement", "depth"))
    assert set(fig16) == {key(m, n, 3) for m in (1, 2) for n in ("none", "pre")}
    assert {r.data.params["task.name"] for r in fig16.values()} == {"train"}


def test_fig6_puts_logged_rank_beside_logged_accuracy(store, analysed):
    assert analysed["fig6"]["rc"] == 0, analysed["fig6"]["out"]
    out = store.cwd / "figures" / "fig6_train"
    stem = "fig6_erank_io_vs_best_test_accuracy"
    for ext in ("png", "pdf", "csv"):
        assert (out / f"{stem}.{ext}").stat().st_size > 0
    table = pd.read_csv(out / f"{stem}.csv")
    assert list(table["norm.placement"].unique()) == ["pre", "post"]  # rows in the study's order
    rank = by_cell(store.uri, "fig6", ("norm.placement", "depth", "alpha"))
    train = by_cell(store.uri, "fig6_train", ("norm.placement", "depth", "alpha"))
    assert len(table) == 8
    assert (table["erank_io_runs"] == 1).all() and (table["best_test_accuracy_runs"] == 1).all()
    for row in table.itertuples(index=False):
        cell = key(row[0], row.depth, row.alpha)
        assert row.erank_io == pytest.approx(rank[cell].data.metrics["erank_io"], rel=1e-12)
        assert row.best_test_accuracy == pytest.approx(
            train[cell].data.metrics["best_test_accuracy"], rel=1e-12
        )
        # best accuracy is the best final accuracy over the LRs the run trained
        finals = [train[cell].data.metrics[f"final_test_acc_lr{lr:g}"] for lr in LRS]
        assert row.best_test_accuracy == pytest.approx(max(finals), rel=1e-12)


def expected_max_stable_lr(run, threshold: float) -> float:
    m = run.data.metrics
    stable = [
        lr
        for lr in LRS
        if m[f"final_test_acc_lr{lr:g}"] >= threshold and m[f"diverged_lr{lr:g}"] == 0
    ]
    return max(stable) if stable else float("nan")


def check_table5(table: pd.DataFrame, train: dict, per_run) -> list[float]:
    """Columns alpha=1, alpha=2 hold ``per_run(run)``; ``max over alpha`` their max."""
    assert list(table.columns) == [
        "norm.placement",
        "depth",
        "alpha=1",
        "alpha=2",
        "max over alpha",
    ]
    assert len(table) == 4
    seen = []
    for row in table.itertuples(index=False):
        want = [per_run(train[key(row[0], row.depth, alpha)]) for alpha in (1.0, 2.0)]
        assert same(row[2], want[0]) and same(row[3], want[1])
        finite = [w for w in want if not math.isnan(w)]
        assert same(row[4], max(finite) if finite else float("nan"))
        seen += want
    return seen


def test_table5_is_the_max_stable_lr_per_placement_depth_and_alpha(store, analysed):
    train = by_cell(store.uri, "fig6_train", ("norm.placement", "depth", "alpha"))
    # as logged (task.stable_accuracy = 0.4)
    logged = analysed["table5"]
    assert logged["rc"] == 0, logged["out"]
    assert "| norm.placement | depth | alpha=1 | alpha=2 | max over alpha |" in logged["out"]
    out = store.cwd / "figures" / "logged" / "fig6_train"
    check_table5(
        pd.read_csv(out / "table5_max_stable_lr.csv"),
        train,
        lambda r: r.data.metrics["max_stable_lr"],
    )
    for ext in ("png", "pdf", "md"):
        assert (out / f"table5_max_stable_lr.{ext}").stat().st_size > 0
    # recomputed at a threshold that about half of the (run, LR) pairs reach
    threshold = median_final_accuracy(store.uri)
    assert analysed["table5 threshold"]["rc"] == 0
    out = store.cwd / "figures" / "recomputed" / "fig6_train"
    seen = check_table5(
        pd.read_csv(out / "table5_max_stable_lr.csv"),
        train,
        lambda r: expected_max_stable_lr(r, threshold),
    )
    assert any(not math.isnan(v) for v in seen)


def test_fig16_is_best_accuracy_per_matrices_norm_and_depth(store, analysed):
    assert analysed["fig16"]["rc"] == 0, analysed["fig16"]["out"]
    out = store.cwd / "figures" / "fig16"
    stem = "fig16_best_test_accuracy_vs_depth"
    for ext in ("png", "pdf", "csv"):
        assert (out / f"{stem}.{ext}").stat().st_size > 0
    runs = by_cell(store.uri, "fig16", ("matrices", "norm.placement", "depth"))
    table = pd.read_csv(out / f"{stem}.csv")
    assert len(table) == 4 and (table["count"] == 1).all()
    for row in table.itertuples(index=False):
        logged = runs[key(row.matrices, row[1], row.depth)].data.metrics["best_test_accuracy"]
        assert row.mean == pytest.approx(logged, rel=1e-12)


def test_fig16_over_runs_of_several_alphas_averages_them_and_says_so(store, analysed):
    res = analysed["fig16 of fig6_train"]
    assert res["rc"] == 0 and "runs differ in alpha ∈ [1.0, 2.0]" in res["out"]
    out = store.cwd / "figures" / "fig6_train"
    table = pd.read_csv(out / "fig16_best_test_accuracy_vs_depth.csv")
    train = by_cell(store.uri, "fig6_train", ("norm.placement", "depth", "alpha"))
    assert len(table) == 4 and (table["count"] == 2).all()
    for row in table.itertuples(index=False):
        accs = [
            train[key(row[1], row.depth, a)].data.metrics["best_test_accuracy"] for a in (1.0, 2.0)
        ]
        assert row.mean == pytest.approx(sum(accs) / 2, rel=1e-12)


def test_curves_are_the_logged_series_of_one_run(store, analysed):
    assert analysed["curves"]["rc"] == 0, analysed["curves"]["out"]
    run = by_cell(store.uri, "fig6_train", ("norm.placement", "depth", "alpha"))[
        key("post", 4, 2.0)
    ]
    stem = f"curves_{run.info.run_id[:8]}"
    out = store.cwd / "figures" / "fig6_train"
    for ext in ("png", "pdf", "csv"):
        assert (out / f"{stem}.{ext}").stat().st_size > 0
    table = pd.read_csv(out / f"{stem}.csv")
    for lr in LRS:
        for metric in ("test_acc", "train_loss"):
            hist = member_history(store.uri, run.info.run_id, lr, metric)  # its member's series
            got = table[(table["metric"] == metric) & (table["lr"] == lr)]
            assert got["step"].tolist() == [m.step for m in hist] == [10, 20]
            assert got["value"].tolist() == pytest.approx([m.value for m in hist], rel=1e-12)


@pytest.mark.parametrize("name", list(ERRORS))
def test_missing_experiments_columns_and_runs_are_clear_errors(analysed, name):
    res, says = analysed[name], ERRORS[name][1]
    assert res["rc"] == 2, res["out"]
    assert says in res["out"] and "Traceback" not in res["out"]


def test_train_run_logs_test_accuracy_at_eval_steps_and_a_rerun_skips_it(store):
    """One job (no multirun), in the store's directory so it shares the SQLite store (a
    fresh store's schema migration alone takes seconds)."""
    args = (
        "task=train",
        "depth=2",
        "tracking.experiment=one_run",
        *train_overrides(store.cwd / "checkpoints"),
    )
    store(*args)
    runs = job_runs(store.uri, "one_run")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    for lr in LRS:
        hist = member_history(store.uri, runs[0].info.run_id, lr, "test_acc")
        assert sorted(m.step for m in hist) == [10, 20]
        assert all(0 <= m.value <= 1 for m in hist)
        final = max(hist, key=lambda m: m.step).value
        assert runs[0].data.metrics[f"final_test_acc_lr{lr:g}"] == pytest.approx(final, rel=1e-12)
    p = store(*args)
    assert "skipping" in p.stdout and runs[0].info.run_id in p.stdout
    assert len(job_runs(store.uri, "one_run")) == 1
