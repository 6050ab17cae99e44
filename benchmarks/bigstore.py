"""A 10,000-run store answers in seconds: the resume lookup, ``load_runs``, a heatmap.

    python -m benchmarks.bigstore --rev cd9a9b7      # this tree vs cd9a9b7 (before → after)
    python -m benchmarks.bigstore --runs 1000        # a smaller store

The store (built once, kept in ``$XDG_CACHE_HOME/rankexp-bench/`` or ``--store DIR``) is an
SQLite file written through ``MlflowClient.log_batch``, one client per worker process: 4
experiments of ``--runs`` / 4 FINISHED job runs each, in sweeps of 90 (α × β × norm placement,
a seed offset per sweep) under their parent run, tagged as rankexp tags them (``config_hash``,
owner, ``seed_std.*``), 27 params, 15 scalars and 5 per-layer series of 97 points (~500
points per run).  Timed, each in a fresh process of each tree on one torch thread (wall
seconds, CPU seconds and peak RSS from ``os.wait4``'s rusage):

* ``resume``: what a sweep of ``--configs`` configs asks the store before its first job runs —
  the store checked, the experiment prepared, its dead runs reconciled, the finished configs
  of the sweep looked up (half of them in the store);
* ``load_runs``: :func:`analysis.core.runs.load_runs` of one experiment;
* ``heatmap``: ``python -m analysis heatmap --experiment exp0 --x alpha --y beta``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sqlite3
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from .common import ROOT, checkout, commit, header, load, run

EXPERIMENTS, SWEEP, DEPTH = 4, 90, 48
ALPHAS, BETAS = (0.25, 0.5, 1, 2, 4), (0.0625, 0.125, 0.25, 0.5, 1, 2, 4, 8, 16)
SCALARS = ("erank_io", "stable_rank_io", "log_gain_io", "erank_min", "rms_final", "stream_kappa",
           "branch_ratio_first", "branch_ratio_last", "build_seconds", "measure_seconds",
           "build_cpu_seconds", "measure_cpu_seconds", "peak_memory_gb", "seed_chunk", "erank_last")
SERIES = ("erank_profile", "log_gain_profile", "stable_rank_profile", "rms", "branch_ratio")
TARGETS = {"resume": (2.0, 200), "load_runs": (5.0, None), "heatmap": (15.0, None)}


def chash(exp: int, sweep: int, job: int) -> str:
    return hashlib.sha256(f"{exp}/{sweep}/{job}".encode()).hexdigest()[:16]


def write_sweep(uri: str, exp_id: str, exp: int, sweep: int) -> None:
    """One sweep of :data:`SWEEP` FINISHED jobs under its FINISHED parent run."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient
    c, t0 = MlflowClient(uri), 1_700_000_000_000 + (exp * 1000 + sweep) * 3_600_000
    owner = {"rankexp.host": "node1", "rankexp.pid": "4242", "rankexp.pid_start": "1",
             "rankexp.heartbeat": str(t0 // 1000), "mlflow.user": "bench", "git_commit": "0" * 40}
    sweep_id = f"/scratch/multirun/exp{exp}/{sweep}"
    parent = c.create_run(exp_id, t0, {**owner, "rankexp.role": "sweep", "sweep_id": sweep_id,
                                       "jobs_total": str(SWEEP)}, f"sweep{sweep}").info.run_id
    for job in range(SWEEP):
        placement, a, b = ("pre", "post")[job % 2], ALPHAS[job // 2 % 5], BETAS[job // 10]
        p = {"norm.placement": placement, "alpha": a, "beta": b, "depth": DEPTH, "width": 256,
             "expansion": 1, "matrices": 2, "activation": "relu", "seed": sweep, "seeds": 12,
             "beta_eff": b, "nominal_ratio": b * a * a, "depth_factor": b * a * a * DEPTH ** .5,
             "beta_scaling": "const", "bias": 0.0, "dtype": "float64", "init": "gaussian",
             "model.name": "mlp", "norm.op": "rmsnorm", "norm.out": "none", "norm.pre": "rmsnorm",
             "norm.post": "none", "size": "full", "skip_every": 1, "task.name": "measure",
             "task.probes": '["io_jacobian", "profile"]', "task.options.stream.inputs": 1}
        tags = {**owner, "config_hash": chash(exp, sweep, job), "mlflow.parentRunId": parent,
                "sweep_id": sweep_id, "job_dir": f"{sweep_id}/{job}", "task": "measure",
                "device": "cuda:0", "torch_threads": "1", "rankexp.claim_time": str(t0 + job),
                "overrides": f"experiment=exp{exp} seed={sweep} alpha={a} beta={b}",
                **{f"seed_std.{k}": "0.01" for k in SCALARS[:8]}}
        run = c.create_run(exp_id, t0 + job * 1000, tags, f"α{a}·β{b}·{placement}").info.run_id
        ts = t0 + job * 1000 + 500
        v = (job % 97 + 1) / 100 * (sweep % 7 + 1)
        metrics = [Metric(k, v + i, ts, 0) for i, k in enumerate(SCALARS)] + [
            Metric(k, v / (layer + 1), ts, layer) for k in SERIES for layer in range(DEPTH * 2 + 1)]
        c.log_batch(run, metrics, [Param(k, str(x)) for k, x in p.items()], [RunTag("run", "1")])
        c.set_terminated(run, "FINISHED", ts)
    c.set_terminated(parent, "FINISHED", t0 + SWEEP * 1000)


def build(folder: Path, runs: int, workers: int) -> str:
    """The store of ``runs`` job runs in ``folder`` (built, or the one built before); built in
    ``/dev/shm`` where there is one (no fsync per commit), then moved."""
    from mlflow.tracking import MlflowClient

    from rankexp import tracking
    db = folder / "mlflow.db"
    if db.is_file():
        return f"sqlite:///{db}"
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="bigstore-", dir=shm) as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        tracking.check_store(uri)  # the schema, and the write-ahead log
        client = MlflowClient(uri)  # artifacts where the store will be
        ids = [client.create_experiment(f"exp{e}", (folder / "mlartifacts" / f"exp{e}").as_uri())
               for e in range(EXPERIMENTS)]
        sweeps = [(e, s) for s in range(-(-runs // (SWEEP * EXPERIMENTS)))
                  for e in range(EXPERIMENTS)]
        t0 = time.perf_counter()
        with ProcessPoolExecutor(workers) as pool:
            work = pool.map(write_sweep, [uri] * len(sweeps), [ids[e] for e, _ in sweeps],
                            *zip(*sweeps, strict=True))
            for n, _ in enumerate(work, 1):
                if n % 10 == 0 or n == len(sweeps):
                    print(f"  built {n * SWEEP} of {len(sweeps) * SWEEP} runs in "
                          f"{time.perf_counter() - t0:.0f} s", flush=True)
        with sqlite3.connect(f"{tmp}/mlflow.db") as c:
            c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        folder.mkdir(parents=True, exist_ok=True)
        shutil.move(f"{tmp}/mlflow.db", f"{db}.part")
        os.replace(f"{db}.part", db)
    return f"sqlite:///{db}"


RESUME = """import sys
from rankexp import tracking
uri, name, hashes = sys.argv[1], sys.argv[2], sys.argv[3:]
tracking.check_store(uri)
exp = tracking.prepare_experiment(uri, name)
tracking.reconcile(uri, exp, 3600.0)
print(sum(tracking.find_finished(uri, exp, h) is not None for h in hashes), "finished")
"""
LOAD = """import sys
from analysis.core.runs import load_runs
print(len(load_runs(sys.argv[2], sys.argv[1], cache_dir=False)), "runs")
"""


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rev", help="the commit to compare with (a git worktree of it)")
    p.add_argument("--runs", type=int, default=10_000, help="job runs in the store")
    p.add_argument("--configs", type=int, default=200, help="configs of the resumed sweep")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--store", type=Path, help="its folder (default: in $XDG_CACHE_HOME)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = p.parse_args(argv)
    header("benchmarks.bigstore")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rankexp-bench"
    uri = build(args.store or cache / f"bigstore-{args.runs}", args.runs, args.workers)
    hashes = [chash(0, s, j) for s in range(args.configs // SWEEP + 1) for j in range(SWEEP)]
    half = args.configs // 2  # found; the rest are new configs
    hashes = hashes[:half] + [f"{i:016x}" for i in range(args.configs - half)]
    rows = {"resume": ["-c", RESUME, uri, "exp0", *hashes], "load_runs": ["-c", LOAD, uri, "exp0"],
            "heatmap": ["-m", "analysis", "heatmap", "--experiment", "exp0", "--x", "alpha",
                        "--y", "beta", "--uri", uri]}
    with checkout(args.rev) if args.rev else tempfile.TemporaryDirectory() as before, \
            tempfile.TemporaryDirectory(prefix="bigstore-out-") as out:
        trees = {**({args.rev: Path(before)} if args.rev else {}), f"this tree ({commit()})": ROOT}
        got = {(r, v): [run(a, tree, Path(out)) for _ in range(args.rounds)]
               for r, a in rows.items() for v, tree in trees.items()}
    print(f"a store of {uri.split('/')[-2]}: {args.configs} configs resumed (half FINISHED), "
          f"experiment exp0 ({args.runs // EXPERIMENTS} runs), min of {args.rounds} fresh "
          "processes")
    for r, (limit_s, limit_mb) in TARGETS.items():
        cells = [f"{min(t[0] for t in got[r, v]):.2f} s (CPU {min(t[1] for t in got[r, v]):.2f} s)"
                 f" / {min(t[2] for t in got[r, v]):.0f} MB" for v in trees]
        target = f"≤ {limit_s:g} s" + (f" and ≤ {limit_mb} MB" if limit_mb else "")
        print(f"  {r:10s} {' → '.join(cells)}  [target {target}]  ({', '.join(trees)})")
    print(f"  ({load()})", flush=True)


if __name__ == "__main__":
    main()
