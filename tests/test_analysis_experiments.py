"""Every ``conf/experiment/`` config composes and runs at ``size=smoke`` — its main sweep and its
``# also:`` sweeps, as ``make figures`` runs them — into its own SQLite store, and every
``python -m analysis`` command of its header draws from those runs (exit 0, files written).

The sweeps run in this process (Hydra's multirun called as the CLI is, one interpreter for
all of them: start-up is most of a smoke sweep's time).  Experiments another default test
already sweeps and draws (:data:`COVERED_ELSEWHERE`) run here under ``-m slow``.  The ``cpu`` sizes (``make figures``)
of the experiments added for science.md §4 run under ``-m slow``.  Experiments that train on
CIFAR-10 need the real archive and are skipped (with the reason) where it is missing.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from conftest import runs_in
from figure_checks import problems

from analysis.figures import CONF, read_plan, run_analysis
from analysis.plotting import recording
from rankexp.tasks.data import ARCHIVE_NAME, DEFAULT_CACHE_DIR, DEFAULT_ROOT

EXPERIMENTS = sorted(p.stem for p in CONF.glob("*.yaml"))
#: experiments whose config another default test already sweeps through the CLI and draws
#: (smaller grids of their own): here they run under -m slow, so the default suite pays once
COVERED_ELSEWHERE = {
    **dict.fromkeys(("mf_phase", "mf_relu_collapse", "mf_spectrum", "mf_bn", "mf_residual",
                     "mf_trainability", "deep_linear"), "test_analysis_meanfield.py"),
    **dict.fromkeys(("fig1", "fig2", "fig4", "fig5"), "test_analysis_rank.py"),
    **dict.fromkeys(("fig6", "fig6_train", "fig16"), "test_analysis_training.py"),
    **dict.fromkeys(("fig3", "fig7", "fig8", "tab1", "tab6"), "test_analysis_spectra.py"),
    "degradation": "test_analysis_degradation.py",
    "fig12": "test_analysis_ffn.py",
}
#: the analysis commands whose figures only this module draws (and style-checks)
DRAWN_HERE = ("post_ops", "cos_field", "centring", "table2", "table3")
HAVE_CIFAR = (DEFAULT_ROOT / ARCHIVE_NAME).is_file()
#: the experiments of science.md §4 (their cpu sizes run under -m slow)
REST = ("fig10", "fig11", "fig13", "fig13_train", "fig14", "fig15", "fig17", "tab2", "tab3")
#: experiments that read another experiment's runs in their analysis (run that one first)
NEEDS = {"fig6_train": "fig6", "fig13_train": "fig13"}


def trains(name: str) -> bool:
    return "override /task: train" in (CONF / f"{name}.yaml").read_text()


def sweep(name: str, overrides: list[str], store: Path, monkeypatch) -> None:
    """``python -m rankexp experiment=<name> <overrides> -m`` in this process, into ``store``."""
    from rankexp.cli import cli

    argv = ["rankexp", f"experiment={name}", *overrides,
            f"tracking.uri=sqlite:///{store / 'mlflow.db'}",
            f"hydra.sweep.dir={store / 'multirun' / name / str(time.monotonic_ns())}",
            f"data.root={DEFAULT_ROOT}", f"data.cache_dir={DEFAULT_CACHE_DIR}"]
    if trains(name):
        argv.append(f"task.checkpoint_dir={store / 'ckpt'}")
    monkeypatch.setattr(sys, "argv", [*argv, "-m"])
    try:
        cli()
    except SystemExit as e:  # the rankexp sweeper exits with the sweep's status
        assert e.code in (0, None), f"{name} {overrides}: exit {e.code}"


def run_experiment(name: str, size: str, store: Path, monkeypatch) -> list[str]:
    """All sweeps of ``name`` (and of the experiment its analysis reads) at ``size``; returns
    the experiments now in the store."""
    done = []
    for exp in [e for e in (NEEDS.get(name), name) if e]:
        for overrides in read_plan(exp).sweeps:
            sweep(exp, [f"size={size}", *overrides], store, monkeypatch)
        done.append(exp)
    return done


def check(name: str, size: str, tmp_path: Path, monkeypatch) -> None:
    for k in ("MLFLOW_TRACKING_URI", "RANKEXP_STAMP"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    for exp in run_experiment(name, size, tmp_path, monkeypatch):
        jobs = [r for r in runs_in(f"sqlite:///{tmp_path / 'mlflow.db'}", exp)
                if r.data.tags.get("rankexp.role") != "sweep"]
        assert jobs, f"{exp}: no job runs"
        assert {r.info.status for r in jobs} == {"FINISHED"}, [(r.info.run_name, r.info.status) for r in jobs]
        assert {r.data.params["size"] for r in jobs} == {size}
    plan = read_plan(name)
    assert plan.analyses, f"{name}: its header names no `python -m analysis` command"
    for argv in plan.analyses:
        with recording() as figs:
            rc, text, files = run_analysis(argv, tmp_path)
            assert rc == 0, f"python -m analysis {' '.join(argv)} exited {rc}:\n{text[-3000:]}"
            assert files and all(f.stat().st_size > 0 for f in files), (argv, files)
            for fig in figs:  # publication-ready (tests/figure_checks.py)
                found = problems(fig)
                assert not found, f"{argv[0]}, figure {fig.get_label()}:\n" + "\n".join(found)


def case(name: str, slow: bool = False):
    """One experiment as a test case: slow if asked; skipped if it trains and CIFAR-10 is absent."""
    marks = [pytest.mark.slow] if slow else []
    marks.append(pytest.mark.skipif(trains(name) and not HAVE_CIFAR,
                                    reason=f"{name} trains on CIFAR-10: no {DEFAULT_ROOT / ARCHIVE_NAME}"))
    return pytest.param(name, marks=marks)


@pytest.mark.parametrize("name", [case(e, slow=e in COVERED_ELSEWHERE) for e in EXPERIMENTS])
def test_experiment_runs_at_smoke_size_and_its_analysis_draws(name, tmp_path, monkeypatch):
    check(name, "smoke", tmp_path, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("name", [case(e) for e in REST])
def test_experiment_runs_at_cpu_size_and_its_analysis_draws(name, tmp_path, monkeypatch):
    check(name, "cpu", tmp_path, monkeypatch)


def test_every_command_drawn_here_is_in_a_default_case():
    """The commands only this module draws run in an experiment of the default suite."""
    default = [e for e in EXPERIMENTS if e not in COVERED_ELSEWHERE]
    commands = {argv[0] for e in default for argv in read_plan(e).analyses}
    assert set(DRAWN_HERE) <= commands, set(DRAWN_HERE) - commands
