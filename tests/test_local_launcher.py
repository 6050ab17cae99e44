"""``hydra/launcher=local`` is hydra-joblib-launcher as shipped: jobs in two loky workers.

A worker killed under a job (the OOM killer, ``kill -9``: ``RANKEXP_FAULT_KILL``) breaks loky's
pool, and joblib ends the sweep (``TerminatedWorkerError``): the command exits 1 and its counts
say what did not finish.  Nothing is lost for good: the same command again runs only what did
not finish, and every config ends with exactly one FINISHED run, none left RUNNING.
"""

from __future__ import annotations

from mlflow.entities import ViewType
from services import clean_env, client, rankexp, sweep_runs

ARGS = ("width=8", "seeds=1", "task.probes=[io_jacobian]", "depth=2,3,4", "hydra/launcher=local", "-m")


def test_a_killed_worker_ends_the_sweep_and_the_same_command_completes_it(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    res = rankexp(*ARGS, cwd=tmp_path, env=clean_env(RANKEXP_FAULT_KILL="depth=3"), timeout=600)
    assert res.returncode == 1, res.output[-3000:]
    assert "3 finished" not in res.output, res.output[-3000:]
    again = rankexp(*ARGS, cwd=tmp_path, env=clean_env(), timeout=600).check()
    assert "skipped (already FINISHED), 0 failed, 0 killed, 0 not run" in again.output, again.output[-3000:]
    parents, jobs = sweep_runs(uri)
    first, second = sorted(parents, key=lambda p: p.info.start_time)
    assert first.info.status != "FINISHED" and second.info.status == "FINISHED"
    finished = sorted(r.data.params["depth"] for r in jobs if r.info.status == "FINISHED")
    assert finished == ["2", "3", "4"], [(r.data.params["depth"], r.info.status) for r in jobs]
    every = client(uri).search_runs([parents[0].info.experiment_id], run_view_type=ViewType.ALL)
    assert not [r for r in every if r.info.status == "RUNNING"]
