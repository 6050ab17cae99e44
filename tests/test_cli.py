"""The entrypoint as users type it: sweeps, MLflow runs, heatmaps, bad input, failures, resume."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import runs_in

SMALL = ("width=24", "seeds=2")


def job_runs(uri, experiment="rankexp"):
    return [r for r in runs_in(uri, experiment) if r.data.tags.get("rankexp.role") != "sweep"]


def test_issue_sweep_leaves_four_finished_runs_and_a_heatmap(cli):
    cli("norm=post", "alpha=1,2", "depth=48,96", "-m", *SMALL)
    runs = job_runs(cli.uri)
    assert len(runs) == 4
    assert {r.info.status for r in runs} == {"FINISHED"}
    grid = {(r.data.params["alpha"], r.data.params["depth"]) for r in runs}
    assert grid == {("1.0", "48"), ("1.0", "96"), ("2.0", "48"), ("2.0", "96")}
    parents = [r for r in runs_in(cli.uri) if r.data.tags.get("rankexp.role") == "sweep"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    client_runs = {r.info.run_id: r for r in runs}
    for r in runs:
        m, p, t = r.data.metrics, r.data.params, r.data.tags
        for key in (
            "erank_io",
            "stable_rank_io",
            "erank_profile",
            "rms",
            "branch_ratio",
            "erank_profile_std",  # a series keeps its band partner
        ):
            assert key in m, key
        # a scalar's seed spread is a tag, not a second chart (issue 9 row 8)
        assert "erank_io_std" not in m and float(t["seed_std.erank_io"]) >= 0
        # params are what defines the experiment
        assert not [k for k in p if k.startswith(("tracking.", "data.")) or k in ("lr", "device")]
        # MLflow's system tags: Source, Created by, the commit (+ whether the tree was dirty)
        assert t["mlflow.source.name"] == "rankexp" and t["mlflow.source.type"] == "LOCAL"
        assert t["mlflow.user"] and len(t["mlflow.source.git.commit"]) == 40
        assert t["rankexp.git_dirty"] in ("true", "false")
        assert 0 < m["erank_io"] <= 1 and 1 <= m["stable_rank_io"] <= 24
        assert p["norm.placement"] == "post" and p["width"] == "24"
        assert float(p["nominal_ratio"]) == pytest.approx(float(p["alpha"]) ** 2)
        assert float(p["depth_factor"]) == pytest.approx(
            float(p["alpha"]) ** 2 * float(p["depth"]) ** 0.5
        )
        for tag in ("config_hash", "git_commit", "overrides", "sweep_id", "device"):
            assert t[tag], tag
        assert t["mlflow.parentRunId"] == parents[0].info.run_id
        assert "norm=post" in t["overrides"]
    # names from the swept axes (the norm= choice leads), the parent by experiment and time
    assert sorted(r.info.run_name for r in runs) == ["post·α1·L48", "post·α1·L96",
                                                     "post·α2·L48", "post·α2·L96"]
    assert parents[0].info.run_name.startswith("rankexp·20")
    note = parents[0].data.tags["mlflow.note.content"]
    assert "python -m rankexp norm=post alpha=1,2 depth=48,96" in note
    # the per-layer series are logged with step = layer, and equal the job-dir result
    from mlflow.tracking import MlflowClient

    client = MlflowClient(cli.uri)
    rid = next(iter(client_runs))
    hist = sorted(client.get_metric_history(rid, "erank_profile"), key=lambda x: x.step)
    depth = int(client_runs[rid].data.params["depth"])
    assert [h.step for h in hist] == list(range(1, depth + 1))
    job_dir = Path(client_runs[rid].data.tags["job_dir"])
    saved = json.loads((job_dir / "result" / "result.json").read_text())
    assert saved["series"]["erank_profile"]["values"] == pytest.approx(
        [h.value for h in hist], rel=1e-12
    )
    assert saved["scalars"]["erank_io"] == pytest.approx(
        client_runs[rid].data.metrics["erank_io"], rel=1e-12
    )
    artifacts = {a.path for a in client.list_artifacts(rid)}
    assert {"config.yaml", "result.json", "arrays.npz"} <= artifacts
    # deeper and larger α collapse more (post-norm)
    er = {
        (float(r.data.params["alpha"]), int(r.data.params["depth"])): r.data.metrics["erank_io"]
        for r in runs
    }
    assert er[(2.0, 96)] < er[(1.0, 48)]

    out = cli("heatmap", "--experiment", "rankexp", module="analysis")
    figdir = cli.cwd / "figures" / "rankexp"
    stem = "heatmap_erank_io_depth_x_alpha"
    for ext in ("png", "pdf", "csv"):
        assert (figdir / f"{stem}.{ext}").stat().st_size > 0, out.stdout
    table = pd.read_csv(figdir / f"{stem}.csv")
    assert len(table) == 4 and (table["count"] == 1).all()
    assert sorted(table["mean"]) == pytest.approx(sorted(er.values()), rel=1e-12)


BAD = [
    ("depth=0", "depth"),
    ("width=-4", "width"),
    ("alpha=0", "alpha"),
    ("expansion=0", "expansion"),
    ("matrices=3", "matrices"),
    ("activation=foo", "activation"),
    ("norm=sideways", "norm"),
    ("norm.op=magic", "op"),
    ("seeds=0", "seeds"),
    ("beta_scaling=cube", "beta_scaling"),
]


@pytest.mark.parametrize("override,key", BAD)
def test_bad_input_fails_before_any_run(cli, override, key):
    value = override.split("=", 1)[1]
    small = [o for o in ("depth=4", "width=8") if o.split("=")[0] != key]  # each key once
    p = cli(override, *small, check=False)
    assert p.returncode != 0
    assert key in p.stdout and value in p.stdout, p.stdout[-2000:]
    assert (
        "allowed" in p.stdout
        or "expected one of" in p.stdout
        or "Available options" in p.stdout
        or "must be" in p.stdout
        or "M = 1 or M = 2" in p.stdout
    ), p.stdout[-2000:]
    assert "Traceback" not in p.stdout or key in p.stdout.splitlines()[-1]
    assert job_runs(cli.uri) == []


def test_file_store_uri_is_refused_with_a_clear_message(cli):
    p = cli("depth=2", "width=8", f"tracking.uri=file://{cli.cwd}/mlruns", check=False)
    assert p.returncode != 0
    assert "file store" in p.stdout and "sqlite" in p.stdout
    assert not (cli.cwd / "mlruns").exists()


def test_stale_mlruns_does_not_hijack_the_default_store(cli):
    stale = cli.cwd / "mlruns" / "0"
    stale.mkdir(parents=True)
    (stale / "meta.yaml").write_text("name: Default\n")
    cli("depth=2", "width=8", "seeds=1")
    assert len(job_runs(cli.uri)) == 1


def test_one_failing_job_does_not_stop_the_sweep_and_is_recorded_failed(cli):
    """task.options.stream.inputs=0 passes every check before a run (an integer option) and the
    probe refuses it while computing: that job's run is FAILED with the error as a tag, the
    other jobs finish, the sweep exits non-zero.  (A network too large for the machine, v1's
    example here, is refused before any run now: tests/test_memory.py.)"""
    p = cli("task.options.stream.inputs=0,1", "depth=1,2", "width=8", "seeds=1",
            "task.probes=[stream]", "-m", check=False)
    assert p.returncode != 0
    runs = job_runs(cli.uri)
    status = sorted(r.info.status for r in runs)
    assert status == ["FAILED", "FAILED", "FINISHED", "FINISHED"], status
    failed = [r for r in runs if r.info.status == "FAILED"]
    assert all("inputs=0" in r.data.tags["error"] for r in failed), [r.data.tags for r in failed]
    parent = [r for r in runs_in(cli.uri) if r.data.tags.get("rankexp.role") == "sweep"][0]
    assert parent.info.status == "FAILED"
    assert parent.data.metrics["jobs_failed"] == 2 and parent.data.metrics["jobs_finished"] == 2
    assert "2 finished, 0 skipped (already FINISHED), 2 failed, 0 killed, 0 not run" in p.stdout
    assert p.returncode == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_missing_cuda_is_a_clear_error_before_any_run(cli):
    p = cli("device=cuda", "depth=2", "width=8", check=False)
    assert p.returncode == 2 and "device='cuda'" in p.stdout
    assert job_runs(cli.uri) == []


def test_rerun_skips_finished_configs_and_force_reruns(cli):
    cli("alpha=1,2", "depth=3", "-m", *SMALL)
    assert len(job_runs(cli.uri)) == 2
    p = cli("alpha=1,2,3", "depth=3", "-m", *SMALL)
    assert "2 skipped" in p.stdout
    assert len(job_runs(cli.uri)) == 3
    cli("alpha=1", "depth=3", "tracking.force=true", *SMALL)
    assert len(job_runs(cli.uri)) == 4
