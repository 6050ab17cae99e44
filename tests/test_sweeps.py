"""Parallel sweeps against one SQLite store: first writers, same-second launches."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO, runs_in
from omegaconf import OmegaConf

from rankexp.app import idle_cores, job_threads

TINY = ("width=8", "depth=3", "seeds=1")


@pytest.mark.parametrize("workers", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_fresh_sqlite_store_under_parallel_first_jobs(cli, workers):
    """Hydra's own sweeper (no whole-sweep check, no parent run to pre-create anything):
    ``workers`` joblib workers hit a brand-new store at once (4 under ``-m slow``)."""
    alphas = [str(a) for a in range(1, workers + 1)]
    cli(f"alpha={','.join(alphas)}", *TINY, "hydra/launcher=joblib",
        f"hydra.launcher.n_jobs={workers}", "hydra/sweeper=basic", "tracking.experiment=fresh", "-m")
    runs = runs_in(cli.uri, "fresh")
    assert sorted(r.info.status for r in runs) == ["FINISHED"] * workers
    assert runs_in(cli.uri, "Default") == []
    assert sorted(r.data.params["alpha"] for r in runs) == [f"{a}.0" for a in alphas]
    # width 8: one torch thread each (test_threads_fit_the_job for the rule)
    assert {r.data.tags["torch_threads"] for r in runs} == {"1"}


def test_threads_fit_the_job(monkeypatch):
    """``threads=auto``: a joblib worker gets its share of the cores this process may use, a
    Slurm task its ``cpus_per_task``, a single job the cores other processes leave idle (never
    all cores' threads on a busy machine: they wait for each other); one below width 128."""
    from types import SimpleNamespace as S

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(os, "getloadavg", lambda: (12.2, 12.0, 12.0))
    for var in ("SLURM_JOB_ID", "SLURM_CPUS_PER_TASK"):
        monkeypatch.delenv(var, raising=False)
    joblib = OmegaConf.create({"_target_": "hydra_plugins.hydra_joblib_launcher.joblib_launcher."
                                           "JoblibLauncher", "n_jobs": 3})
    wide, narrow = S(threads="auto", width=256), S(threads="auto", width=64)
    idle_cores.cache_clear()
    assert job_threads(wide, None) == 4  # 16 cores, 12 busy: 4 idle of its 8
    assert job_threads(wide, joblib) == 2 and job_threads(narrow, joblib) == 1
    monkeypatch.setattr(os, "getloadavg", lambda: (40.0, 40.0, 40.0))
    assert job_threads(wide, None) == 4  # a later job of this process: its own load
    idle_cores.cache_clear()
    assert job_threads(wide, None) == 1
    assert job_threads(S(threads=6, width=8), None) == 6  # the knob, as given
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")
    assert job_threads(wide, None) == 3  # its allocation, whatever the node's load


def test_same_second_sweeps_in_parallel_do_not_collide(cli):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RANKEXP_STAMP"))}
    env["PYTHONPATH"] = str(REPO)
    procs = [
        subprocess.Popen([sys.executable, "-m", "rankexp", f"alpha={a}", "depth=2,3", *TINY[:1], "seeds=1", "-m"],
                         cwd=cli.cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for a in (1, 2)
    ]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    runs = runs_in(cli.uri)
    parents = [r for r in runs if r.data.tags.get("rankexp.role") == "sweep"]
    jobs = [r for r in runs if r.data.tags.get("rankexp.role") != "sweep"]
    assert len(parents) == 2 and len(jobs) == 4
    assert len({p.data.tags["sweep_id"] for p in parents}) == 2
    for p in parents:
        children = [j for j in jobs if j.data.tags["mlflow.parentRunId"] == p.info.run_id]
        assert len(children) == 2
        assert len({c.data.params["alpha"] for c in children}) == 1
    sweep_dirs = list((cli.cwd / "multirun").glob("*/*"))
    assert len(sweep_dirs) == 2
    for d in sweep_dirs:
        assert sorted(x.name for x in d.iterdir() if x.is_dir()) == ["0", "1"]
