"""What claiming a config costs a job (:func:`rankexp.tracking.claim`), measured in one run.

    python -m benchmarks.bench_claim                       # a fresh SQLite store
    python -m benchmarks.bench_claim --uri http://127.0.0.1:5000   # a tracking server

The store first holds ``--runs`` FINISHED job runs of other configs in the experiment (a
sweep's history: the claim searches by the ``config_hash`` tag among them).  Then, for
``--jobs`` new configs, round-robin: (a) ``create_run`` alone — what a job paid before the
claim — and (b) ``create_run`` + ``claim`` (uncontested: the common case, one ``search_runs``),
(c) a contested claim: a second claimant of a config another live run holds, standing down
(``claim`` + ``stand_down``: three more requests, only for the loser).  Prints the medians and
the claim's extra cost per job.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from rankexp import tracking


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--uri", help="store to use (default: a new SQLite file in a temp dir)")
    p.add_argument("--runs", type=int, default=1000, help="FINISHED runs already in the experiment")
    p.add_argument("--jobs", type=int, default=40)
    args = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-claim-")
    uri = args.uri or f"sqlite:///{Path(tmp) / 'mlflow.db'}"
    tracking.check_store(uri)
    exp = tracking.prepare_experiment(uri, f"bench_claim_{time.time_ns()}")
    client = tracking._client(uri)
    owner = tracking.owner_tags()
    for i in range(args.runs):
        r = client.create_run(exp, tags={**owner, "config_hash": f"old{i}"})
        client.set_terminated(r.info.run_id, "FINISHED")
    plain, claimed, contested = [], [], []
    for j in range(args.jobs):
        t0 = time.perf_counter()
        client.create_run(exp, tags={**owner, "config_hash": f"plain{j}", **tracking.claim_tags()})
        t1 = time.perf_counter()
        run = client.create_run(exp, tags={**owner, "config_hash": f"new{j}", **tracking.claim_tags()})
        won = tracking.claim(uri, exp, f"new{j}", run.info.run_id, stale_after_s=600)
        t2 = time.perf_counter()
        assert won.won
        loser = client.create_run(exp, tags={**owner, "config_hash": f"new{j}", **tracking.claim_tags()})
        t3 = time.perf_counter()
        held = tracking.claim(uri, exp, f"new{j}", loser.info.run_id, stale_after_s=600)
        tracking.stand_down(uri, loser.info.run_id, held)
        t4 = time.perf_counter()
        assert not held.won and held.holder == run.info.run_id
        plain.append(t1 - t0)
        claimed.append(t2 - t1)
        contested.append(t4 - t3)
    med = {k: statistics.median(v) * 1000 for k, v in
           (("create", plain), ("create+claim", claimed), ("stand down", contested))}
    print(f"store {tracking.redact(uri)}, {args.runs} FINISHED runs in the experiment, {args.jobs} jobs")
    print(f"  create_run alone           {med['create']:7.1f} ms (median)")
    print(f"  create_run + claim         {med['create+claim']:7.1f} ms → the claim adds "
          f"{med['create+claim'] - med['create']:.1f} ms per job "
          f"({med['create+claim'] / med['create']:.2f}×)")
    print(f"  a loser's claim + stand-down {med['stand down']:5.1f} ms (only when contested)")


if __name__ == "__main__":
    main()
