"""``python -m rankexp.sync DIR [--uri URI]`` — log job results that never reached the store.

A job that could not reach its tracking store (a server outage, a lost network) still
computes and leaves its whole run in its job directory (:mod:`rankexp.app`).  This command
walks ``DIR`` — a multirun directory, one job directory, or any tree of them — and logs every
job whose config the store lacks (no FINISHED run with its ``config_hash`` in its experiment)
exactly as the live job would have: the same run name, params, tags (plus
``rankexp.synced_from``), metrics (scalars, series, and the points the task logged while
running, from ``metrics.jsonl``), artifacts (``result/``), start and end times, nested under
its sweep's parent run when that is in the same store.

It is idempotent by config hash: run twice, the second finds every config FINISHED and adds
nothing.  It also closes what the outage left open: the job's earlier run, if the store has
it, is superseded (closed, tagged ``rankexp.superseded_by``, deleted), and each sweep's parent
run gets its job counts recomputed and its status set from them.

``--uri`` sends everything to another store (default: the URI each job recorded).
Exit status: 0 every result with a store is in it; 1 some job could not be logged; 2 a store
could not be used.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from . import tracking

log = logging.getLogger("rankexp.sync")


def job_dirs(root: Path) -> list[Path]:
    """Job directories under ``root`` (or ``root`` itself): folders holding a ``run.json``."""
    root = Path(root)
    found = [root] if (root / tracking.RUN_FILE).is_file() else []
    found += [p.parent for p in root.rglob(tracking.RUN_FILE) if p.parent != root]
    return sorted(set(found))


class Syncer:
    """Logs job directories into their stores, remembering each store's checks."""

    def __init__(self, uri: str | None = None):
        self.uri = uri
        self._checked: set[str] = set()
        self._experiments: dict[tuple[str, str], str] = {}

    def _experiment(self, uri: str, name: str) -> str:
        if uri not in self._checked:
            tracking.check_store(uri)
            self._checked.add(uri)
        if (uri, name) not in self._experiments:
            self._experiments[uri, name] = tracking.prepare_experiment(uri, name)
        return self._experiments[uri, name]

    def sync(self, job_dir: Path) -> tuple[str, str | None]:
        """Log one job directory; returns ``(outcome, run_id)``, outcome one of ``logged``,
        ``present`` (already FINISHED in the store), ``no result`` (the job failed before it
        had one), ``no store`` (tracking was off and no ``--uri`` was given)."""
        record = tracking.read_json(job_dir / tracking.RUN_FILE) or {}
        result = tracking.read_json(job_dir / tracking.RESULT_DIR / "result.json")
        if result is None:
            return "no result", None
        uri = self.uri or record.get("uri")
        if not uri:
            return "no store", None
        chash = record["config_hash"]
        exp_id = self._experiment(uri, record["experiment"])
        done = tracking.find_finished(uri, exp_id, chash)
        if done:
            return "present", done
        tags = {**record["tags"], "rankexp.synced_from": str(job_dir.resolve())}
        parent = self._parent(job_dir, uri, record["experiment"])
        if parent:
            tags["mlflow.parentRunId"] = parent
        else:
            tags.pop("mlflow.parentRunId", None)
        status = tracking.read_json(job_dir / tracking.STATUS_FILE) or {}
        logger = tracking.RunLogger(uri, exp_id, record["run_name"], record["params"], tags)
        run_id = logger.start(start_time=record.get("start_time"))
        for stamp, points in tracking.read_journal(job_dir / tracking.JOURNAL_FILE):
            logger._send(points, {}, timestamp=stamp)
        series = {k: (v["steps"], v["values"]) for k, v in result["series"].items()}
        logger.finish(result["scalars"], series, job_dir / tracking.RESULT_DIR,
                      end_time=int(1000 * status["time"]) if "time" in status else None)
        old = status.get("run_id")
        if old and old != run_id and status.get("uri") == uri:
            tracking.supersede(uri, old, run_id)
        tracking.write_status(job_dir, "FINISHED", run_id=run_id, config_hash=chash, uri=uri,
                              synced=time.time())
        return "logged", run_id

    def _parent(self, job_dir: Path, uri: str, experiment: str) -> str | None:
        rec = tracking.read_parent(job_dir.parent)
        if not rec or rec.get("uri") != uri or rec.get("experiment") != experiment:
            return None
        try:
            tracking._client(uri).get_run(rec["run_id"])
        except Exception:
            return None
        return rec["run_id"]

    def close_parent(self, sweep_dir: Path) -> str | None:
        """Recount a sweep's jobs onto its parent run and set its status from the counts."""
        rec = tracking.read_parent(sweep_dir)
        if not rec or (self.uri and rec["uri"] != self.uri):
            return None
        client = tracking._client(rec["uri"])
        try:
            parent = client.get_run(rec["run_id"])
        except Exception:
            return None
        total = int(parent.data.tags.get("jobs_total", 0))
        dirs = [d for d in sorted(sweep_dir.iterdir()) if (d / tracking.RUN_FILE).exists()
                or (d / tracking.STATUS_FILE).exists()]
        counts = tracking.count_jobs(dirs)
        counts["not_run"] += max(0, total - len(dirs))
        tracking._log_counts(client, rec["run_id"], counts)
        bad = counts["failed"] or counts["killed"] or counts["not_run"]
        status = "FAILED" if bad else "FINISHED"
        client.set_tag(rec["run_id"], "rankexp.synced", str(int(time.time())))
        if status == "FINISHED":  # what went wrong at the time is mended now
            for key in ("error", tracking.TAG_REASON):
                if key in parent.data.tags:
                    client.delete_tag(rec["run_id"], key)
        client.set_terminated(rec["run_id"], status)
        log.info("sweep %s: %s → parent run %s %s", sweep_dir, tracking.summary(counts),
                 rec["run_id"], status)
        return status


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rankexp.sync", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", type=Path, help="a multirun dir, a job dir, or a tree of them")
    p.add_argument("--uri", help="log into this store instead of the one each job recorded")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not args.dir.exists():
        print(f"error: {args.dir} does not exist", file=sys.stderr)
        return 2
    syncer = Syncer(args.uri)
    tally: dict[str, int] = {}
    try:
        for d in job_dirs(args.dir):
            outcome, run_id = syncer.sync(d)
            tally[outcome] = tally.get(outcome, 0) + 1
            if outcome == "logged":
                log.info("logged %s as run %s", d, run_id)
            elif outcome != "present":
                log.warning("%s: %s", d, outcome)
        for sweep in sorted({d.parent for d in job_dirs(args.dir)} | {args.dir}):
            if (sweep / tracking.PARENT_FILE).exists():
                syncer.close_parent(sweep)
    except tracking.TrackingError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    log.info("sync %s: %d logged, %d already in the store, %d without a result, %d without a store",
             args.dir, tally.get("logged", 0), tally.get("present", 0), tally.get("no result", 0),
             tally.get("no store", 0))
    return 1 if tally.get("no result") or tally.get("no store") else 0


if __name__ == "__main__":
    raise SystemExit(main())
