"""A tracking outage costs seconds, not hours, and loses nothing (issue 8, row 2).

A real `mlflow server` (launchers/mlflow-server.sh, SQLite backend) is stopped while a sweep
logs to it.  Each remaining job asks the server once (bounded retries), computes anyway,
writes its result to its job directory and fails within seconds.  The server comes back and
``python -m rankexp.sync`` on the multirun directory logs every missing config — each config
FINISHED exactly once, the run the outage cut short superseded, the parent closed with true
counts — and a second sync adds nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from services import REPO, MlflowServer, clean_env, client, finish, start_rankexp, sweep_runs

from rankexp import tracking

SWEEP = ("depth=4,24", "alpha=1,2,3", "width=16", "seeds=1", "tracking.experiment=outage", "-m")


def sync(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rankexp.sync", *args], cwd=REPO, env=clean_env(),
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def server():
    s = MlflowServer("sqlite", workers=2)
    try:
        s.start()
        yield s
    finally:
        s.stop()


@pytest.mark.slow  # ~1 min (a server started, stopped, restarted); the default run's server
# store: test_tracking_server; its sync of job directories: test_store_errors
def test_server_stopped_mid_sweep_then_sync_logs_every_config_once(server, tmp_path):
    # each job 1 s longer, idle (RANKEXP_FAULT_SLEEP): the stop below lands while ≥ 3 are left,
    # however fast the jobs' start-up (6 tiny jobs once ended in 2 s, before the poll saw two)
    proc = start_rankexp(*SWEEP, f"tracking.uri={server.uri}", cwd=tmp_path,
                         env=clean_env(RANKEXP_FAULT_SLEEP="1"))
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline:
        runs = sweep_runs(server.uri, "outage")[1] if list(tmp_path.glob("multirun/*/*/mlflow_parent.json")) else []
        if sum(r.info.status == "FINISHED" for r in runs) >= 2:
            break
        time.sleep(0.2)
    server.stop(keep=True)
    stopped = time.time()
    res = finish(proc, timeout=240)
    assert res.returncode == 1, res.output[-3000:]
    assert "could not close the sweep run" in res.output, res.output[-3000:]

    (sweep,) = [p for p in tmp_path.glob("multirun/*/*") if p.is_dir()]
    jobs = sorted((d for d in sweep.iterdir() if (d / "run.json").exists()), key=lambda d: int(d.name))
    assert len(jobs) == 6
    lost = []
    for d in jobs:
        status = json.loads((d / "status.json").read_text())
        result = json.loads((d / "result" / "result.json").read_text())  # every job has its result
        assert result["scalars"]["erank_io"] > 0
        if status["status"] != "FINISHED":
            assert status["status"] == "FAILED"
            assert status["reason"] == "store_error", status
            assert "rankexp.sync" in status["error"]
            started = json.loads((d / "run.json").read_text())["start_time"] / 1000
            if started > stopped:  # a job that began during the outage: seconds, not minutes
                assert status["time"] - started < 30, (d, status["time"] - started)
            lost.append(d)
    assert len(lost) >= 3, [json.loads((d / "status.json").read_text())["status"] for d in jobs]

    server.start()
    first = sync(str(sweep.parent.parent))  # the whole multirun tree
    assert first.returncode == 0, first.stdout + first.stderr
    parents, runs = sweep_runs(server.uri, "outage")
    finished = [r for r in runs if r.info.status == "FINISHED"]
    hashes = [r.data.tags["config_hash"] for r in finished]
    assert len(hashes) == 6 and len(set(hashes)) == 6, hashes
    assert all(r.info.status != "RUNNING" for r in runs + parents), [r.info.status for r in runs]
    (parent,) = parents
    assert parent.info.status == "FINISHED" and parent.data.metrics["jobs_finished"] == 6
    assert {r.data.tags["mlflow.parentRunId"] for r in finished} == {parent.info.run_id}

    # a synced run is what the live job would have logged
    c = client(server.uri)
    for d in lost:
        run = next(r for r in finished if r.data.tags["job_dir"] == str(d))
        assert run.data.tags["rankexp.synced_from"] == str(d.resolve())
        record = json.loads((d / "run.json").read_text())
        result = json.loads((d / "result" / "result.json").read_text())
        assert run.info.run_name == record["run_name"]
        assert run.data.params == {k: str(v) if not isinstance(v, (list, dict)) else json.dumps(v)
                                   for k, v in record["params"].items()}
        scalars, spread = tracking.split_seed_std(result["scalars"])  # seed spread → tags
        assert run.data.metrics == pytest.approx(
            {**scalars, **{k: v["values"][-1] for k, v in result["series"].items()}}, nan_ok=True)
        assert spread and all(run.data.tags[k] == v for k, v in spread.items())
        hist = sorted(c.get_metric_history(run.info.run_id, "erank_profile"), key=lambda m: m.step)
        assert [m.value for m in hist] == pytest.approx(result["series"]["erank_profile"]["values"])
        assert {a.path for a in c.list_artifacts(run.info.run_id)} == {"config.yaml", "result.json",
                                                                        "arrays.npz"}

    second = sync(str(sweep))
    assert second.returncode == 0, second.stdout + second.stderr
    assert "0 logged, 6 already in the store" in second.stderr + second.stdout
    assert {r.info.run_id for r in sweep_runs(server.uri, "outage")[1]} == {r.info.run_id for r in runs}
    print(f"sweep {res.seconds:.0f} s with the server stopped after 2 jobs; "
          f"{len(lost)} jobs logged by sync")


@pytest.mark.slow
def test_sync_of_a_job_dir_without_a_store_says_so(tmp_path):
    """``tracking=off`` jobs have no store: sync needs ``--uri`` for them, and says so."""
    res = subprocess.run([sys.executable, "-m", "rankexp", "depth=2", "width=8", "seeds=1",
                          "tracking=off"], cwd=tmp_path, env=clean_env(), capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    (job,) = [p.parent for p in Path(tmp_path, "outputs").rglob("run.json")]
    out = sync(str(job))
    assert out.returncode == 1 and "without a store" in out.stderr + out.stdout
    uri = f"sqlite:///{tmp_path / 'synced.db'}"
    out = sync(str(job), "--uri", uri)
    assert out.returncode == 0, out.stderr
    (run,) = sweep_runs(uri)[1]
    assert run.info.status == "FINISHED" and run.data.metrics["erank_io"] > 0
