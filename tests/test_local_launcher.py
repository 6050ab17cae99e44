"""A local parallel sweep survives a lost worker (issue 22, row 5 of "what to build").

``hydra/launcher=local`` (joblib, two loky workers) with one job SIGKILLing its own worker
process right after its run exists (``RANKEXP_FAULT_KILL``: the OOM killer's way).  Before:
loky broke its pool, ``TerminatedWorkerError`` aborted the sweep, the other in-flight job was
killed and two jobs never ran.  Now that job is FAILED with ``rankexp.end_reason=worker_lost``,
the job killed with it runs again, the rest run, and the summary says so.
"""

from __future__ import annotations

import json

from mlflow.entities import ViewType
from services import clean_env, client, rankexp, sweep_runs


def test_a_killed_worker_fails_its_job_and_the_sweep_goes_on(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    res = rankexp("width=8", "seeds=1", "task.probes=[io_jacobian]", "depth=2,3,4,5",
                  "hydra/launcher=local", "-m", cwd=tmp_path,
                  env=clean_env(RANKEXP_FAULT_KILL="depth=3", RANKEXP_FAULT_SLEEP="1"), timeout=600)
    assert res.returncode == 1, res.output[-3000:]
    assert "TerminatedWorkerError" not in res.output, res.output[-3000:]
    assert "3 finished, 0 skipped (already FINISHED), 1 failed, 0 killed, 0 not run" in res.output, \
        res.output[-3000:]
    (parent,), jobs = sweep_runs(uri)
    lost = [r for r in jobs if r.data.params["depth"] == "3"]
    assert len(lost) == 1 and all(r.info.status == "FAILED" for r in lost), [r.info.status for r in lost]
    for r in lost:
        assert r.data.tags["rankexp.end_reason"] == "worker_lost"
        assert "SIGKILL" in r.data.tags["error"] and "died" in r.data.tags["error"]
    others = [r for r in jobs if r.data.params["depth"] != "3"]
    assert sorted(r.info.status for r in others) == ["FINISHED"] * 3
    assert len({r.data.tags["config_hash"] for r in others}) == 3
    every = client(uri).search_runs([parent.info.experiment_id], run_view_type=ViewType.ALL)
    assert not [r for r in every if r.info.status == "RUNNING"]
    m = parent.data.metrics
    assert parent.info.status == "FAILED" and (m["jobs_finished"], m["jobs_failed"]) == (3, 1)
    (sweep,) = [p for p in tmp_path.glob("multirun/*/*") if p.is_dir()]
    reasons = sorted(json.loads((d / "status.json").read_text()).get("reason") or ""
                     for d in sweep.glob("[0-9]*"))
    assert reasons.count("worker_lost") == 1, reasons
