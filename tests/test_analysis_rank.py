"""Rank figures end to end (Figures 1, 2, 4, 5, 11, 12; Table 4): tiny real sweeps of the
experiment configs through the CLI into a real SQLite store, then the analysis commands
heatmap, profiles, collapse, placements, stream, accumulated, isorank — every figure they
save passes the publication checks of ``figure_checks`` (mathtext labels, caption with d,
seeds and size, page-sized, the promised theory curves).  Numbers in their CSVs are
checked against what MLflow holds (read with MlflowClient, not through ``analysis``),
against closed forms of rankexp.theory recomputed here, and against exact identities of the
model (βα^M symmetry of ReLU; the projection split's products are the Jacobians of other
placements with the same weights).  The fitting functions are unit-tested on synthetic data
with a known power law.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from conftest import REPO, runs_in
from figure_checks import THEORY, checked

from analysis import figures
from analysis.core.registry import default
from analysis.core.runner import commands
from analysis.core.runner import main as analysis_main
from analysis.study.fig1 import kappa_theory
from analysis.study.fig2 import collapse_spread, match_values
from analysis.study.fig5 import contour_points, fit_power_law, uncorrelated_theory
from rankexp.theory import gaussian_expectation


# --------------------------------------------------------------------------- unit: fitting
def test_fit_power_law_recovers_a_known_exponent():
    L = np.array([12, 24, 48, 96, 192])
    s, c, r2 = fit_power_law(L, 3.0 * L**-0.5)
    assert s == pytest.approx(-0.5, abs=1e-12) and math.exp(c) == pytest.approx(3.0)
    assert r2 == pytest.approx(1.0)
    s, *_ = fit_power_law(L, 3.0 * L**-0.25 * np.exp([0.02, 0.0, -0.01, 0.0, 0.01]))
    assert s == pytest.approx(-0.25, abs=0.01) and s != pytest.approx(-0.25, abs=1e-6)
    assert all(math.isnan(v) for v in fit_power_law([12], [1.0]))


def grid(f, alphas, depths) -> pd.DataFrame:
    a, L = np.meshgrid(alphas, depths)
    return pd.DataFrame(f(a, L), index=depths, columns=alphas)


def test_contour_slope_is_exact_where_the_metric_is_linear_in_log_alpha():
    """erank = 0.9 − 0.2 (ln α + ½ ln L), clipped: iso-lines α ∝ L^(−1/2); linear
    interpolation in ln α is exact there, so the slope comes out to rounding."""
    alphas = 2.0 ** np.arange(-3, 3.5, 0.5)
    depths = np.array([12, 24, 48, 96, 192, 384])
    g = grid(
        lambda a, L: np.clip(0.9 - 0.2 * (np.log(a) + 0.5 * np.log(L)), 0.01, 1), alphas, depths
    )
    for level in (0.3, 0.5, 0.7):
        pts = contour_points(g, level)
        assert list(pts.index) == list(depths)
        expected = np.exp((0.9 - level) / 0.2 - 0.5 * np.log(depths))
        np.testing.assert_allclose(pts.values, expected, rtol=1e-12)
        assert fit_power_law(pts.index, pts.values)[0] == pytest.approx(-0.5, abs=1e-12)


def test_contour_slope_of_a_smooth_rank_surface():
    """erank = 1/(1 + α⁴ L/20): a function of α²√L (the Post-Norm depth factor at β = 1,
    M = 2), so d log α / d log L = −1/4 along every contour (within interpolation error)."""
    alphas = 2.0 ** np.arange(-2, 2.01, 0.5)
    depths = np.array([12, 24, 48, 96, 192])
    g = grid(lambda a, L: 1 / (1 + a**4 * L / 20), alphas, depths)
    for level in (0.2, 0.5, 0.8):
        pts = contour_points(g, level)
        assert len(pts) == 5
        assert fit_power_law(pts.index, pts.values)[0] == pytest.approx(-0.25, abs=0.01)


def test_contour_points_skip_rows_that_never_cross_and_take_the_first_crossing():
    g = pd.DataFrame([[0.9, 0.8, 0.7], [0.9, 0.4, 0.6]], index=[10, 20], columns=[1.0, 2.0, 4.0])
    pts = contour_points(g, 0.5)
    assert list(pts.index) == [20]  # row 10 stays above 0.5
    assert pts[20] == pytest.approx(2 ** (0.4 / 0.5))  # 0.9 → 0.4 between α = 1 and 2


def test_collapse_spread_groups_runs_equal_in_x_apart_from_its_ingredients():
    df = pd.DataFrame(
        {
            "norm.placement": ["pre"] * 4 + ["post"] * 2,
            "alpha": [1.0, 2.0, 0.5, 1.0, 1.0, 2.0],
            "beta": [1.0, 0.25, 4.0, 2.0, 1.0, 0.25],
            "nominal_ratio": [1.0, 1.0 + 1e-13, 1.0, 2.0, 1.0, 1.0],
            "erank_io": [0.5, 0.5 + 3e-11, 0.5 - 1e-12, 0.4, 0.2, 0.25],
        }
    )
    s = collapse_spread(df, "erank_io", "nominal_ratio").set_index("norm.placement")
    assert set(s.index) == {"pre", "post"}  # the lone pre run at βα^M = 2 forms no group
    assert s.loc["pre", "runs"] == 3 and s.loc["pre", "spread"] == pytest.approx(3.1e-11)
    assert s.loc["post", "spread"] == pytest.approx(0.05)
    np.testing.assert_array_equal(match_values([1.0, 1.009, 1.02, 4.0], 0.01), [0, 0, 1, 2])


# --------------------------------------------------------------------------- unit: theory overlays
def test_kappa_theory_is_the_second_moment_of_sigma():
    for alpha in (0.5, 1.0, 3.0):
        assert kappa_theory("relu", alpha) == pytest.approx(0.5, rel=1e-10)
        assert kappa_theory("abs", alpha) == pytest.approx(1.0, rel=1e-10)
    # tanh is not homogeneous: E[tanh(αz)²]/α², here by an independent trapezoid rule
    z = np.linspace(-12, 12, 200_001)
    ref = np.trapezoid(np.tanh(2 * z) ** 2 * np.exp(-z * z / 2), z) / math.sqrt(2 * math.pi) / 4
    assert kappa_theory("tanh", 2.0) == pytest.approx(ref, rel=1e-8)
    assert gaussian_expectation(lambda z: z**2) == pytest.approx(1.0)


def test_uncorrelated_prediction_closed_forms():
    k = np.arange(1, 97)
    # post: r_l = √p βα^M at every layer, p = ½ for ReLU
    np.testing.assert_allclose(
        uncorrelated_theory(k, "post", 4.0, "relu", 2.0), 4.0 * np.sqrt(k / 2), rtol=1e-12
    )
    # pre: Eq. 22, summed here term by term
    r, kap, p = 1.0, 0.5, 0.5
    ref = np.sqrt(np.cumsum([p * r**2 / (1 + kap * r**2 * (l - 1)) for l in k]))
    np.testing.assert_allclose(uncorrelated_theory(k, "pre", r, "relu", 1.0), ref, rtol=1e-12)
    # Pre-Norm stays flat: squared sum grows only like (p/κ) log L
    assert ref[-1] ** 2 < (p / kap) * (1 + math.log(96))


# --------------------------------------------------------------------------- the store
@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Four tiny sweeps of the real experiment configs (width 16) in one SQLite store."""
    cwd = tmp_path_factory.mktemp("rank_store")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RANKEXP_STAMP"))}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")

    def sweep(*args: str):
        p = subprocess.run(
            [sys.executable, "-m", "rankexp", *args, "-m"],
            cwd=cwd,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=600,
        )
        assert p.returncode == 0, p.stdout[-4000:]

    sweep("experiment=fig1", "width=16", "depth=8", "seeds=2", "expansion=1,2", "skip_every=0,4")
    # α, β not powers of two: 0.7²·4 and 1.4²·1 round differently, the symmetry is not trivial
    sweep("experiment=fig2", "width=16", "depth=6", "seeds=2", "alpha=0.7,1.4", "beta=1,4")
    sweep(  # the placements grid only (its control grid is test_general_block's)
        "experiment=fig4", "~hydra.sweeper.grids.control", "width=16", "depth=6", "seeds=2",
        "norm.op=rmsnorm,detached", "alpha=2"
    )
    sweep("experiment=fig5", "width=16", "seeds=2", "expansion=1", "depth=4,16", "alpha=0.5,1,2",
          "task.options.stream.inputs=16")  # κ from 16 inputs per seed: see the κ test

    class Store:
        uri = f"sqlite:///{cwd / 'mlflow.db'}"
        out = cwd / "figs"

        def analyse(self, *argv: str, ok: bool = True):
            """Run a command; its figures must pass ``figure_checks`` (returned by stem)."""
            self.figures = {}
            if not ok:
                rc = analysis_main([*argv, "--uri", self.uri, "--out", str(self.out)])
                assert rc != 0, f"analysis {' '.join(argv)} returned 0"
                return rc
            with checked([*argv, "--uri", self.uri, "--out", str(self.out)], THEORY) as (rc, figs):
                assert rc == 0, f"analysis {' '.join(argv)} returned {rc}"
                self.figures = {k: _drawn(f) for k, f in figs.items()}
            return rc

        def runs(self, experiment: str) -> dict:
            return {
                r.info.run_id: r
                for r in runs_in(self.uri, experiment)
                if r.data.tags.get("rankexp.role") != "sweep"
            }

        def history(self, run_id: str, key: str) -> np.ndarray:
            from mlflow.tracking import MlflowClient

            h = sorted(MlflowClient(self.uri).get_metric_history(run_id, key), key=lambda m: m.step)
            return np.array([m.value for m in h])

    s = Store()
    s.out.mkdir()
    return s


def _drawn(fig) -> dict:
    """What tests read off a figure after it is closed: per axes, its error-bar half-lengths
    and its lines' (label, x, y)."""
    from matplotlib.container import ErrorbarContainer

    axes = []
    for ax in fig.axes:
        bars = []
        for c in ax.containers:  # a bar's error bars are an ErrorbarContainer of their own too
            if isinstance(c, ErrorbarContainer) and c.lines[2]:
                bars += [abs(seg[1][1] - seg[0][1]) / 2 for seg in c.lines[2][0].get_segments()]
        lines = [(ln.get_label(), ln.get_xdata(), ln.get_ydata()) for ln in ax.get_lines()]
        axes.append({"errorbars": np.array(bars), "lines": lines, "title": ax.get_title()})
    return {"axes": axes}


def files(out, experiment: str, stem: str) -> list:
    paths = [out / experiment / f"{stem}.{ext}" for ext in ("png", "pdf", "csv")]
    for p in paths:
        assert p.is_file() and p.stat().st_size > 0, p
    return paths


def test_profiles_csv_is_the_logged_per_layer_series(store):
    store.analyse("profiles", "--experiment", "fig1")
    csv = pd.read_csv(files(store.out, "fig1", "profiles_erank_profile")[2])
    runs = store.runs("fig1")
    assert len(runs) == 2 * 2 * 2 and len(csv) == 8 * 8  # 8 cells × L = 8 layers
    for r in runs.values():
        p = r.data.params
        cell = csv[
            (csv["skip_every"] == int(p["skip_every"]))
            & (csv["beta_scaling"] == p["beta_scaling"])
            & (csv["expansion"] == float(p["expansion"]))
        ].sort_values("layer")
        assert list(cell["layer"]) == list(range(1, 9)) and set(cell["runs"]) == {1}
        np.testing.assert_allclose(
            cell["erank_profile"], store.history(r.info.run_id, "erank_profile"), rtol=1e-12
        )
        # the profile ends at the input–output Jacobian: l = L is erank_io
        assert cell["erank_profile"].iloc[-1] == pytest.approx(
            r.data.metrics["erank_io"], rel=1e-12
        )


def test_collapse_is_exact_in_beta_alpha_squared_for_relu(store, capsys):
    store.analyse("collapse", "--experiment", "fig2")
    paths = files(store.out, "fig2", "collapse_erank_io_vs_nominal_ratio")
    table = pd.read_csv(paths[2]).set_index("run_id")
    runs = store.runs("fig2")
    assert len(runs) == 8 and set(table.index) == set(runs)
    for rid, r in runs.items():
        assert table.loc[rid, "erank_io"] == r.data.metrics["erank_io"]
    spread = pd.read_csv(store.out / "fig2" / "collapse_erank_io_vs_nominal_ratio_spread.csv")
    # per placement one group: (α, β) = (0.7, 4) and (1.4, 1), βα² = 1.96
    assert sorted(spread["norm.placement"]) == ["post", "pre"] and set(spread["runs"]) == {2}
    assert (spread["nominal_ratio"] - 1.96).abs().max() < 1e-12
    for pl in ("pre", "post"):
        pair = [
            r.data.metrics["erank_io"]
            for r in runs.values()
            if r.data.params["norm.placement"] == pl
            and round(float(r.data.params["nominal_ratio"]), 9) == 1.96
        ]
        assert len(pair) == 2 and abs(pair[0] - pair[1]) < 1e-10  # exact up to rounding
        row = spread[spread["norm.placement"] == pl].iloc[0]
        assert row["spread"] == pytest.approx(abs(pair[0] - pair[1]), abs=1e-15)
    assert "max spread" in capsys.readouterr().out


def test_placements_table_and_projection_split_identities(store):
    store.analyse("placements", "--experiment", "fig4", "--all")
    table = pd.read_csv(files(store.out, "fig4", "placements_erank_io")[2])
    runs = list(store.runs("fig4").values())
    assert len(runs) == 4 * 2

    def io(placement, op, alpha):
        return [
            r.data.metrics["erank_io"]
            for r in runs
            if r.data.params["norm.placement"] == placement
            and r.data.params["norm.op"] == op
            and float(r.data.params["alpha"]) == alpha
        ]

    def per_seed(placement, op, alpha) -> list:
        """Each seed's erank_io, from the runs' arrays.npz (not through analysis)."""
        from mlflow.tracking import MlflowClient

        out = []
        for r in runs:
            p = r.data.params
            if (p["norm.placement"], p["norm.op"], float(p["alpha"])) == (placement, op, alpha):
                path = MlflowClient(store.uri).download_artifacts(r.info.run_id, "arrays.npz")
                out += list(np.load(path)["erank_io"])
        return out

    for _, row in table.iterrows():
        placement, _, op = row["config"].partition("/")
        values = io(placement, op or "rmsnorm", row["alpha"]) + (
            io(placement, "detached", row["alpha"]) if placement == "none" else []
        )
        assert row["mean"] == pytest.approx(np.mean(values), rel=1e-12)
        # the error bar is the spread over the bar's seeds, not over its runs (one run here)
        seeds = per_seed(placement, op or "rmsnorm", row["alpha"]) + (
            per_seed(placement, "detached", row["alpha"]) if placement == "none" else []
        )
        assert row["seeds"] == len(seeds) == 2 * (2 if placement == "none" else 1)
        assert row["std"] == pytest.approx(np.std(seeds, ddof=1), rel=1e-9) and row["std"] > 0
    # a log axis carries no error bars (issue 19.5); the seed spread is the table's (above)
    assert len(store.figures["placements_erank_io"]["axes"][0]["errorbars"]) == 0
    split = pd.read_csv(store.out / "fig4" / "projection_split.csv")
    assert sorted(split["norm.op"].unique()) == ["detached", "rmsnorm"]
    for _, row in split.iterrows():
        a, op = row["alpha"], row["norm.op"]
        # the split walks the post product itself: it must agree with the forward sweep
        assert row["erank_post"] == pytest.approx(io("post", op, a)[0], abs=1e-9)
        # same weights with R = identity is the norm=none network, op moved before the
        # branch is the Pre-Norm network: other runs of the sweep, computed independently
        assert row["erank_unnormalized"] == pytest.approx(io("none", op, a)[0], abs=1e-9)
        assert row["erank_prenorm"] == pytest.approx(io("pre", op, a)[0], abs=1e-9)
    detached = split[split["norm.op"] == "detached"]
    assert detached["rank_removed_by_projection"].abs().max() < 1e-9  # no projection at all


def test_stream_kappa_table_matches_logs_and_theory(store):
    store.analyse("stream", "--experiment", "fig5")
    per_run = pd.read_csv(files(store.out, "fig5", "stream_kappa")[2]).set_index("run_id")
    runs = {k: r for k, r in store.runs("fig5").items() if r.data.params["norm.placement"] == "pre"}
    assert set(per_run.index) == set(runs) and len(runs) == 6
    for rid, r in runs.items():
        row, m = per_run.loc[rid], r.data.metrics
        assert row["kappa_fit"] == m["stream_kappa"] and row["rms_final"] == m["rms_final"]
        assert row["kappa_theory"] == pytest.approx(0.5, rel=1e-10)  # ReLU: E[σ(z)²] = ½
        ratio = float(r.data.params["nominal_ratio"])
        L = int(r.data.params["depth"])
        assert row["rms_final_theory"] == pytest.approx(math.sqrt(1 + 0.5 * ratio**2 * L))
    series = pd.read_csv(store.out / "fig5" / "stream_series.csv")
    assert (series.loc[series["layer"] == 0, "y"] == 0).all()
    # at βα² = 4 the branch energy dominates the input's: the fit is close to κ = ½.  How close:
    # at d = 16 the fitted κ of a mean over 2 seeds scatters by s.d. 0.075 (L = 4 and 16, 16
    # inputs per seed; weight noise: 64 inputs do not shrink it; one input: 0.12–0.15), so ½ ± 0.3
    # is a 4 s.d. bound (the ± 0.2 of one input per seed was 1.1–1.7 s.d.: a tenth to a quarter
    # of draws failed it)
    big = per_run[per_run["nominal_ratio"] == 4.0]
    assert big["kappa_fit"].between(0.2, 0.8).all()


def test_accumulated_branch_csv_and_depth_scaling(store):
    store.analyse("accumulated", "--experiment", "fig5")
    table = pd.read_csv(files(store.out, "fig5", "accumulated_branch")[2])
    runs = store.runs("fig5")
    assert set(table["run_id"]) == set(runs)
    for rid, r in runs.items():
        t = table[table["run_id"] == rid].sort_values("k")
        L = int(r.data.params["depth"])
        assert list(t["k"]) == list(range(1, L + 1))
        assert t["accumulated"].iloc[-1] == pytest.approx(
            r.data.metrics["accumulated_branch_final"], rel=1e-12
        )
        np.testing.assert_allclose(
            t["uncorrelated"], store.history(rid, "accumulated_branch_uncorrelated"), rtol=1e-12
        )
        if r.data.params["norm.placement"] == "post":
            ratio = float(r.data.params["nominal_ratio"])
            np.testing.assert_allclose(t["theory"], ratio * np.sqrt(t["k"] / 2), rtol=1e-12)
            # fully coherent: every block's ‖βJ_l‖_F/‖I‖_F = √p βα^M adds in one direction
            np.testing.assert_allclose(t["coherent"], ratio * t["k"] / math.sqrt(2), rtol=1e-12)
        # triangle inequality, per seed and so for the mean: ‖Σ βJ_l‖ ≤ Σ ‖βJ_l‖ (coherent)
        coherent = np.cumsum(store.history(rid, "branch_ratio"))
        assert (t["accumulated"].to_numpy() <= coherent * (1 + 1e-9)).all()
    # Post-Norm: the sum grows like √L (measured, not the overlay)
    final = table.sort_values("k").groupby("run_id").tail(1)
    post = final[(final["norm.placement"] == "post") & (final["alpha"] == 1.0)]
    slope = np.polyfit(np.log(post["depth"]), np.log(post["accumulated"]), 1)[0]
    assert slope == pytest.approx(0.5, abs=0.15)


def test_branch_ratio_profile_against_eq_22(store):
    """``profiles --metric branch_ratio``: the dashed theory is √p r̃_l of Eq. 22 (Pre-Norm)
    and √p βα^M (Post-Norm), recomputed here; the measured post ratio sits on it."""
    store.analyse(
        "profiles", "--experiment", "fig5", "--metric", "branch_ratio",
        "--rows", "norm.placement", "--cols", "expansion", "--hue", "alpha",
    )  # fmt: skip
    csv = pd.read_csv(files(store.out, "fig5", "profiles_branch_ratio")[2])
    assert set(csv["layer"]) == set(range(1, 17))  # the deepest runs (L = 16) only
    for (pl, a), g in csv.groupby(["norm.placement", "alpha"]):
        r, l = a**2, g["layer"].to_numpy()  # βα^M at β = 1, M = 2; ReLU: p = κ = ½
        ratio = r / np.sqrt(1 + 0.5 * r**2 * (l - 1)) if pl == "pre" else np.full(l.shape, r)
        expect = math.sqrt(0.5) * ratio
        np.testing.assert_allclose(g["theory"], expect, rtol=1e-12)
        if pl == "post":
            assert g["branch_ratio"].mean() == pytest.approx(expect.mean(), rel=0.25)
    lines = [ln for ax in store.figures["profiles_branch_ratio"]["axes"] for ln in ax["lines"]]
    assert sum(1 for label, *_ in lines if label.startswith("_")) >= 2 * 3 * 2  # data + theory


def test_heatmap_of_fig2_over_alpha_and_beta(store):
    store.analyse("heatmap", "--experiment", "fig2", "--x", "alpha", "--y", "beta", "--log-color")
    table = pd.read_csv(files(store.out, "fig2", "heatmap_erank_io_beta_x_alpha")[2])
    runs = store.runs("fig2")
    assert table["count"].sum() == len(runs) == 8
    titles = [ax["title"] for ax in store.figures["heatmap_erank_io_beta_x_alpha"]["axes"]]
    assert titles[:2] == ["Pre-Norm", "Post-Norm"]  # the study's order, named as in the field


def test_isorank_points_are_interpolated_from_the_logged_ranks(store, capsys):
    store.analyse("isorank", "--experiment", "fig5", "--levels", "0.3,0.5,0.7")
    slopes = pd.read_csv(files(store.out, "fig5", "isorank_erank_io")[2])
    points = pd.read_csv(store.out / "fig5" / "isorank_erank_io_points.csv")
    assert (store.out / "fig5" / "isorank_erank_io.md").is_file()
    assert len(slopes) == 2 * 3  # (pre, post) × 3 levels, m/d = 1
    assert "slope_ratio" in capsys.readouterr().out
    logged = {
        (
            r.data.params["norm.placement"],
            int(r.data.params["depth"]),
            float(r.data.params["alpha"]),
        ): r.data.metrics["erank_io"]
        for r in store.runs("fig5").values()
    }
    for _, p in points.iterrows():
        v = [logged[(p["norm.placement"], p["depth"], a)] for a in (0.5, 1.0, 2.0)]
        # independent: the first bracketing pair, interpolated linearly in ln α
        j = next(j for j in range(2) if (v[j] - p["level"]) * (v[j + 1] - p["level"]) <= 0)
        t = (v[j] - p["level"]) / (v[j] - v[j + 1])
        assert p["alpha"] == pytest.approx(0.5 * 2 ** (j + t), rel=1e-12)
        assert p["ratio"] == pytest.approx(p["alpha"] ** 2, rel=1e-12)  # β = 1, M = 2
    for (pl, level), g in points.groupby(["norm.placement", "level"]):
        row = slopes[(slopes["norm.placement"] == pl) & (slopes["level"] == level)].iloc[0]
        assert row["points"] == len(g)
        if len(g) >= 2:
            ref = np.polyfit(np.log(g["depth"]), np.log(g["alpha"]), 1)[0]
            assert row["slope_alpha"] == pytest.approx(ref, rel=1e-9)
            assert row["slope_ratio"] == pytest.approx(2 * ref, rel=1e-9)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["profiles", "--experiment", "nope"], "no experiment named ['nope']"),
        (["stream", "--experiment", "fig1"], "'stream_kappa'] (was the probe"),
        (
            [
                "profiles",
                "--experiment",
                "fig2",
                "--rows",
                "width",
                "--cols",
                "norm.placement",
                "--hue",
                "beta",
                "--metric",
                "rms",
            ],
            "has no series 'rms'",
        ),
        (["collapse", "--experiment", "fig2", "--color", "sideways"], "no column(s) ['sideways']"),
        (
            ["isorank", "--experiment", "fig5", "--where", "depth=1000"],
            "no run of ['fig5'] has depth",
        ),
        (["accumulated", "--experiment", "fig2"], "accumulated_branch_final"),
    ],
)
def test_clear_errors(store, capsys, argv, message):
    store.analyse(*argv, ok=False)
    assert message in capsys.readouterr().err


# --------------------------------------------------------------------------- make figures
def test_the_registry_gives_the_plan():
    reg = default()
    names = [e.id for e in figures.experiments()]
    assert names == [e.id for e in reg if e.reproduce] and "demo" not in names  # not a figure
    for entry in figures.experiments():
        assert entry.analyses, entry.id
        for argv in entry.argvs():
            assert argv[0] in commands(), (entry.id, argv)
    assert [e.id for e in figures.experiments(["fig6_train"])] == ["fig6", "fig6_train"]  # reads
    assert figures.merge_overrides(["width=64", "seeds=4"], ["seeds=1", "+x=2"]) == [
        "width=64",
        "seeds=1",
        "+x=2",
    ]


def test_make_figures_dry_run_lists_every_experiment_once(capsys):
    assert figures.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    for entry in figures.experiments():
        assert out.count(f"python -m rankexp experiment={entry.id} size=cpu -m") == 1, entry.id
    assert "python -m analysis isorank --experiment fig5 --uri" in out


@pytest.mark.slow
def test_make_figures_runs_a_sweep_and_draws_it(tmp_path, monkeypatch, capsys):
    for k in [k for k in os.environ if k.startswith(("MLFLOW_", "RANKEXP_STAMP"))]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    rc = figures.main(
        [
            "--only",
            "fig1",
            "--out",
            str(tmp_path),
            "--extra",
            "width=8",
            "depth=3",
            "seeds=1",
            "expansion=1",
            "skip_every=1",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "| fig1 | ok |" in out and (tmp_path / "summary.md").is_file()
    assert (tmp_path / "fig1" / "profiles_erank_profile.png").is_file()
    runs = [
        r
        for r in runs_in(f"sqlite:///{tmp_path / 'mlflow.db'}", "fig1")
        if r.data.tags.get("rankexp.role") != "sweep"
    ]
    assert len(runs) == 2 and {r.data.params["width"] for r in runs} == {"8"}


# --------------------------------------------------------------------------- Table 4, reduced
@pytest.mark.slow
def test_post_norm_iso_rank_slope_is_minus_one_half_in_beta_alpha_m(cli):
    """Table 4 at reduced size (d = 64): along iso-rank contours of Post-Norm,
    d log(βα^M) / d log L ≈ −0.5 (i.e. rank is a function of βα^M √L)."""
    cli(
        "experiment=fig5",
        "norm=post",
        "expansion=1",
        "width=64",
        "seeds=2",
        "depth=12,24,48,96,192",
        "task.probes=[io_jacobian]",
        "-m",
    )
    cli(
        "isorank", "--experiment", "fig5", "--levels", "0.3,0.5", "--out", "figs", module="analysis"
    )
    slopes = pd.read_csv(cli.cwd / "figs" / "fig5" / "isorank_erank_io.csv")
    assert (slopes["points"] == 5).all()
    assert slopes["slope_ratio"].between(-0.65, -0.4).all(), slopes
