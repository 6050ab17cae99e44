"""Slurm problems are found before the parent run exists (issue 22, row 5).

Against the real test cluster (launchers/slurm-cluster.sh: one node, 2 CPUs, ~21 GB, partition
``cpu``).  Before: tracebacks and a FAILED parent, found only after the parent existed; a
request Slurm can never start stayed PENDING forever with no message.  Now the whole-sweep
check asks the cluster (``sinfo``, ``sbatch --help``) and exits 2 listing every problem, with
nothing created; and a job Slurm keeps pending for a reason no wait fixes is reported and
cancelled within a minute.
"""

from __future__ import annotations

import subprocess
import time

import services
from services import rankexp, sweep_runs

SMALL = ("depth=2", "width=8", "seeds=1", "task.probes=[io_jacobian]", "hydra/launcher=slurm")


def nothing_created(cwd) -> None:
    assert not list(cwd.glob("multirun/*/*")), list(cwd.rglob("*"))
    assert not (cwd / "mlflow.db").exists() or not sum(map(len, sweep_runs(f"sqlite:///{cwd / 'mlflow.db'}")))


def test_a_machine_without_slurm_is_told_so_before_anything_exists(tmp_path):
    env = services.clean_env(PATH=str(tmp_path / "no-slurm-here"))  # no sbatch, no sinfo
    res = rankexp(*SMALL, "alpha=1,2", "-m", cwd=tmp_path, env=env, timeout=120)
    assert res.returncode == 2, res.output[-3000:]
    assert "needs Slurm, and sbatch/sinfo are not on PATH" in res.output, res.output[-3000:]
    assert "Traceback" not in res.output
    nothing_created(tmp_path)


def node_cpus(env: dict) -> int:
    """The test node's CPUs (``nproc`` when the cluster started: 1 under OMP_NUM_THREADS=1)."""
    return int(subprocess.run(["sinfo", "-h", "-o", "%c"], env=env, capture_output=True, text=True,
                              timeout=30).stdout.split()[0].rstrip("+"))


def test_requests_the_cluster_cannot_meet_are_listed_before_anything_exists(slurm_cluster, tmp_path):
    env = slurm_cluster.env()
    res = rankexp(*SMALL, "alpha=1,2", "hydra.launcher.partition=nope", "-m", cwd=tmp_path, env=env,
                  timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.output, res.output[-3000:]
    assert "hydra.launcher.partition='nope': Slurm has no such partition (it has: cpu" in res.output
    nothing_created(tmp_path)
    res = rankexp(*SMALL, "alpha=1,2", "hydra.launcher.cpus_per_task=64", "hydra.launcher.mem_gb=100000",
                  "hydra.launcher.timeout_min=60", "+hydra.launcher.additional_parameters.exclsive=true",
                  "-m", cwd=tmp_path, env=env, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.output, res.output[-3000:]
    for said in ("hydra.launcher.cpus_per_task=64 (× tasks_per_node=1) — partition cpu's largest node "
                 f"has {node_cpus(env)} CPUs", "hydra.launcher.mem_gb=100000 — partition cpu's largest "
                 "node has", "additional_parameters.exclsive: sbatch has no option --exclsive (did you "
                 "mean --exclusive?)"):
        assert said in res.output, res.output[-3000:]
    nothing_created(tmp_path)


def test_a_job_slurm_can_never_start_is_reported_and_cancelled_within_a_minute(slurm_cluster, tmp_path):
    """A request no wait fixes that the check could not see: the sweep's jobs (10-minute
    limit) are queued behind a job holding every CPU, then the partition's time limit drops to
    5 minutes, so Slurm keeps them PENDING with reason ``PartitionTimeLimit`` for ever.  The
    launcher reports each and cancels it; the sweep ends, FAILED, within a minute."""
    env = slurm_cluster.env()
    blocker = subprocess.run(["sbatch", "--parsable", "-c", str(node_cpus(env)), "-o", str(tmp_path / "blocker.out"),
                              "--wrap", "sleep 600"], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=30, check=True).stdout.strip()
    partition = ["scontrol", "update", "PartitionName=cpu"]
    proc = services.start_rankexp(*SMALL, "alpha=1,2", "hydra.launcher.timeout_min=10", "-m",
                                  cwd=tmp_path, env=env)
    try:
        for _ in range(600):  # until the sweep's two jobs wait in the queue
            queue = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T"], env=env, capture_output=True,
                                   text=True, timeout=30).stdout
            if sum("PENDING" in line for line in queue.splitlines()) >= 2 or proc.poll() is not None:
                break
            time.sleep(0.2)
        subprocess.run([*partition, "MaxTime=5"], env=env, check=True, timeout=30)
        changed = time.monotonic()
        res = services.finish(proc, timeout=150)
    finally:
        subprocess.run([*partition, "MaxTime=UNLIMITED"], env=env, check=True, timeout=30)
        subprocess.run(["scancel", blocker], env=env, timeout=30)
    assert res.returncode == 1, res.output[-3000:]
    assert res.output.count("cannot start: pending with reason PartitionTimeLimit") == 4, res.output[-3000:]  # 2 jobs × (the report, the sweep's line)
    assert "0 finished, 0 skipped (already FINISHED), 0 failed, 0 killed, 2 not run" in res.output
    assert time.monotonic() - changed < 60 + 15, time.monotonic() - changed
    (parent,), jobs = sweep_runs(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert not jobs and parent.info.status == "FAILED"
