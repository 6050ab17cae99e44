"""Slurm problems are found before anything exists (issue 22, row 5): ``hydra/launcher=slurm``'s
callback (:class:`rankexp.sweepctl.SlurmCheck`) asks the cluster (``sinfo``, ``sbatch --help``)
and checks the time-limit signal, then exits 2 listing every problem, with nothing created.
Against the real test cluster (launchers/slurm-cluster.sh: one node, partition ``cpu``)."""

from __future__ import annotations

import subprocess

import services
from services import rankexp, sweep_runs

SMALL = ("depth=2", "width=8", "seeds=1", "task.probes=[io_jacobian]", "hydra/launcher=slurm")


def nothing_created(cwd) -> None:
    assert not list(cwd.glob("multirun/*/*")), list(cwd.rglob("*"))
    assert not (cwd / "mlflow.db").exists() or not sum(map(len, sweep_runs(f"sqlite:///{cwd / 'mlflow.db'}")))


def test_a_machine_without_slurm_is_told_so_before_anything_exists(tmp_path):
    env = services.clean_env(PATH=str(tmp_path / "no-slurm-here"))  # no sbatch, no sinfo
    res = rankexp(*SMALL, "alpha=1,2", "hydra.launcher.timeout_min=1", "hydra.launcher.signal_delay_s=60",
                  "-m", cwd=tmp_path, env=env, timeout=120)
    assert res.returncode == 2, res.output[-3000:]
    assert "needs Slurm, and sbatch/sinfo are not on PATH" in res.output, res.output[-3000:]
    assert "hydra.launcher.signal_delay_s=60 — not below the time limit" in res.output, res.output[-3000:]
    assert "Traceback" not in res.output
    nothing_created(tmp_path)


def node_cpus(env: dict) -> int:
    """The test node's CPUs (the machine's when the cluster started)."""
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
