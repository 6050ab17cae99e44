"""Detached Slurm sweeps and packed array tasks (issue 20, items 3-4), on the real test cluster
(launchers/slurm-cluster.sh): ``hydra.launcher.detach=true`` returns once the array is
submitted and the jobs close the sweep's parent run themselves; ``rankexp status`` follows it,
``rankexp cancel`` stops it; ``hydra.launcher.jobs_per_task=k`` runs k jobs per array task."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import services
from omegaconf import OmegaConf
from services import REPO, client, rankexp, sweep_runs

from hydra_plugins.rankexp_plugins.slurm import check_cluster
from rankexp import sweepctl, tracking

SLURM = ("hydra/launcher=slurm", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=2",
         "hydra.launcher.timeout_min=10")
SMALL = ("depth=2", "width=8", "seeds=1")
TIMEOUT = 300


def _sweep_dir(cwd: Path) -> Path:
    (sweep,) = [p for p in cwd.glob("multirun/*/*") if p.is_dir()]
    return sweep


def _ctl(*args: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """``rankexp status|cancel …`` as a user types it (the console script's module)."""
    return subprocess.run([sys.executable, "-m", "rankexp", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=180)


def _wait_parent(uri: str, statuses: set[str], timeout: float = TIMEOUT):
    end = time.monotonic() + timeout
    while True:
        (parent,), jobs = sweep_runs(uri)
        if parent.info.status in statuses or time.monotonic() > end:
            return parent, jobs
        time.sleep(2)


@pytest.mark.parametrize("k", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_a_detached_sweep_returns_at_once_and_its_jobs_close_the_parent(slurm_cluster, tmp_path, k):
    """8 jobs, each 2 s longer than its work (RANKEXP_FAULT_SLEEP), in 8/k array tasks (k jobs
    per task; k=2 in the default suite: half the interpreter start-ups): the command returns
    right after submitting (the foreground sweep would wait for all 8), ``status`` shows
    progress, and with no process of ours left the 8 runs end FINISHED and the last job closes
    the parent FINISHED with 8/8."""
    env = slurm_cluster.env(RANKEXP_FAULT_SLEEP="2")
    res = rankexp("alpha=range(1,9)", *SMALL, *SLURM, "hydra.launcher.detach=true",
                  f"hydra.launcher.jobs_per_task={k}", "-m", cwd=tmp_path, env=env, timeout=120).check()
    returned = time.time()
    sweep = _sweep_dir(tmp_path)
    plan = json.loads((sweep / sweepctl.PLAN_FILE).read_text())
    after_submit = returned - plan["submitted"]
    ended = [d for d in tracking.planned_job_dirs(sweep)
             if (tracking.read_json(d / "status.json") or {}).get("status") in sweepctl.ENDED]
    assert f"detached: 8 jobs in {8 // k} Slurm array tasks (array {plan['arrays'][0]})" in res.output
    assert len(ended) < 8, "the command waited for the jobs"
    assert len(plan["tasks"]) == 8 // k and sorted(j for js in plan["tasks"].values() for j in js) == list(range(8))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert plan["parent"]["uri"] == uri

    early = _ctl("status", str(sweep), cwd=tmp_path, env=env)
    assert early.returncode == 0, early.stderr
    assert "/8 done" in early.stdout and "sweep run" in early.stdout, early.stdout
    assert len([ln for ln in early.stdout.splitlines() if ln.strip()[:1].isdigit()]) == 8, early.stdout

    parent, jobs = _wait_parent(uri, {"FINISHED", "FAILED", "KILLED"}, timeout=600)  # 1 CPU, loaded
    assert parent.info.status == "FINISHED", (parent.data.metrics, parent.data.tags.get("error"))
    assert sorted(r.info.status for r in jobs) == ["FINISHED"] * 8
    m = parent.data.metrics
    assert (m["jobs_finished"], m["jobs_total"], m["jobs_failed"], m["jobs_not_run"]) == (8, 8, 0, 0)
    assert parent.data.tags[sweepctl.TAG_DETACHED] == plan["arrays"][0]
    late = _ctl("status", plan["arrays"][0], cwd=tmp_path, env=env)  # by Slurm array id
    assert late.returncode == 0, late.stderr
    assert f"{sweep}: 8/8 done (8 finished); sweep run {parent.info.run_id} FINISHED; ETA 0:00" \
        in late.stdout, late.stdout
    states = slurm_cluster.wait_sacct(plan["arrays"][0], {"COMPLETED"})
    assert set(states.values()) == {"COMPLETED"}, states
    # measured, not asserted (a loaded machine stretches it): issue 20 wants < 10 s end to end
    print(f"detached submit returned {res.seconds:.1f} s after the command started "
          f"({res.seconds - after_submit:.1f} s to sbatch, {after_submit:.1f} s after it); "
          f"status saw {early.stdout.splitlines()[-1]}")


def test_cancel_leaves_no_run_running(slurm_cluster, tmp_path):
    """A detached sweep of 4 jobs that would run a minute each: once one runs, ``rankexp
    cancel`` cancels the array, and every run is closed (none RUNNING), the parent KILLED."""
    env = slurm_cluster.env(RANKEXP_FAULT_SLEEP="60")
    rankexp("alpha=1,2,3,4", *SMALL, *SLURM, "hydra.launcher.detach=true", "-m",
            cwd=tmp_path, env=env, timeout=120).check()
    sweep, uri = _sweep_dir(tmp_path), f"sqlite:///{tmp_path / 'mlflow.db'}"
    end = time.monotonic() + 120
    while time.monotonic() < end and not any(
            r.info.status == "RUNNING" for r in sweep_runs(uri)[1]):
        time.sleep(1)
    assert any(r.info.status == "RUNNING" for r in sweep_runs(uri)[1]), "no job started"
    p = _ctl("cancel", str(sweep), cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    (parent,), jobs = sweep_runs(uri)
    assert parent.info.status == "KILLED" and jobs, p.stdout
    assert [r.info.status for r in jobs if r.info.status == "RUNNING"] == []
    assert {r.info.status for r in jobs} <= {"KILLED", "FINISHED"}, [r.data.tags for r in jobs]
    plan = sweepctl.read_plan(sweep)
    states = slurm_cluster.wait_sacct(plan["arrays"][0], {"CANCELLED", "COMPLETED"})
    assert "CANCELLED" in {s.split()[0] for s in states.values()}, states
    m = parent.data.metrics
    assert m["jobs_total"] == 4 and m["jobs_killed"] + m["jobs_not_run"] >= 3, m
    again = _ctl("status", str(sweep), cwd=tmp_path, env=env)
    assert "sweep run" in again.stdout and "KILLED" in again.stdout.splitlines()[-1], again.stdout


def test_seven_jobs_three_to_a_task_are_three_array_tasks_and_seven_runs(slurm_cluster, tmp_path):
    """``jobs_per_task=3``: 7 jobs → tasks of 3, 3 and 1 jobs (one sbatch array of 3), each job
    its own FINISHED run under the one parent; the foreground sweep counts all 7."""
    res = rankexp("alpha=range(1,8)", *SMALL, *SLURM, "hydra.launcher.jobs_per_task=3", "-m",
                  cwd=tmp_path, env=slurm_cluster.env(), timeout=TIMEOUT).check()
    assert "7 finished, 0 skipped (already FINISHED), 0 failed" in res.output, res.output[-3000:]
    sweep = _sweep_dir(tmp_path)
    tasks = sorted(d.name for d in (sweep / ".submitit").iterdir() if re.fullmatch(r"\d+_\d+", d.name))
    array = tasks[0].split("_")[0]
    assert tasks == [f"{array}_{i}" for i in range(3)], tasks
    script = (sweep / ".submitit" / array / f"{array}_submission.sh").read_text()
    assert "#SBATCH --array=0-2" in script, script
    (parent,), jobs = sweep_runs(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert parent.info.status == "FINISHED" and parent.data.metrics["jobs_finished"] == 7
    assert sorted(r.info.status for r in jobs) == ["FINISHED"] * 7
    logs = {t: "".join(p.read_text() for p in (sweep / ".submitit" / t).glob("*_log.*")) for t in tasks}
    per_task = {t: sum(f"(run {r.info.run_id})" in text for r in jobs) for t, text in logs.items()}
    assert sorted(per_task.values()) == [1, 3, 3], per_task
    assert {r.data.tags[tracking.TAG_SLURM] for r in jobs} == set(tasks)
    assert states_ok(slurm_cluster.wait_sacct(array, {"COMPLETED"}))


def states_ok(states: dict[str, str]) -> bool:
    assert set(states.values()) == {"COMPLETED"}, states
    return True


# --------------------------------------------------------------------------- without Slurm
RACER = """
import sys, time
from pathlib import Path
from rankexp import sweepctl, tracking
job_dir, go = Path(sys.argv[1]), float(sys.argv[2])
parent = tracking.read_parent(job_dir.parent)
tracking._client(parent["uri"]).get_run(parent["run_id"])  # MLflow imported, as in a job
while time.time() < go:
    time.sleep(0.005)
tracking.write_status(job_dir, "FINISHED", run_id="r-" + job_dir.name)
sweepctl.job_ended(job_dir.parent)
"""


def _race_round(tmp_path: Path, n: int) -> None:
    """n real processes end their jobs (n - 1 at the same instant, then the last) and each
    counts the sweep into its parent run: the parent ends FINISHED with n/n, closed once."""
    sweep = tmp_path / "multirun" / "d" / "t"
    dirs = [sweep / str(i) for i in range(n)]
    for d in dirs:
        d.mkdir(parents=True)
    tracking.write_json(sweep / tracking.NAMES_FILE, {"started": time.time(), "names": [],
                                                      "job_dirs": [str(d) for d in dirs]})
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = tracking.SweepRun(uri, "race", sweep, dirs, "", 30, 600)
    parent.open([], resume=False)
    parent._heartbeat.__exit__()
    tracking.write_json(sweep / sweepctl.PLAN_FILE, {"sweep_dir": str(sweep), "arrays": [],
                                                     "tasks": {}, "submitted": time.time()})
    go = time.time() + 12  # after every interpreter has imported mlflow
    env = services.clean_env()
    # all but job 0 end at the same instant; job 0, the last, 1.5 s later
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(d), str(go + 1.5 * (i == 0))], env=env,
                              cwd=REPO, stderr=subprocess.PIPE, text=True) for i, d in enumerate(dirs)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errors
    assert time.time() > go
    run = client(uri).get_run(parent.run_id)
    assert run.info.status == "FINISHED", (run.data.metrics, run.data.tags.get("error"), errors)
    assert run.data.metrics["jobs_finished"] == n and run.data.metrics["jobs_total"] == n
    # closed once, at the end: a premature close (a job not yet ended counted not_run) would
    # have left its FAILED reason behind
    assert tracking.TAG_REASON not in run.data.tags and "error" not in run.data.tags, run.data.tags
    assert json.loads((sweep / sweepctl.CLOSED_FILE).read_text())["counts"]["finished"] == n


def test_jobs_that_end_at_once_close_the_parent_once_with_every_count(tmp_path):
    _race_round(tmp_path, 4)


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(5))
def test_jobs_that_end_at_once_race_many_times(tmp_path, trial):
    _race_round(tmp_path, 6)


def test_eta_is_the_rate_jobs_ended_at_so_far():
    rows = [{"status": "FINISHED", "start": 100.0}, {"status": "FINISHED", "start": 110.0},
            {"status": "RUNNING", "start": 150.0}, {"status": "", "start": None}]
    assert sweepctl.eta_seconds(rows, now=200.0) == pytest.approx(2 * 100.0 / 2)  # 2 ended in 100 s
    assert sweepctl.eta_seconds(rows[2:], now=200.0) is None
    assert sweepctl.eta_seconds(rows[:2], now=200.0) == 0.0


def test_status_of_what_is_no_sweep_is_one_line_and_exit_2(tmp_path):
    env = services.clean_env()
    p = _ctl("status", str(tmp_path), cwd=tmp_path, env=env)
    assert p.returncode == 2 and p.stderr.strip() == f"error: {tmp_path} is no sweep directory " \
        f"(it has no {tracking.NAMES_FILE})", p.stderr
    p = _ctl("cancel", "12345", cwd=tmp_path, env=env)
    assert p.returncode == 2 and p.stderr.startswith("error: '12345' is no directory"), p.stderr
    assert not os.path.exists(tmp_path / "mlflow.db")


@pytest.mark.parametrize("k", [0, -1, 1.5, True])
def test_jobs_per_task_below_one_is_refused_before_anything(k):
    (message,) = check_cluster(OmegaConf.create({"jobs_per_task": k}))
    assert message.startswith(f"hydra.launcher.jobs_per_task={k!r}: must be a whole number ≥ 1")
