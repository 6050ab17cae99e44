"""Per-job overhead of a Hydra multirun of trivial jobs through each launcher config.

Runs `app.py x=range(N) -m` (a task that returns x*x) with hydra/launcher=basic (in-process,
sequential), local (joblib) and slurm (submitit job array), using this repository's
conf/hydra/launcher/*.yaml, and reports the wall time from command start to Hydra's exit
and wall/N. For slurm, SLURM_CONF must point at a running cluster
(`eval "$(launchers/slurm-cluster.sh env)"`); `--crash` also times how long a sweep with
one job that SIGKILLs itself takes to fail (submitit needs `sacct` for this).

    python launchers/bench_launchers.py --jobs 20
    python launchers/bench_launchers.py --rankexp --launchers local slurm

`--rankexp --launchers basic local slurm slurm-packed slurm-detached` times real rankexp
jobs instead (`slurm-packed`: `--jobs-per-task` jobs in each array task; `slurm-detached`:
`hydra.launcher.detach=true`, timed until the jobs closed the parent, with the time the command
took to return): a `python -m rankexp task=measure` sweep of
`--jobs` tiny configs (d=8, L=2, one seed: the measurement itself takes milliseconds, so
what is left is the per-job overhead: interpreter and torch start-up, Hydra, MLflow run,
params, metrics, artifacts), each launcher in its own directory with its own SQLite store.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONF = Path(__file__).resolve().parent.parent / "conf"

APP = """
import os, signal
import hydra

@hydra.main(version_base="1.3", config_path=".", config_name="bench")
def main(cfg):
    if cfg.crash and cfg.x == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    return cfg.x * cfg.x

if __name__ == "__main__":
    main()
"""

CONFIG = f"""
x: 0
crash: false
hydra:
  searchpath: [file://{CONF}]
"""


def timed(cmd, cwd):
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    return time.perf_counter() - t0, proc


REPO = CONF.parent
RANKEXP_JOB = ("width=8", "depth=2", "seeds=1")
LAUNCHER_ARGS = {
    "slurm": ("hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=2"),
    "local": (),  # joblib, n_jobs=2 (conf/hydra/launcher/local.yaml)
    "basic": (),  # sequential, in the launching process
}


#: variants of the slurm launcher: ``slurm-packed`` runs --jobs-per-task jobs in each array
#: task (hydra.launcher.jobs_per_task); ``slurm-detached`` returns once the array is submitted
#: (hydra.launcher.detach=true) — its wall time is until the jobs closed the parent run
VARIANTS = {"slurm-packed": "hydra.launcher.jobs_per_task={k}", "slurm-detached": "hydra.launcher.detach=true"}


def _sweep_runs(cwd: Path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{cwd / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rankexp")
    runs = client.search_runs([exp.experiment_id], max_results=10_000)
    parents = [r for r in runs if r.data.tags.get("rankexp.role") == "sweep"]
    return parents, [r for r in runs if r.data.tags.get("rankexp.role") != "sweep"]


def _one_rankexp(launcher: str, args, work: Path, env: dict) -> tuple[float, float, float | None]:
    """(wall s until every run is FINISHED and the parent closed, mean measure_seconds, s until
    the command returned: detached only)."""
    cwd = work / launcher
    cwd.mkdir()
    extra = VARIANTS[launcher].format(k=args.jobs_per_task) if launcher in VARIANTS else None
    base = launcher.split("-")[0]
    cmd = [sys.executable, "-m", "rankexp", *RANKEXP_JOB, f"seed=range(0,{args.jobs})",
           f"hydra/launcher={base}", *LAUNCHER_ARGS.get(base, ()), *([extra] if extra else []),
           "-m"]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    returned = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(f"{launcher} failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    while launcher == "slurm-detached":  # the jobs close the parent themselves
        (parent,), _ = _sweep_runs(cwd)
        if parent.info.status != "RUNNING":
            break
        time.sleep(0.5)
    wall = time.perf_counter() - t0
    (parent,), runs = _sweep_runs(cwd)
    assert len(runs) == args.jobs and {r.info.status for r in runs} == {"FINISHED"}
    assert parent.info.status == "FINISHED" and parent.data.metrics["jobs_finished"] == args.jobs
    measure = sum(r.data.metrics["measure_seconds"] for r in runs) / len(runs)
    return wall, measure, (returned if launcher == "slurm-detached" else None)


def bench_rankexp(args):
    """Wall time of a `python -m rankexp` measure sweep of args.jobs tiny jobs per launcher."""
    work = Path(tempfile.mkdtemp(prefix="rankexp-bench-launchers-rankexp-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RANKEXP_"))}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    print(f"{args.jobs} jobs of `python -m rankexp {' '.join(RANKEXP_JOB)} seed=range(0,N) -m`"
          f" (slurm-packed: {args.jobs_per_task} jobs per array task)")
    print(f"{'launcher':>14} {'jobs':>5} {'wall_s':>8} {'per_job_s':>10} {'measure_s/job':>14} "
          f"{'returned_s':>11}")
    per_job = {}
    for launcher in args.launchers:
        wall, measure, returned = _one_rankexp(launcher, args, work, env)
        per_job[launcher] = wall / args.jobs
        print(f"{launcher:>14} {args.jobs:>5} {wall:>8.2f} {wall / args.jobs:>10.3f} "
              f"{measure:>14.4f} {'' if returned is None else f'{returned:.2f}':>11}")  # fmt: skip
    if {"slurm", "slurm-packed"} <= set(per_job):
        print(f"per-job overhead, slurm / slurm-packed: {per_job['slurm'] / per_job['slurm-packed']:.2f}×")
    print(f"(sweep dirs and stores under {work})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--launchers", nargs="+", default=["basic", "local", "slurm"])
    ap.add_argument("--jobs-per-task", type=int, default=5, help="slurm-packed: jobs per array task")
    ap.add_argument("--crash", action="store_true", help="also time a sweep whose job 0 dies")
    ap.add_argument("--rankexp", action="store_true", help="time rankexp measure sweeps instead")
    args = ap.parse_args()
    if any(x.startswith("slurm") for x in args.launchers) and not os.environ.get("SLURM_CONF"):
        sys.exit('SLURM_CONF is not set: eval "$(launchers/slurm-cluster.sh env)" first')

    if args.rankexp:
        bench_rankexp(args)
        return
    work = Path(tempfile.mkdtemp(prefix="rankexp-bench-launchers-"))
    (work / "app.py").write_text(APP)
    (work / "bench.yaml").write_text(CONFIG)
    base = [sys.executable, "app.py"]

    single, proc = timed([*base, "x=1"], work)
    if proc.returncode:
        sys.exit(proc.stderr)
    print(f"one job, no multirun: {single:.2f} s (Python + Hydra start-up)")
    print(f"{'launcher':>10} {'jobs':>5} {'wall_s':>8} {'per_job_s':>10}")
    for launcher in args.launchers:
        cmd = [*base, f"hydra/launcher={launcher}", f"x=range(0,{args.jobs})", "-m"]
        wall, proc = timed(cmd, work)
        if proc.returncode:
            sys.exit(f"{launcher} failed:\n{proc.stderr[-3000:]}")
        print(f"{launcher:>10} {args.jobs:>5} {wall:>8.2f} {wall / args.jobs:>10.3f}")
    if args.crash:
        for launcher in [x for x in args.launchers if x == "slurm"]:
            wall, proc = timed(
                [*base, f"hydra/launcher={launcher}", "crash=true", "x=0,1", "-m"], work
            )
            print(
                f"{launcher}: sweep with a SIGKILLed job exited {proc.returncode} after {wall:.1f} s"
            )
    print(f"(sweep dirs under {work})")


if __name__ == "__main__":
    main()
