"""``python -m analysis report``: over a real store with two experiments (tiny real sweeps of
fig4 and tab1) the self-contained HTML renders in headless Chromium, every embedded figure
loads, the claims table has one row per registered claim and its verdicts are those of
claims.csv; over stores of crafted runs a claim meant to hold holds, one meant to fail does
not, and one whose experiment is missing is "not run"."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import services
from services import clean_env, rankexp

from analysis.core import claims as registry
from analysis.core.registry import default
from analysis.core.report import build_report
from analysis.core.runner import main as analysis_main
from analysis.core.select import only

browser = services.browser  # session fixture (tests/services.py)


# --------------------------------------------------------------------------- crafted runs
def craft(uri: str, experiment: str, runs: list[tuple[dict, dict]]) -> None:
    """Log finished runs with the given params and metrics (no probes ran: values crafted)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    store = Path(uri.removeprefix("sqlite:///")).parent / "artifacts"  # never ./mlruns
    exp_id = exp.experiment_id if exp else client.create_experiment(
        experiment, artifact_location=store.as_uri()
    )
    for params, metrics in runs:
        run = client.create_run(exp_id)
        for k, v in {"seeds": 4, "width": 256, "size": "full", "task.name": "measure",
                     **params}.items():  # fmt: skip
            client.log_param(run.info.run_id, k, v)
        for k, v in metrics.items():
            client.log_metric(run.info.run_id, k, v)
        client.set_terminated(run.info.run_id, "FINISHED")


def fig4_runs(detached: float) -> list[tuple[dict, dict]]:
    def run(placement, op, erank, **extra):
        p = {"norm.placement": placement, "norm.op": op, "alpha": 1.0}
        return p, {"erank_io": erank, "erank_io_std": 0.002, **extra}

    return [
        run("pre", "rmsnorm", 0.45),
        run("output", "rmsnorm", 0.40),
        run("post", "rmsnorm", 0.110, rank_removed_by_projection=0.0015),
        run("post", "detached", detached),
        run("none", "rmsnorm", 0.112),
    ]


def fig7_runs() -> list[tuple[dict, dict]]:
    def run(m, cos):
        return {"matrices": m, "activation": "relu"}, {
            "branch_input_cos_cross": cos, "branch_input_cos_cross_std": 0.004}  # fmt: skip

    return [run(1, 1 / math.pi + 0.004), run(2, 0.2)]  # M = 2 crafted to fail "cos ≈ 0"


def verdicts(uri: str) -> dict[str, registry.Verdict]:
    runs = registry.Runs(uri)
    try:
        return {v.claim.id: v for v in registry.evaluate(runs, default().claims())}
    finally:
        runs.close()


def test_crafted_runs_get_the_right_verdicts(tmp_path):
    good, bad = f"sqlite:///{tmp_path / 'good.db'}", f"sqlite:///{tmp_path / 'bad.db'}"
    craft(good, "fig4", fig4_runs(detached=0.1115))  # |gap| = 0.0015 ≤ 0.004
    craft(good, "fig7", fig7_runs())
    craft(bad, "fig4", fig4_runs(detached=0.130))  # |gap| = 0.02 > 0.004
    v, w = verdicts(good), verdicts(bad)
    assert v["fig4.detached_gap"].verdict == registry.HOLDS
    assert v["fig4.detached_gap"].measured.value == pytest.approx(0.0015, abs=1e-12)
    assert w["fig4.detached_gap"].verdict == registry.FAILS
    assert w["fig4.detached_gap"].measured.value == pytest.approx(0.020, abs=1e-12)
    assert v["fig4.post_like_none"].verdict == registry.HOLDS  # 0.110 / 0.112
    assert v["fig4.pre_output_floor"].measured.value == pytest.approx(0.40)
    assert v["fig4.projection_share"].verdict == registry.HOLDS
    assert v["fig7.cos_relu"].verdict == registry.HOLDS
    assert v["fig7.cos_relu"].measured.spread == pytest.approx(0.004)  # the run's seed std
    assert v["fig7.cos_zero"].verdict == registry.FAILS
    assert v["fig7.sum_linear"].verdict == registry.NOT_RUN  # no branch_mean_sum_exponent
    assert "branch_mean_sum_exponent" in v["fig7.sum_linear"].note
    assert w["fig7.cos_relu"].verdict == registry.NOT_RUN  # the bad store has no fig7
    assert v["fig1.noskip_collapse"].verdict == registry.NOT_RUN
    assert not [c for c in v.values() if c.verdict == registry.ERROR]
    assert set(v) == {c.id for c in default().claims()}
    # why a claim is not run: the store lacks the experiment's runs (runs), a larger size (size)
    assert v["fig1.noskip_collapse"].why == "runs"
    assert v["fig4.post_like_none"].why == ""  # decided


def test_a_claim_is_not_run_for_its_size_or_its_data_and_says_so(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    craft(uri, "fig5", [({"norm.placement": "pre", "depth": 8, "size": "smoke"}, {"erank_io": 0.5})])
    craft(uri, "fig12", [({"width": 32, "size": "smoke"}, {"ffn_accumulated_ratio": 1.0,
                                                            "ffn_cos_offdiag_rms": 0.01})])
    v = verdicts(uri)
    assert v["fig11.rms_384"].verdict == registry.NOT_RUN and v["fig11.rms_384"].why == "size"
    assert "It needs size=full runs; the store has size=smoke." in v["fig11.rms_384"].note
    assert v["fig12.cos_trained_small"].why == "data"
    assert "pretrained GPT-2 checkpoints" in v["fig12.cos_trained_small"].note


def test_a_claim_added_to_an_entry_shows_in_the_report(tmp_path):
    """A new claim goes into its experiment's registry entry; the report needs no change."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    craft(uri, "fig4", fig4_runs(detached=0.1115))
    extra = registry.Claim(
        "fig4.test_extra", "an extra claim", "a test", "0.45",
        registry.near(0.45, 0.01), lambda runs: registry.Measured(
            float(only(runs("fig4"), norm_placement="pre")["erank_io"].iloc[0])),
    )  # fmt: skip
    fig4 = default()["fig4"]
    reg = default().with_entries(replace(fig4, claims=(*fig4.claims, extra)))
    build_report(uri, tmp_path / "r", with_figures=False, registry=reg)
    table = pd.read_csv(tmp_path / "r" / "claims.csv").set_index("id")
    assert table.loc["fig4.test_extra", "verdict"] == registry.HOLDS
    assert table.loc["fig4.test_extra", "experiment"] == "fig4"
    assert "fig4.test_extra" in (tmp_path / "r" / "report.md").read_text()


def test_make_reproduce_sweeps_without_drawing_then_the_report_draws(capsys):
    from analysis import figures

    assert figures.main(["--dry-run", "--sweeps-only"]) == 0
    out = capsys.readouterr().out
    assert "python -m rankexp experiment=fig5 size=cpu -m" in out
    assert "python -m analysis" not in out  # drawing is left to the report
    make = (Path(__file__).parent.parent / "Makefile").read_text()
    assert "--sweeps-only" in make and "-m analysis report" in make


# --------------------------------------------------------------------------- the browser
@pytest.fixture(scope="module")
def two_experiments(tmp_path_factory):
    """A real store: fig4 and tab1 at size=smoke, plus crafted fig7 runs."""
    cwd = tmp_path_factory.mktemp("report_store")
    for exp in ("fig4", "tab1"):
        rankexp(f"experiment={exp}", "size=smoke", "-m", cwd=cwd, env=clean_env(),
                timeout=600).check()  # fmt: skip
    return cwd, f"sqlite:///{cwd / 'mlflow.db'}"


def test_report_renders_in_chromium_with_every_figure_and_claim(two_experiments, browser):
    from selenium.webdriver.common.by import By

    cwd, uri = two_experiments
    out = cwd / "report"
    t0 = time.perf_counter()
    assert analysis_main(["report", "--uri", uri, "--out", str(out)]) == 0
    print(f"report over fig4 + tab1 (smoke): {time.perf_counter() - t0:.1f} s")
    page = out / "report.html"
    html = page.read_text()
    assert "src=\"http" not in html and "href=\"http" not in html  # self-contained
    browser.get(page.as_uri())
    assert browser.title == "rankexp reproduction report"
    sections = [s.get_attribute("id") for s in browser.find_elements(By.CSS_SELECTOR, "section")]
    assert sections == ["fig4", "tab1"]
    images = browser.find_elements(By.CSS_SELECTOR, "section img")
    # fig4: placements; tab1: table1 — each command's figure embedded
    assert len(images) >= 2
    for img in images:
        assert img.get_attribute("src").startswith("data:image/png;base64,")
        loaded = browser.execute_script(
            "return arguments[0].complete && arguments[0].naturalWidth", img
        )
        assert loaded and loaded > 100, img.get_attribute("alt")
    rows = browser.find_elements(By.CSS_SELECTOR, "table#claims tbody tr.claim")
    assert len(rows) == len(default().claims())
    shown = {r.get_attribute("data-id"): r.get_attribute("data-verdict") for r in rows}
    csv = pd.read_csv(out / "claims.csv").set_index("id")["verdict"].to_dict()
    assert shown == csv
    assert shown["fig4.detached_gap"] in (registry.HOLDS, registry.FAILS)  # measured, not skipped
    assert shown["tab1.stable_rank"] in (registry.HOLDS, registry.FAILS)
    assert shown["fig5.kappa"] == registry.NOT_RUN  # no fig5 in this store
    # each section lists its own claims and a config summary with the swept params
    fig4 = browser.find_element(By.ID, "fig4")
    assert "norm.op (swept)" in fig4.find_element(By.CSS_SELECTOR, "table.config").text
    assert fig4.find_elements(By.CSS_SELECTOR, "table#claims-fig4 tr.claim")
    browser.save_screenshot(str(out / "report.png"))
    md = (out / "report.md").read_text()
    assert "## fig4" in md and "## tab1" in md and md.count("![") == len(images)


def spectrum_runs(size: str, off: float) -> list[tuple[dict, dict]]:
    """mf_spectrum rows at Var(λ) = L(v_W + v_D) + off (s.e. 0.01, 4 seeds, n = 400)."""
    from rankexp.theory import jacobian_spectrum_variance

    return [({"activation": "relu", "init": "gaussian", "depth": L, "width": 400, "size": size,
              "alpha": 2**0.5, "bias": 0.0},
             {"lambda_var": jacobian_spectrum_variance(L, "relu", "gaussian") + off,
              "lambda_var_std": 0.02, "lambda_var_theory": jacobian_spectrum_variance(L, "relu", "gaussian")})
            for L in (8, 32)]


def test_a_claim_measured_below_its_size_is_not_judged_and_the_table_says_where(tmp_path):
    """A claim valid from size=cpu, measured on smoke runs far off the theory, is grey "not
    judged at this size" (never "does not hold"); on cpu runs the same values do not hold;
    claims.csv and report.md carry the size, d and L of the runs read."""
    smoke, cpu = f"sqlite:///{tmp_path / 'smoke.db'}", f"sqlite:///{tmp_path / 'cpu.db'}"
    craft(smoke, "mf_spectrum", spectrum_runs("smoke", off=10.0))
    craft(cpu, "mf_spectrum", spectrum_runs("cpu", off=10.0))
    cid = "mf_spectrum.var_relu_gaussian"
    assert default().claims()[[c.id for c in default().claims()].index(cid)].size == "cpu"
    v, w = verdicts(smoke)[cid], verdicts(cpu)[cid]
    assert v.verdict == registry.NOT_JUDGED and v.why == "size"
    assert "valid from size=cpu" in v.note
    assert w.verdict == registry.FAILS
    assert (w.size, w.d, w.L) == ("cpu", "400", "{8, 32}")
    build_report(smoke, tmp_path / "r", with_figures=False)
    table = pd.read_csv(tmp_path / "r" / "claims.csv").set_index("id")
    assert table.loc[cid, ["verdict", "size", "valid_from", "d", "L"]].tolist() == [
        registry.NOT_JUDGED, "smoke", "cpu", "400", "{8, 32}"]
    html = (tmp_path / "r" / "report.html").read_text()
    assert 'class="claim notjudged"' in html and "not judged at this size" in html
    # a not-run reason is a sentence, never raw exception text
    for note in table.loc[table["verdict"] == registry.NOT_RUN, "note"].dropna():
        assert note[0].isupper() and note.rstrip().endswith("."), note
