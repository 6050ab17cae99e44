"""Every mean-field experiment at ``size=smoke`` as a user runs it (``rankexp experiment=<id>
size=smoke -m``: every grid — mf_spectrum's three activations, mf_bn's β = 1/√L) into its own
SQLite store (the session's smoke stores, shared with test_analysis_experiments), then its
analysis command; the drawn tables are checked against MLflow (read with MlflowClient) and
against theory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import runs_in
from figure_checks import checked
from mlflow.tracking import MlflowClient

from analysis.core.registry import default
from rankexp import theory
from rankexp.tasks.data import ARCHIVE_NAME, DEFAULT_ROOT

#: the mean-field chapter's experiments (its part of the registry)
EXPERIMENTS = [e.id for e in default() if e.part == "meanfield"]
HAVE_CIFAR = (DEFAULT_ROOT / ARCHIVE_NAME).is_file()
#: the theory each figure promises in its legends (figure stem → substrings)
MF_THEORY = {
    "mf_phase": [r"critical line $\chi_1 = 1$", "measured = theory"],
    "mf_relu_collapse": [r"9\pi^2", "exact map"],
    "mf_spectrum": ["theory"],
    "mf_bn": ["Yang et al.", r"(3/4)^L"],
    "mf_residual": ["ODE limit", r"\dot c"],
    "mf_trainability": [r"6\,\xi_c", r"critical $\chi_1 = 1$"],
    "deep_linear": ["asymptote"],
}


@pytest.fixture(scope="module")
def stores(smoke_store) -> Path:
    """The folder holding one smoke store per mean-field experiment (``<root>/<id>/mlflow.db``)."""
    todo = [e for e in EXPERIMENTS if e != "mf_trainability" or HAVE_CIFAR]
    return [smoke_store(e) for e in todo][0].parent


def uri(stores: Path, experiment: str) -> str:
    return f"sqlite:///{stores / experiment / 'mlflow.db'}"


def job_runs(stores: Path, experiment: str):
    runs = [r for r in runs_in(uri(stores, experiment), experiment)
            if r.data.tags.get("rankexp.role") != "sweep"]
    assert runs and {r.info.status for r in runs} == {"FINISHED"}
    return runs


def draw(stores: Path, capsys, experiment: str, *extra: str) -> Path:
    """``python -m analysis <experiment> -e <experiment>``; asserts PNG, PDF and CSV exist and
    every figure passes :func:`figure_checks.problems` with its theory curves in the legend."""
    out = stores / "figs"
    capsys.readouterr()
    argv = [experiment, "-e", experiment, "--uri", uri(stores, experiment), "--out", str(out), *extra]
    with checked(argv, MF_THEORY) as (rc, _):  # every figure passes the publication checks
        text = capsys.readouterr()
        assert rc == 0, text.out + text.err
    folder = out / experiment
    for ext in ("png", "pdf", "csv"):
        assert (folder / f"{experiment}.{ext}").stat().st_size > 0, ext
    return folder


def test_mf_phase(stores, capsys):
    runs = job_runs(stores, "mf_phase")
    assert len(runs) == 4 and all(r.data.params["model.name"] == "plain" for r in runs)
    t = pd.read_csv(draw(stores, capsys, "mf_phase", "--theory-resolution", "6") / "mf_phase.csv")
    client = MlflowClient(uri(stores, "mf_phase"))
    for r in runs:
        sw2, sb2 = float(r.data.params["alpha"]) ** 2, float(r.data.params["bias"]) ** 2
        row = t[np.isclose(t["sigma_w2"], sw2) & np.isclose(t["sigma_b2"], sb2)]
        assert row["chi1"].item() == pytest.approx(r.data.metrics["chi1"])
        q = theory.length_fixed_point("tanh", sw2, sb2)
        assert row["chi1_theory"].item() == pytest.approx(theory.chi_1("tanh", sw2, q), rel=1e-9)
        hist = client.get_metric_history(r.info.run_id, "mf_c")
        assert sorted(m.step for m in hist) == list(range(int(r.data.params["depth"]) + 1))


def test_mf_relu_collapse(stores, capsys):
    runs = job_runs(stores, "mf_relu_collapse")
    t = pd.read_csv(draw(stores, capsys, "mf_relu_collapse") / "mf_relu_collapse.csv")
    client = MlflowClient(uri(stores, "mf_relu_collapse"))
    for r in runs:
        c0 = float(r.data.params["task.options.correlation.c0"])
        g = t[np.isclose(t["c0"], c0)].sort_values("layer")
        measured = {m.step: m.value for m in client.get_metric_history(r.info.run_id, "mf_c")}
        assert np.allclose(g["gap"], [1 - measured[int(l)] for l in g["layer"]])
        assert np.allclose(g["gap_exact"], 1 - theory.relu_correlation_iterates(c0, len(g))[1:])


def test_mf_spectrum(stores, capsys):
    runs = job_runs(stores, "mf_spectrum")
    assert {r.data.params["activation"] for r in runs} == {"linear", "relu", "tanh"}  # its 3 grids
    assert len(runs) == 3 * 2 * 2  # × gaussian/orthogonal × 2 depths
    folder = draw(stores, capsys, "mf_spectrum")
    t = pd.read_csv(folder / "mf_spectrum.csv").set_index(["activation", "init", "depth"])
    assert abs(t.loc[("linear", "orthogonal"), "lambda_var"]).max() < 1e-10
    assert np.allclose(t.loc[("linear", "gaussian"), "lambda_var_theory"],
                       t.loc[("linear", "gaussian")].index)
    assert np.allclose(t.loc[("relu", "orthogonal"), "lambda_var_theory"],
                       t.loc[("relu", "orthogonal")].index)  # L (0 + 1)
    table = (folder / "mf_spectrum.md").read_text()
    assert all(f"| {a} | {i} |" in table for a in ("linear", "relu", "tanh")
               for i in ("gaussian", "orthogonal"))


def test_mf_bn(stores, capsys):
    runs = job_runs(stores, "mf_bn")
    assert len(runs) == 12  # (none, pre) × (plain, residual β = 1, residual β = 1/√L) × 2 depths
    t = pd.read_csv(draw(stores, capsys, "mf_bn") / "mf_bn.csv")
    assert {"plain", "plain + BN", "residual (β = 1)", "residual + BN (β = 1)",
            "residual (β = 1/√L)", "residual + BN (β = 1/√L)"} == set(t["arch"])
    by_id = {(r.data.params["skip_every"], r.data.params["norm.placement"],
              r.data.params["beta_scaling"], r.data.params["depth"]): r.data.metrics for r in runs}
    row = t[(t["arch"] == "plain + BN") & (t["depth"] == 4)]
    assert row["grad_ratio"].item() == pytest.approx(by_id[("0", "pre", "const", "4")]["grad_ratio"])


def test_mf_residual(stores, capsys):
    job_runs(stores, "mf_residual")
    t = pd.read_csv(draw(stores, capsys, "mf_residual") / "mf_residual.csv")
    for _, g in t.groupby(["beta_scaling", "depth"]):
        beta = g["beta"].iloc[0]
        assert np.allclose(g["q_theory"], g["q"].iloc[0] * (1 + beta**2) ** g["layer"])
    assert set(t["beta"].round(6)) >= {1.0, round(1 / np.sqrt(8), 6)}


@pytest.mark.skipif(not HAVE_CIFAR, reason=f"no {DEFAULT_ROOT / ARCHIVE_NAME}")
def test_mf_trainability(stores, capsys):
    runs = job_runs(stores, "mf_trainability")
    t = pd.read_csv(draw(stores, capsys, "mf_trainability") / "mf_trainability.csv")
    for r in runs:
        sw2, depth = float(r.data.params["alpha"]) ** 2, int(r.data.params["depth"])
        row = t[np.isclose(t["sigma_w2"], sw2) & (t["depth"] == depth)]
        assert row["best_test_accuracy"].item() == pytest.approx(r.data.metrics["best_test_accuracy"])
        assert row["six_xi_c"].item() == pytest.approx(
            6 * theory.correlation_depth_scale("tanh", sw2, 0.05).xi_c, rel=1e-9)


def test_deep_linear(stores, capsys):
    runs = job_runs(stores, "deep_linear")
    assert sorted(float(r.data.params["task.options.deep_linear.s"]) for r in runs) == [1.0, 4.0]
    t = pd.read_csv(draw(stores, capsys, "deep_linear") / "deep_linear.csv")
    for _, row in t.iterrows():
        assert row["T_quad"] == pytest.approx(theory.deep_linear_time(int(row["N"]), row["a0"], row["s"]),
                                              rel=1e-12)
    sim = t.dropna(subset=["T_sim"])
    assert len(sim) == 2 and np.allclose(sim["T_sim"], sim["T_quad"], rtol=1e-6)


def test_the_console_has_no_third_party_bars_or_font_notes(stores, capsys, caplog):
    """Issue 19 item 6: ``mf_spectrum`` downloads every run's arrays (MLflow drew a
    "Downloading artifacts" bar per run) and ``mf_relu_collapse`` sets ``\\ell`` (matplotlib
    logged "Substituting symbol \\ell" at INFO): neither reaches the console."""
    import logging

    from analysis.core.runner import main as analysis_main

    for experiment in ("mf_spectrum", "mf_relu_collapse"):
        capsys.readouterr()
        with caplog.at_level(logging.INFO):
            rc = analysis_main([experiment, "-e", experiment, "--uri", uri(stores, experiment),
                                "--out", str(stores / "console")])
        text = capsys.readouterr()
        assert rc == 0, text.err
        assert "Downloading artifacts" not in text.out + text.err
        assert not [r for r in caplog.records if "Substituting symbol" in r.getMessage()]
