"""``rankexp detach OVERRIDES -m``: the whole sweep as one Slurm job (the driver) that runs the
normal sweep, followed by ``rankexp status`` and stopped by ``rankexp cancel`` — on the real
test cluster (launchers/slurm-cluster.sh), and the refusals that need no cluster."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import services
from services import sweep_runs

from rankexp import sweepctl

SLURM = ("hydra/launcher=slurm", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=2",
         "hydra.launcher.timeout_min=10")
SMALL = ("depth=2", "width=8", "seeds=1")
DRIVER = ("--mem-gb", "2", "--timeout-min", "20")


def _ctl(*args: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """``rankexp detach|status|cancel …`` as a user types it."""
    return subprocess.run([sys.executable, "-m", "rankexp", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=180)


def _detached(cwd: Path) -> tuple[Path, str]:
    (f,) = cwd.glob(f"multirun/*/*/{sweepctl.DETACHED_FILE}")
    return f.parent, str(json.loads(f.read_text())["job_id"])


def test_a_detached_sweep_is_one_driver_job_that_runs_the_sweep_and_its_array(slurm_cluster, tmp_path):
    """The command returns once the driver is queued; the driver runs the sweep, which submits
    its array and owns the parent run; ``status`` (by job id, then by directory) follows it."""
    env = slurm_cluster.env()
    p = _ctl("detach", "--partition", "nope", "alpha=1,2", "-m", cwd=tmp_path, env=env)
    assert p.returncode == 2 and p.stderr.startswith("error: --partition='nope': Slurm has no such partition"), p.stderr
    p = _ctl("detach", *DRIVER, "alpha=1,2", *SMALL, *SLURM, "-m", cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    sweep, job = _detached(tmp_path)
    assert f"the sweep runs in Slurm job {job}" in p.stdout and f"rankexp status {job}" in p.stdout
    early = _ctl("status", job, cwd=tmp_path, env=env)
    assert early.returncode == 0 and early.stdout.startswith(f"driver {job}: "), early.stdout + early.stderr

    end = time.monotonic() + 300
    while time.monotonic() < end and not slurm_cluster.sacct(job).get(job, "").startswith("COMPLETED"):
        time.sleep(2)
    (parent,), jobs = sweep_runs(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert parent.info.status == "FINISHED", (slurm_cluster.sacct(job), services.tail(
        sweep / ".submitit" / job / f"{job}_0_log.err"))
    assert sorted(r.info.status for r in jobs) == ["FINISHED"] * 2
    assert parent.data.tags["sweep_id"] == str(sweep)
    tasks = sorted(d.name for d in (sweep / ".submitit").glob("[0-9]*_[0-9]*"))
    assert len(tasks) == 2 and tasks[0].split("_")[0] != job  # the sweep's own array, besides the driver
    late = _ctl("status", str(sweep), cwd=tmp_path, env=env)
    assert f"driver {job}: COMPLETED" in late.stdout, late.stdout
    assert "array " in late.stdout and "2 COMPLETED" in late.stdout, late.stdout
    assert f"{sweep}: 2/2 done (2 finished); ETA 0:00" in late.stdout, late.stdout


def test_cancel_leaves_no_run_running(slurm_cluster, tmp_path):
    """A detached sweep of jobs that would run a minute each: once one runs, ``rankexp cancel``
    cancels the driver and its array; every run is closed (none RUNNING), the parent KILLED."""
    env = slurm_cluster.env(RANKEXP_FAULT_SLEEP="60")
    _ctl("detach", *DRIVER, "alpha=1,2,3", *SMALL, *SLURM, "-m", cwd=tmp_path, env=env)
    sweep, job = _detached(tmp_path)
    uri, end = f"sqlite:///{tmp_path / 'mlflow.db'}", time.monotonic() + 240
    while time.monotonic() < end and not any(
            '"RUNNING"' in p.read_text() for p in sweep.glob("*/status.json")):
        time.sleep(1)
    p = _ctl("cancel", job, cwd=tmp_path, env=env)
    assert p.returncode == 0 and f"cancelled Slurm job {job}" in p.stdout, p.stdout + p.stderr
    (parent,), jobs = sweep_runs(uri)
    assert parent.info.status == "KILLED" and jobs, p.stdout
    assert {r.info.status for r in jobs} <= {"KILLED", "FINISHED"}, [r.data.tags for r in jobs]
    states = slurm_cluster.wait_sacct(job, {"CANCELLED", "COMPLETED", "FAILED"})
    assert states and set(states.values()) != {"RUNNING"}, states


# --------------------------------------------------------------------------- without Slurm
def test_detach_refuses_at_once_with_one_line(tmp_path):
    env = services.clean_env(PATH=str(tmp_path / "no-slurm-here"))
    p = _ctl("detach", "deph=3", "-m", cwd=tmp_path, env=env)
    assert p.returncode == 2 and p.stderr.startswith("error: ") and "depth" in p.stderr, p.stderr
    p = _ctl("detach", "alpha=1,2", "-m", cwd=tmp_path, env=env)
    assert p.returncode == 2 and "rankexp detach needs Slurm, and sbatch/sinfo are not on PATH" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and not (tmp_path / "multirun").exists()


def test_status_of_what_is_no_detached_sweep_is_one_line_and_exit_2(tmp_path):
    env = services.clean_env(PATH=str(tmp_path / "no-slurm-here"))
    p = _ctl("status", str(tmp_path), cwd=tmp_path, env=env)
    assert p.returncode == 2 and p.stderr.strip() == (
        f"error: {tmp_path} is no detached sweep (it has no {sweepctl.DETACHED_FILE}); a sweep in "
        "the foreground stops with Ctrl-C"), p.stderr
    p = _ctl("cancel", "12345", cwd=tmp_path, env=env)
    assert p.returncode == 2 and p.stderr.startswith("error: '12345' is no directory"), p.stderr


def test_eta_is_the_rate_jobs_ended_at_so_far():
    assert sweepctl.eta_seconds(2, 4, elapsed=100.0) == pytest.approx(100.0)  # 2 ended in 100 s
    assert sweepctl.eta_seconds(0, 4, elapsed=100.0) is None
    assert sweepctl.eta_seconds(4, 4, elapsed=100.0) == 0.0
