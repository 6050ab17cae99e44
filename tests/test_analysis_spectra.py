"""Figures 3, 7, 8/9 and Tables 1, 6 end to end: a tiny real sweep of each experiment config
through ``python -m rankexp`` into one scratch SQLite store, then its analysis command through
``analysis.__main__.main`` (what ``python -m analysis`` exits with, run in-process: interpreter
start-up is most of a tiny command's time).  Every number checked in a CSV is compared with what
MLflow holds (read with MlflowClient, not through ``analysis``) or with a closed form, and every
figure saved passes the publication checks of ``figure_checks`` (mathtext labels, caption with
d, seeds and size, page-sized, its theory curves named: Binomial path profile, 1/π and c_σ,
Marchenko–Pastur, the Gaussian product, 1/c)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import REPO, runs_in
from figure_checks import THEORY, checked
from mlflow.tracking import MlflowClient

from rankexp.theory import marchenko_pastur_density


class Store:
    """One scratch directory and SQLite store shared by this module's sweeps (one experiment
    each), so MLflow's schema migration runs once."""

    def __init__(self, root: Path):
        self.cwd, self.uri = root, f"sqlite:///{root / 'mlflow.db'}"

    def sweep(self, experiment: str, *overrides: str, config: bool = True) -> list:
        """Run ``experiment=<experiment>`` (or, ``config=False``, plain runs logged to that
        MLflow experiment) with ``overrides`` as a multirun; its finished job runs."""
        first = f"experiment={experiment}" if config else f"tracking.experiment={experiment}"
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RANKEXP_STAMP"))
        }
        env["PYTHONPATH"] = str(REPO)
        p = subprocess.run(
            [sys.executable, "-m", "rankexp", first, *overrides, "-m"],
            cwd=self.cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=600,
        )
        assert p.returncode == 0, p.stdout[-4000:]
        runs = [
            r for r in runs_in(self.uri, experiment) if r.data.tags.get("rankexp.role") != "sweep"
        ]
        assert runs and all(r.info.status == "FINISHED" for r in runs)
        return runs

    def analyse(self, capsys, command: str, experiment: str, *extra: str) -> tuple[int, str]:
        """``python -m analysis command --experiment … --uri … --out figs …`` → (status, output)."""
        capsys.readouterr()
        argv = [command, "--experiment", experiment, "--uri", self.uri,
                "--out", str(self.cwd / "figs"), *extra]  # fmt: skip
        with checked(argv, THEORY) as (rc, _):
            pass
        out = capsys.readouterr()
        return rc, out.out + out.err

    def history(self, run_id: str, key: str) -> dict[int, float]:
        return {m.step: m.value for m in MlflowClient(self.uri).get_metric_history(run_id, key)}


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Store:
    return Store(tmp_path_factory.mktemp("spectra"))


def files(folder: Path, stem: str, exts=("png", "pdf", "csv")) -> bool:
    return all((folder / f"{stem}.{ext}").is_file() for ext in exts)


def test_paths_profile_and_mean_order_against_the_uncorrelated_closed_form(store, capsys):
    runs = store.sweep("fig3", "width=64", "seeds=4", "alpha=0.5,1", "beta_scaling=const,inv_depth")
    rc, _ = store.analyse(capsys, "paths", "fig3")
    out = store.cwd / "figs" / "fig3"
    assert rc == 0 and files(out, "paths_profile") and files(out, "paths_mean_order")
    summary = pd.read_csv(out / "paths_mean_order.csv").set_index("run_id")
    profile = pd.read_csv(out / "paths_profile.csv")
    assert set(summary.index) == {r.info.run_id for r in runs}
    for r in runs:
        row, m = summary.loc[r.info.run_id], r.data.metrics
        for key in ("mean_path_order", "mean_path_order_energy", "path_order_peak"):
            assert row[key] == pytest.approx(m[key], rel=1e-12)
        # Pre-Norm ReLU, uncorrelated paths: Poisson-binomial with success probabilities
        # ρ_l/(1+ρ_l), ρ_l = p r̃_l² = ½ R²/(1 + ½ R² (l−1)) (Eq. 22, p = κ = ½): mean Σ_l ρ_l/(1+ρ_l)
        R, L = float(r.data.params["nominal_ratio"]), int(r.data.params["depth"])
        rho = 0.5 * R**2 / (1 + 0.5 * R**2 * np.arange(L))
        assert row["mean_path_order_energy_theory"] == pytest.approx(
            (rho / (1 + rho)).sum(), rel=1e-9
        )
        if R == 1.0:  # β = α = 1: the profile peaks at order 3 (Figure 3), ⟨k⟩ near the prediction
            assert round(row["path_order_peak"]) == 3
            assert row["mean_path_order_energy"] == pytest.approx(
                row["mean_path_order_energy_theory"], rel=0.15
            )  # seeds spread ±10 % at d = 64
        p = profile[profile.run_id == r.info.run_id].set_index("k")["profile"]
        assert p.to_dict() == pytest.approx(store.history(r.info.run_id, "path_profile"), rel=1e-12)
        assert p.sum() == pytest.approx(1.0, rel=1e-9)


def test_spike_cosines_against_table1_coherence(store, capsys):
    runs = store.sweep(
        "fig7",
        "width=32",
        "depth=16",
        "seeds=1",
        "activation=relu",
        "task.options.representation.n=128",
    )
    assert len(runs) == 2  # M = 1, 2
    rc, _ = store.analyse(capsys, "spike", "fig7")
    out = store.cwd / "figs" / "fig7"
    assert rc == 0 and files(out, "spike")
    t = pd.read_csv(out / "spike.csv").set_index(["matrices", "activation", "n"])
    for r in runs:
        row = t.loc[(int(r.data.params["matrices"]), "relu", 128)]
        for key in (
            "branch_input_cos_cross",
            "branch_mean_cos_cross",
            "branch_mean_sum_exponent",
            "rep_erank_final",
        ):
            assert row[key] == pytest.approx(r.data.metrics[key], rel=1e-12)
    m1, m2 = t.loc[(1, "relu", 128)], t.loc[(2, "relu", 128)]
    # M = 1: cross-layer cosine = c = 1/π (Table 1); M = 2: ≈ 0, and the prediction is 0
    assert m1["c_prediction"] == pytest.approx(1 / math.pi, abs=1e-3)
    assert m1["branch_input_cos_cross"] == pytest.approx(1 / math.pi, abs=0.03)
    assert m2["c_prediction"] == 0.0
    assert abs(m2["branch_input_cos_cross"]) < 0.05
    # aligned means add up ∝ l, random ones ∝ √l
    assert m1["branch_mean_sum_exponent"] > 0.9 and m2["branch_mean_sum_exponent"] < 0.7


def test_mp_erank_table_and_histograms_from_the_artifacts(store, capsys):
    runs = store.sweep("fig8", "width=32", "seeds=4", "activation=relu,abs", "expansion=1,4")
    rc, _ = store.analyse(capsys, "mp", "fig8", "--reference-draws", "1")
    out = store.cwd / "figs" / "fig8"
    assert rc == 0 and files(out, "mp_erank") and files(out, "mp_histograms_d32")
    t = pd.read_csv(out / "mp_erank.csv").set_index(["activation", "width", "expansion"])
    for r in runs:
        p = r.data.params
        row = t.loc[(p["activation"], int(p["width"]), float(p["expansion"]))]
        for key in ("erank_branch", "mp_gamma", "mp_ks", "masked_rank", "erank_branch_reference"):
            assert row[key] == pytest.approx(r.data.metrics[key], rel=1e-12)
    # full rank of D W_up from m/d = 1/P(σ′≠0): 2 for ReLU, 1 for abs; γ = p·m/d
    assert t.loc[("relu", 32, 1.0), "threshold_expansion"] == pytest.approx(2.0, rel=1e-12)
    assert t.loc[("abs", 32, 1.0), "threshold_expansion"] == pytest.approx(1.0, rel=1e-12)
    assert t.loc[("relu", 32, 4.0), "mp_gamma"] == pytest.approx(2.0, rel=1e-12)
    hist = pd.read_csv(out / "mp_histograms_d32.csv")
    assert set(zip(hist["activation"], hist["expansion"], strict=True)) == {
        (a, e) for a in ("relu", "abs") for e in (1.0, 4.0)
    }
    by_id = {r.info.run_id: r for r in runs}
    for run_id, h in hist.groupby("run_id"):
        dst = store.cwd / run_id
        dst.mkdir()
        local = MlflowClient(store.uri).download_artifacts(run_id, "arrays.npz", str(dst))
        with np.load(local) as z:
            assert h["center"].to_numpy() == pytest.approx(z["mp_hist_centers"], rel=1e-12)
            assert h["density"].to_numpy() == pytest.approx(z["mp_hist_density"], rel=1e-12)
        gamma = by_id[run_id].data.metrics["mp_gamma"]
        assert h["theory"].to_numpy() == pytest.approx(
            marchenko_pastur_density(h["center"].to_numpy(), gamma), rel=1e-12
        )


def test_table1_constants_and_measured_stable_rank(store, capsys):
    runs = store.sweep("tab1", "seeds=2", "width=128", "activation=relu,abs,tanh")
    rc, printed = store.analyse(capsys, "table1", "tab1")
    out = store.cwd / "figs" / "tab1"
    assert rc == 0 and (out / "table1.md").read_text().strip() in printed
    t = pd.read_csv(out / "table1.csv").set_index("activation")
    assert list(t.index) == ["abs", "relu", "tanh"]  # Table 1's order
    assert t.loc["relu", "c"] == pytest.approx(1 / math.pi, abs=1e-8)
    assert t.loc["relu", "1/c"] == pytest.approx(math.pi, abs=1e-7)
    assert t.loc["abs", "c"] == pytest.approx(2 / math.pi, abs=1e-8)
    assert t.loc["relu", "p"] == pytest.approx(0.5, abs=1e-8)
    assert t.loc["relu", "κ"] == pytest.approx(0.5, abs=1e-8)
    assert t.loc["abs", "P(σ′≠0)"] == pytest.approx(1.0, abs=1e-8)
    assert t.loc["tanh", "c"] == 0 and math.isinf(t.loc["tanh", "1/c"])
    assert math.isnan(t.loc["tanh", "stable_rank/(1/c)"])
    for r in runs:
        row = t.loc[r.data.params["activation"]]
        assert row["stable_rank"] == pytest.approx(r.data.metrics["hidden_stable_rank"], rel=1e-12)
    # measured stable rank of σ(W h) within 6 % of the spike bound 1/c (n = 2048, m = 512)
    for act in ("relu", "abs"):
        assert t.loc[act, "stable_rank/(1/c)"] == pytest.approx(1.0, abs=0.06)
    assert t.loc["tanh", "stable_rank"] > 10  # no spike: nothing holds the stable rank near 1
    # these runs hold only activation_spike: every other command names the probe it needs
    for command, probe, column in (
        ("paths", "path_order", "mean_path_order"),
        ("spike", "representation", "branch_input_cos_cross"),
        ("mp", "branch_jacobian", "erank_branch"),
        ("table6", "representation", "rep_erank_final"),
    ):
        rc, printed = store.analyse(capsys, command, "tab1")
        assert rc == 2 and f"task.probes=[{probe}]" in printed and column in printed, command


def test_table6_reads_the_rep_erank_series(store, capsys):
    runs = store.sweep(
        "tab6", "width=16,32", "depth=64", "seeds=1", "task.options.representation.n=128"
    )
    rc, printed = store.analyse(capsys, "table6", "tab6", "--layers", "16", "64", "512")
    out = store.cwd / "figs" / "tab6"
    assert rc == 0 and files(out, "table6", ("png", "pdf", "csv", "md"))
    assert "| 1 | relu | 16 |" in printed
    t = pd.read_csv(out / "table6.csv").set_index(["matrices", "activation", "d"])
    assert list(t.columns) == ["l=16", "l=64"]  # l = 512 is deeper than the runs
    for r in runs:
        logged = store.history(r.info.run_id, "rep_erank")
        row = t.loc[(1, "relu", int(r.data.params["width"]))]
        assert row["l=16"] == pytest.approx(logged[16], rel=1e-12)
        assert row["l=64"] == pytest.approx(logged[64], rel=1e-12)
        assert row["l=64"] < row["l=16"]  # the one-matrix representation collapses with depth


def test_an_unknown_experiment_is_a_clear_error(store, capsys):
    for command in ("paths", "spike", "mp", "table1", "table6"):
        rc, printed = store.analyse(capsys, command, "nope")
        assert rc == 2 and "no experiment named ['nope']" in printed, command
