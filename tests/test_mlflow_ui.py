"""The MLflow UI, as `make ui` starts it (`mlflow ui --backend-store-uri sqlite:///...`),
over a store holding a small sweep, read in a real headless Chromium (Debian's chromium and
chromedriver, driven by Selenium): the link the sweep logs opens the experiment on its run
table (not MLflow 3's GenAI overview), the sweep's runs are in that table, and a run's per-layer profile (metric erank_profile) is drawn as a line against step = layer."""

from __future__ import annotations

import re
import time

import pytest
import services
from services import clean_env, client, mlflow_ui, rankexp, sweep_runs

browser = services.browser  # session fixture (tests/services.py)

WAIT = 90  # seconds for a page to render (2 shared cores)


def wait_for(driver, what, find, timeout=WAIT):
    # selenium is imported here, not at module level: without it this test fails (through
    # the `browser` fixture's message) instead of aborting the whole run at collection
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(
            driver, timeout, ignored_exceptions=[StaleElementReferenceException]
        ).until(lambda d: find(d))
    except Exception as e:
        shot = f"/tmp/rankexp-ui-failure-{int(time.time())}.png"
        driver.save_screenshot(shot)
        body = driver.find_element(By.TAG_NAME, "body").text
        raise AssertionError(
            f"UI: {what} did not show in {timeout} s ({shot}):\n{body[:3000]}"
        ) from e


def test_ui_shows_the_sweeps_runs_and_a_per_layer_profile_chart(browser, tmp_path):
    from selenium.webdriver.common.by import By

    out = rankexp(
        "norm=post", "alpha=1,2", "depth=8,16", "width=16", "seeds=1", "-m",
        cwd=tmp_path, env=clean_env(), timeout=300,
    ).check().output  # fmt: skip
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (parent,), jobs = sweep_runs(store)
    exp_id = parent.info.experiment_id
    names = {r.info.run_id: r.info.run_name for r in jobs}
    assert len(names) == 4 and len(set(names.values())) == 4

    with mlflow_ui(store, tmp_path / "ui.log") as url:
        # --- the link the sweep logged: the experiment's run table, its parent with four runs
        link = re.search(rf"runs: http://\S+(/#/experiments/{exp_id}/\S+)", out)
        assert link, out[-3000:]
        browser.get(url + link[1])
        row = f"[role='row'][row-id='{parent.info.run_id}']"
        wait_for(browser, "the sweep's parent row", lambda d: d.find_element(By.CSS_SELECTOR, row))
        page = browser.find_element(By.TAG_NAME, "body").text
        assert f"/experiments/{exp_id}/runs" in browser.current_url, browser.current_url
        assert "Overview" not in page and "No data available" not in page, page[:1000]
        parent_row = browser.find_element(By.CSS_SELECTOR, row)
        assert parent.info.run_name in parent_row.text, parent_row.text
        # nested runs are collapsed under their parent: the run-name cell's button expands
        parent_row.find_element(By.CSS_SELECTOR, "[col-id='attributes.`Run Name`'] button").click()

        def child_rows(d):
            # ag-grid splits a row between its pinned and scrolling parts: join them by row-id
            rows: dict[str, str] = {}
            for r in d.find_elements(By.CSS_SELECTOR, "[role='row'][row-id]"):
                rows[r.get_attribute("row-id")] = rows.get(r.get_attribute("row-id"), "") + r.text
            shown = all(name in rows.get(run_id, "") for run_id, name in names.items())
            return rows if shown else None

        rows = wait_for(browser, "the four runs of the sweep", child_rows)
        assert set(rows) == set(names) | {parent.info.run_id}, rows
        for run_id, name in names.items():
            assert name in rows[run_id], (name, rows[run_id])
        browser.save_screenshot(str(tmp_path / "ui-runs.png"))

        # --- one run's model metrics, filtered to erank_profile: a line over the layers
        run = max(jobs, key=lambda r: int(r.data.params["depth"]))
        depth = int(run.data.params["depth"])
        browser.get(f"{url}/#/experiments/{exp_id}/runs/{run.info.run_id}/model-metrics")
        search = wait_for(
            browser,
            "the metric chart search box",
            lambda d: d.find_element(By.CSS_SELECTOR, "input[placeholder='Search metric charts']"),
        )
        search.send_keys("erank_profile")

        def profile_chart(d):
            plots = d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")
            return (
                plots[0] if len(plots) == 1 and plots[0].find_elements(By.TAG_NAME, "svg") else None
            )

        plot = wait_for(browser, "one plotly chart for erank_profile", profile_chart)
        time.sleep(1)  # let plotly finish drawing before the screenshot
        card = plot.find_element(By.XPATH, "./ancestor::*[.//*[text()='erank_profile']][1]")
        assert "erank_profile" in card.text and "Step" in plot.text, card.text
        assert run.info.run_name in card.text, card.text  # the legend names the run
        assert plot.find_elements(By.CSS_SELECTOR, "svg.main-svg .scatterlayer .trace path")
        # what plotly drew: one line with x = step = layer 1..L and y = the logged values
        traces = browser.execute_script(
            "return arguments[0].data.map(t => ({type: t.type, x: Array.from(t.x || []),"
            " y: Array.from(t.y || [])}))",
            plot,
        )
        hist = sorted(
            client(store).get_metric_history(run.info.run_id, "erank_profile"),
            key=lambda m: m.step,
        )
        assert traces and all(t["type"] == "scatter" for t in traces), traces
        for t in traces:
            assert t["x"] == list(range(1, depth + 1)), t["x"]
            assert t["y"] == pytest.approx([m.value for m in hist], rel=1e-9)
        shot = tmp_path / "ui-erank-profile.png"
        browser.save_screenshot(str(shot))
        print(f"screenshots: {tmp_path / 'ui-runs.png'}, {shot}")
