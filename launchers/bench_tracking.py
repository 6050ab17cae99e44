"""How many runs per second an `mlflow server` accepts from parallel writers, and whether
every metric point arrived.

Each writer process creates `--runs` runs in one experiment; per run it logs a few params,
then `--steps` `log_batch` calls of `--metrics` metrics each (step = 0..steps-1), then
ends the run: 2 + steps requests per run. Writers import MLflow first and start together;
the clock runs from their common start to the last writer's end. Afterwards every run's
every metric history is read back and compared point by point.

    python launchers/bench_tracking.py                         # sqlite and postgres servers
    python launchers/bench_tracking.py --backend sqlite --writers 8 --runs 25
    python launchers/bench_tracking.py --uri http://127.0.0.1:5000   # an existing server

Without --uri, each backend gets a private server from launchers/mlflow-server.sh in a
temporary state dir on a free port, stopped afterwards. The result table goes to stdout;
`--json PATH` also writes it as JSON.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
SERVER_SCRIPT = HERE / "mlflow-server.sh"


def value(writer: int, run: int, key: int, step: int) -> float:
    """The value a writer logs, so the reader can check each point, not only the count."""
    return writer * 1e6 + run * 1e3 + key * 10 + step * 1e-3


def writer_main(uri, experiment_id, writer, n_runs, n_metrics, n_steps, ready, go, out):
    os.environ["MLFLOW_TRACKING_URI"] = uri
    os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"  # one line per run otherwise
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    client = MlflowClient(uri)
    client.search_experiments(max_results=1)  # open the HTTP session before the clock starts
    ready.put(writer)
    go.wait()
    t0 = time.perf_counter()
    run_ids, errors = [], 0
    for r in range(n_runs):
        try:
            run = client.create_run(experiment_id, run_name=f"w{writer}-r{r}")
            rid = run.info.run_id
            client.log_batch(
                rid,
                params=[Param("writer", str(writer)), Param("run", str(r)), Param("bench", "1")],
            )
            now = int(time.time() * 1000)
            for s in range(n_steps):
                client.log_batch(
                    rid,
                    metrics=[
                        Metric(f"m{k}", value(writer, r, k, s), now, s) for k in range(n_metrics)
                    ],
                )
            client.set_terminated(rid)
            run_ids.append((rid, writer, r))
        except Exception as e:  # counted, reported, and the run is then missing in the check
            errors += 1
            print(f"writer {writer} run {r}: {type(e).__name__}: {e}", file=sys.stderr)
    out.put((writer, time.perf_counter() - t0, run_ids, errors))


def verify(uri, run_ids, n_metrics, n_steps):
    """Read back every metric history; return (points found, points expected, bad runs)."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)

    def check(item):
        rid, w, r = item
        found, bad = 0, False
        for k in range(n_metrics):
            hist = client.get_metric_history(rid, f"m{k}")
            got = {(m.step, m.value) for m in hist}
            want = {(s, value(w, r, k, s)) for s in range(n_steps)}
            found += len(got & want)
            bad |= got != want
        return found, bad

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(check, run_ids))
    return (
        sum(f for f, _ in results),
        len(run_ids) * n_metrics * n_steps,
        sum(b for _, b in results),
    )


def bench(uri, args, label):
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    # Created here, before the fan-out: parallel set_experiment on a new name races.
    exp_id = client.create_experiment(f"bench-{label}-{uuid.uuid4().hex[:8]}")
    ctx = mp.get_context("spawn")  # no shared HTTP connections inherited from this process
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(
            target=writer_main,
            args=(uri, exp_id, w, args.runs, args.metrics, args.steps, ready, go, out),
        )
        for w in range(args.writers)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=300)
    t0 = time.perf_counter()
    go.set()
    results = [out.get(timeout=3600) for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
    run_ids = [x for _, _, ids, _ in results for x in ids]
    errors = sum(e for *_, e in results)
    t1 = time.perf_counter()
    found, expected, bad = verify(uri, run_ids, args.metrics, args.steps)
    verify_s = time.perf_counter() - t1
    listed = len(client.search_runs([exp_id], max_results=50000))
    n_runs = args.writers * args.runs
    requests = len(run_ids) * (3 + args.steps)  # create, params, steps x batch, terminate
    return {
        "backend": label,
        "writers": args.writers,
        "runs": n_runs,
        "runs_ok": len(run_ids),
        "runs_listed": listed,
        "errors": errors,
        "wall_s": round(wall, 2),
        "runs_per_s": round(len(run_ids) / wall, 1),
        "requests_per_s": round(requests / wall, 1),
        "points_expected": n_runs * args.metrics * args.steps,
        "points_found": found,
        "runs_with_wrong_points": bad,
        "verify_s": round(verify_s, 1),
        "all_arrived": found == n_runs * args.metrics * args.steps and listed == n_runs and not bad,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def with_server(backend, workers, fn):
    state = tempfile.mkdtemp(prefix=f"rankexp-bench-{backend}-")
    env = dict(
        os.environ,
        RANKEXP_MLFLOW_DIR=state,
        RANKEXP_MLFLOW_PORT=str(free_port()),
        RANKEXP_PG_PORT=str(free_port()),
        RANKEXP_MLFLOW_WORKERS=str(workers),
    )
    cmd = [str(SERVER_SCRIPT)]
    t0 = time.perf_counter()
    os.chmod(state, 0o755)  # PostgreSQL runs as user postgres and must reach its data dir
    proc = subprocess.run(
        [*cmd, "start", "--backend", backend], env=env, capture_output=True, text=True
    )
    if proc.returncode:
        subprocess.run([*cmd, "purge"], env=env, check=False, capture_output=True)
        sys.exit(f"could not start the {backend} server:\n{proc.stderr}")
    line = proc.stdout.strip()
    startup = time.perf_counter() - t0
    uri = line.split("=", 1)[1]
    try:
        result = fn(uri)
        result["server_start_s"] = round(startup, 1)
        return result
    finally:
        subprocess.run([*cmd, "purge"], env=env, check=False, capture_output=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--backend", nargs="+", default=["sqlite", "postgres"], choices=["sqlite", "postgres"]
    )
    ap.add_argument("--uri", help="benchmark this running server instead of starting one")
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--runs", type=int, default=20, help="runs per writer")
    ap.add_argument("--metrics", type=int, default=5, help="metric keys per run")
    ap.add_argument("--steps", type=int, default=10, help="points per metric key")
    ap.add_argument("--server-workers", type=int, default=4)
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()

    if args.uri:
        results = [bench(args.uri, args, "given")]
    else:
        results = [
            with_server(b, args.server_workers, lambda uri, b=b: bench(uri, args, b))
            for b in args.backend
        ]
    cols = [
        "backend",
        "writers",
        "runs",
        "wall_s",
        "runs_per_s",
        "requests_per_s",
        "points_found",
        "points_expected",
        "errors",
        "all_arrived",
        "server_start_s",
    ]
    print(" ".join(f"{c:>15}" for c in cols))
    for r in results:
        print(" ".join(f"{str(r.get(c, '-')):>15}" for c in cols))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    sys.exit(0 if all(r["all_arrived"] and not r["errors"] for r in results) else 1)


if __name__ == "__main__":
    main()
