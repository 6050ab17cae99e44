"""Benchmark of the analysis loader: N finished runs with per-layer series into one table.

    python -m benchmarks.bench_loader                 # 1,000 runs × 3 series × 96 layers
    python -m benchmarks.bench_loader --runs 200      # a smaller store

(a) A SQLite MLflow store holding N runs logged the way a ``measure`` job logs them
    (:class:`rankexp.tracking.RunLogger`: ~40 params, 6 tags, 10 scalars and 3 per-layer
    series of L = 96 points). Built once under ``--store`` and reused (not timed).
(b) v1's way: one ``metric_history`` call per run and series, timed on ``--v1-sample``
    runs and scaled to N.
(c) The loader, cold: :func:`analysis.core.runs.load_runs` with ``series=`` and an empty series
    cache — bulk reads (one query per series key and chunk of runs). Target ≤ 30 s.
(d) The same again, warm: series served from the cache (run id + finish time).

Every loaded series is checked against the values that were logged.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from analysis.core import runs as runs_mod
from rankexp import tracking

from .common import header

EXPERIMENT = "bench_loader"
KEYS = ("erank_profile", "stable_rank_profile", "rms")
LAYERS = 96


def logged_series(i: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Run ``i``'s series: deterministic, distinct per run and key."""
    layers = np.arange(1, LAYERS + 1)
    rng = np.random.default_rng(i)
    return {k: (layers, rng.random(LAYERS) + j) for j, k in enumerate(KEYS)}


def params_of(i: int) -> dict:
    """A measure job's flattened config (the params every real run carries)."""
    alphas, depths = (0.5, 1, 2, 3, 4), (12, 24, 48, 96, 192, 384)
    return {
        "depth": depths[i % len(depths)], "width": 256, "expansion": 4, "matrices": 2,
        "alpha": alphas[(i // len(depths)) % len(alphas)], "beta": 1.0, "beta_scaling": "const",
        "activation": "relu", "skip_every": 1, "seeds": 4, "seed": i, "device": "auto",
        "dtype": "float64", "lr": None, "model.name": "mlp", "norm.placement": "pre",
        "norm.op": "rmsnorm", "task.name": "measure",
        "task.probes": ["io_jacobian", "profile", "stream"], "task.options": {},
        "data.root": "../shared/data", "data.source": "auto", "data.cache_dir": ".cache",
        "data.download": False, "tracking.uri": None, "tracking.experiment": EXPERIMENT,
        "tracking.enabled": True, "tracking.resume": True, "tracking.force": False,
        "tracking.log_arrays": True, "beta_eff": 1.0, "nominal_ratio": 1.0, "depth_factor": 9.8,
        "size": "full", "experiment": "bench", "hydra.job": "bench", "job.index": i,
        "job.sweep": "bench-sweep", "job.kind": "synthetic",
    }


def build_store(uri: str, runs: int) -> float:
    exp_id = tracking.prepare_experiment(uri, EXPERIMENT)
    t0 = time.perf_counter()
    for i in range(runs):
        tags = {"config_hash": f"{i:016x}", "git_commit": "bench", "overrides": f"seed={i}",
                "device": "cpu", "task": "measure", "sweep_id": "bench"}
        with tracking.RunLogger(uri, exp_id, f"bench·{i}", params_of(i), tags) as run:
            scalars = {f"scalar_{j}": float(i + j) for j in range(10)}
            run.log_metrics(scalars, logged_series(i))
        if (i + 1) % 100 == 0:
            print(f"    logged {i + 1}/{runs} runs ({time.perf_counter() - t0:.0f} s)", flush=True)
    return time.perf_counter() - t0


def check(table) -> None:
    columns = [runs_mod.series_column(k) for k in KEYS]
    for seed, *loaded in zip(table["seed"], *(table[c] for c in columns), strict=True):
        for (k, (steps, values)), got in zip(logged_series(int(seed)).items(), loaded,
                                             strict=True):
            if got is None or not (np.array_equal(got[0], steps) and np.array_equal(got[1], values)):
                raise SystemExit(f"run seed={seed}: series {k} differs from what was logged")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--v1-sample", type=int, default=50, help="runs timed the v1 way (scaled)")
    p.add_argument("--store", default=".cache/bench-loader",
                   help="folder of the benchmark store (reused when it holds --runs runs)")
    args = p.parse_args(argv)
    store = Path(args.store) / f"runs{args.runs}"
    uri = f"sqlite:///{(store / 'mlflow.db').resolve()}"
    print(header("benchmarks.bench_loader (the analysis loader)"))
    print(f"(a) store {uri}: {args.runs} runs × {len(KEYS)} series × {LAYERS} layers")
    if not (store / "complete").exists():
        shutil.rmtree(store, ignore_errors=True)
        store.mkdir(parents=True)
        cwd = os.getcwd()
        os.chdir(store)  # RunLogger's artifact root (./mlruns) stays inside the store folder
        try:
            print(f"    built in {build_store(uri, args.runs):.0f} s")
        finally:
            os.chdir(cwd)
        (store / "complete").touch()

    t0 = time.perf_counter()  # a filter sends runs_table through mlflow.search_runs, as v1
    tracking.runs_table([EXPERIMENT], uri, "attributes.run_name != ''")
    v1_table = time.perf_counter() - t0
    sample = runs_mod.load_runs(EXPERIMENT, uri).head(args.v1_sample)
    t0 = time.perf_counter()
    for rid in sample["run_id"]:
        for k in KEYS:
            tracking.metric_history(uri, rid, k)
    per_run = (time.perf_counter() - t0) / len(sample)
    v1 = v1_table + per_run * args.runs
    print(f"(b) v1: table via mlflow.search_runs {v1_table:.1f} s, then one metric_history call "
          f"per run and series {per_run * 1e3:.0f} ms per run (timed on {len(sample)}) "
          f"→ {v1:.1f} s for {args.runs} runs")

    with tempfile.TemporaryDirectory() as cache:
        runs_mod.forget()
        t0 = time.perf_counter()
        table = runs_mod.load_runs(EXPERIMENT, uri, series=KEYS, cache_dir=cache)
        cold = time.perf_counter() - t0
        check(table)
        runs_mod.forget()  # as a new process: only the disk cache
        t0 = time.perf_counter()
        again = runs_mod.load_runs(EXPERIMENT, uri, series=KEYS, cache_dir=cache)
        warm = time.perf_counter() - t0
        check(again)
    assert len(table) == args.runs, len(table)
    print(f"(c) loader, cold cache: {cold:.1f} s for {len(table)} runs "
          f"({v1 / cold:.0f}× faster than v1) [target ≤ 30 s]")
    print(f"(d) loader, warm cache: {warm:.1f} s")


if __name__ == "__main__":
    main()
