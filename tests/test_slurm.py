"""Sweeps through a real Slurm cluster (launchers/slurm-cluster.sh: slurmctld, slurmd,
slurmdbd + MariaDB accounting, munge), submitted by hydra-submitit-launcher as users type
them: ``python -m rankexp ... hydra/launcher=slurm -m`` with ``SLURM_CONF`` exported."""

from __future__ import annotations

import re
from pathlib import Path

import services
from services import rankexp, sweep_runs

slurm_cluster = services.slurm_cluster  # session fixture (tests/services.py)

# This node has 2 CPUs: one CPU and 2 GB per array task, so two tasks run at once.
SLURM = (
    "hydra/launcher=slurm",
    "hydra.launcher.cpus_per_task=1",
    "hydra.launcher.mem_gb=2",
    "hydra.launcher.timeout_min=10",
)
TIMEOUT = 300  # a sweep that has not returned by then is a hang: killed, test failed


def submitit_arrays(cwd: Path) -> tuple[Path, dict[str, list[str]]]:
    """The sweep dir and ``{array id: sorted task ids}`` from its ``.submitit`` folder."""
    (sweep,) = [p for p in cwd.glob("multirun/*/*") if p.is_dir()]
    sub = sweep / ".submitit"
    scripts = sorted(sub.glob("*/*_submission.sh"))
    arrays = {s.parent.name: [] for s in scripts}
    for d in sub.iterdir():
        m = re.fullmatch(r"(\d+)_(\d+)", d.name)
        if d.is_dir() and m:
            arrays.setdefault(m[1], []).append(d.name)
    return sweep, {k: sorted(v) for k, v in arrays.items()}


def test_sweep_is_one_slurm_array_with_four_finished_runs_under_one_parent(slurm_cluster, tmp_path):
    res = rankexp(
        "norm=post", "alpha=1,2", "depth=8,16", "width=32", *SLURM, "-m",
        cwd=tmp_path, env=slurm_cluster.env(), timeout=TIMEOUT,
    ).check()  # fmt: skip
    assert "4 finished, 0 skipped (already FINISHED), 0 failed" in res.output, res.output[-3000:]

    # one sbatch call: one submission script, one array of four tasks
    sweep, arrays = submitit_arrays(tmp_path)
    assert len(arrays) == 1, arrays
    ((array_id, tasks),) = arrays.items()
    assert tasks == [f"{array_id}_{i}" for i in range(4)]
    script = (sweep / ".submitit" / array_id / f"{array_id}_submission.sh").read_text()
    assert re.search(r"^#SBATCH --array=0-3(%\d+)?$", script, re.M), script
    assert "#SBATCH --cpus-per-task=1" in script and "#SBATCH --mem=2GB" in script

    # Slurm's accounting agrees: exactly those four allocations, all COMPLETED
    states = slurm_cluster.wait_sacct(array_id, {"COMPLETED"})
    assert states == {t: "COMPLETED" for t in tasks}, states

    # MLflow: four FINISHED runs in one experiment, nested under one FINISHED parent
    parents, jobs = sweep_runs(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0]
    assert sorted(r.info.status for r in jobs) == ["FINISHED"] * 4
    assert {r.data.tags["mlflow.parentRunId"] for r in jobs} == {parent.info.run_id}
    assert {r.info.experiment_id for r in jobs} == {parent.info.experiment_id}
    grid = {(r.data.params["alpha"], r.data.params["depth"]) for r in jobs}
    assert grid == {("1.0", "8"), ("1.0", "16"), ("2.0", "8"), ("2.0", "16")}
    assert parent.data.metrics["jobs_finished"] == 4 and parent.data.metrics["jobs_failed"] == 0

    # each run was made by exactly one array task (its submitit log names the run)
    logs = {t: (sweep / ".submitit" / t / f"{t}_0_log.out").read_text() for t in tasks}
    for r in jobs:
        owners = [t for t, text in logs.items() if f"(run {r.info.run_id})" in text]
        assert len(owners) == 1, (r.info.run_id, owners)
    assert all("Job completed successfully" in text for text in logs.values())


def test_killed_slurm_job_is_failed_in_mlflow_and_the_sweep_exits_nonzero(slurm_cluster, tmp_path):
    """The alpha=2 job SIGKILLs itself once its MLflow run exists (an OOM kill, a
    preemption): nothing in it reports. Slurm's accounting says FAILED, submitit gives up
    on its result, the sweep's exit handler marks the orphaned run FAILED — all within a
    minute — and the command exits non-zero instead of waiting forever."""
    res = rankexp(
        "norm=post", "alpha=1,2", "depth=8", "width=32", *SLURM, "-m",
        cwd=tmp_path, env=slurm_cluster.env(RANKEXP_FAULT_KILL="alpha=2"), timeout=TIMEOUT,
    )  # fmt: skip
    assert res.returncode != 0, res.output[-3000:]
    assert "1 finished, 0 skipped (already FINISHED), 1 failed" in res.output, res.output[-3000:]
    assert "has not produced any output (state: FAILED)" in res.output, res.output[-3000:]

    sweep, arrays = submitit_arrays(tmp_path)
    ((array_id, tasks),) = arrays.items()
    assert tasks == [f"{array_id}_0", f"{array_id}_1"]
    states = slurm_cluster.wait_sacct(array_id, {"COMPLETED", "FAILED"})
    assert states == {f"{array_id}_0": "COMPLETED", f"{array_id}_1": "FAILED"}, states

    parents, jobs = sweep_runs(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (parent,) = parents
    status = {r.data.params["alpha"]: r for r in jobs}
    assert sorted(status) == ["1.0", "2.0"]
    assert status["1.0"].info.status == "FINISHED"
    killed = status["2.0"]
    assert killed.info.status == "FAILED"
    assert "killed" in killed.data.tags["error"], killed.data.tags
    assert parent.info.status == "FAILED"
    assert parent.data.metrics["jobs_failed"] == 1 and parent.data.metrics["jobs_finished"] == 1
    # from the killed job's start to the sweep's verdict (parent closed FAILED): < 1 min
    seconds = (parent.info.end_time - killed.info.start_time) / 1000
    assert 0 < seconds < 60, seconds
    print(f"killed job reported FAILED {seconds:.1f} s after it started; sweep {res.seconds:.1f} s")
