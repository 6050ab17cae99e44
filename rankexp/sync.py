"""``python -m rankexp.sync DIR [--uri URI]`` — log the job results a store missed.

A job whose store failed it still computes and leaves its whole run in its job directory
(:mod:`rankexp.app`).  This walks ``DIR`` (a multirun directory, a job directory, or a tree of
them) and logs every job whose config the store has no FINISHED run of, as the live job would
have: its name, params, tags (plus ``rankexp.synced_from``), metrics, the points the task
logged while running (``metrics.jsonl``, a training run's member runs too), artifacts, start
and end times, under its sweep's parent run.  Like a job it claims each config first, so two
syncs, or a sync beside a sweep, log each config once.  It also closes what a dead job or
sweep left RUNNING (the job's own run, the sweep's parent with its job counts).

``--uri`` sends everything to another store (default: the store each job recorded; a
recorded URI with a masked password is used only if ``$MLFLOW_TRACKING_URI`` is that store).
Exit status: 0 every result is in its store (or held by a live run); 1 some job could not be
logged (no result, no store, or the store refused it); 2 a store could not be used.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from . import tracking
from .locations import private_files

log = logging.getLogger("rankexp.sync")


def job_dirs(root: Path) -> list[Path]:
    """Folders holding a ``run.json`` under ``root`` (or ``root`` itself)."""
    return sorted({p.parent for p in [root / tracking.RUN_FILE, *root.rglob(tracking.RUN_FILE)]
                   if p.is_file()})


class Syncer:
    """Logs job directories into their stores, each store checked once."""

    def __init__(self, uri: str | None = None, stale_after_s: float = 600):
        self.uri, self.stale_after_s, self._experiments = uri, stale_after_s, {}

    def store_of(self, recorded: str | None) -> str | None:
        """``--uri``, else the recorded URI (its password from ``$MLFLOW_TRACKING_URI``)."""
        env = os.environ.get("MLFLOW_TRACKING_URI")
        if self.uri or not recorded or "***" not in recorded:
            return self.uri or recorded or None
        return env if env and tracking.redact(env) == recorded else None

    def experiment(self, uri: str, name: str) -> str:
        if (uri, name) not in self._experiments:
            tracking.check_store(uri)
            self._experiments[uri, name] = tracking.prepare_experiment(uri, name)
        return self._experiments[uri, name]

    def sync(self, job_dir: Path) -> tuple[str, str | None]:
        """Log one job directory; returns ``(outcome, run_id)``: ``logged``, ``present``
        (FINISHED in the store), ``held`` (by a live run), ``no result``, ``no store`` (tracking
        was off, no ``--uri``), ``store error`` (the run it began is ended FAILED)."""
        record = tracking.read_json(job_dir / tracking.RUN_FILE) or {}
        result = tracking.read_json(job_dir / tracking.RESULT_DIR / "result.json")
        status = tracking.read_json(job_dir / tracking.STATUS_FILE) or {}
        uri = self.store_of(record.get("uri"))
        if not uri:
            return ("no result" if result is None else "no store"), None
        exp_id = self.experiment(uri, record["experiment"])
        self._close_leftover(uri, status, record)
        if result is None:
            return "no result", None
        done = tracking.find_finished(uri, exp_id, record["config_hash"],
                                      record.get("legacy_hash", ""))
        if done:
            return "present", done
        tags = {**record["tags"], "rankexp.synced_from": str(job_dir.resolve()), **tracking.owner_tags()}
        parent = tracking.read_json(job_dir.parent / tracking.PARENT_FILE) or {}
        tags.pop("mlflow.parentRunId", None)
        if parent.get("uri") == tracking.redact(uri) and parent.get("experiment") == record["experiment"]:
            tags["mlflow.parentRunId"] = parent["run_id"]
        logger = tracking.RunLogger(uri, exp_id, record["run_name"], record["params"], tags)
        try:
            logger.start(start_time=record.get("start_time"))
            held = tracking.claim(uri, exp_id, record["config_hash"], logger.run_id, self.stale_after_s)
            if not held.won:
                tracking.stand_down(uri, logger.run_id, held)
                return ("present" if held.status == "FINISHED" else "held"), held.holder
            journal = job_dir / tracking.JOURNAL_FILE
            for stamp, points in tracking.read_journal(journal):
                logger._send(points, {}, timestamp=stamp)
            lrs, member_points = tracking.read_member_journal(journal)
            if lrs:
                logger.open_members(lrs)
                for stamp, i, points in member_points:
                    logger._send_members([points if j == i else [] for j in range(len(lrs))], stamp)
            series = {k: (v["steps"], v["values"]) for k, v in result["series"].items()}
            logger.finish(result["scalars"], series, job_dir / tracking.RESULT_DIR,
                          end_time=int(1000 * status["time"]) if "time" in status else None)
        except Exception as e:
            message = tracking._first_line(e)
            log.error("%s: the store %s failed a request: %s", job_dir, tracking.redact(uri), message)
            logger.lost = None
            logger.end("FAILED", "store_error", message)
            return "store error", None
        old = status.get("run_id") if status.get("status") in ("RUNNING", "FAILED", "KILLED") else None
        if old and old != logger.run_id:
            tracking.supersede(uri, old, logger.run_id)
        tracking.write_status(job_dir, "FINISHED", run_id=logger.run_id,
                              config_hash=record["config_hash"], synced=time.time())
        return "logged", logger.run_id

    def _close_leftover(self, uri: str, status: dict, record: dict) -> None:
        """The job's own run, RUNNING though its owner is gone, is closed as its job directory
        says (KILLED if it says RUNNING)."""
        if status.get("status") not in ("RUNNING", "FAILED", "KILLED") or not status.get("run_id"):
            return
        client = tracking._client(uri)
        try:
            run = client.get_run(status["run_id"])
        except Exception:
            return
        verdict = tracking.expired(run, self.stale_after_s) if run.info.status == "RUNNING" else None
        if verdict is not None and run.data.tags.get("config_hash") == record.get("config_hash"):
            ended = status["status"] if status["status"] != "RUNNING" else "KILLED"
            tracking.close_run(client, run.info.run_id, ended, status.get("reason") or verdict[0],
                               status.get("error") or verdict[1], params=record.get("params"))

    def close_parent(self, sweep_dir: Path) -> str | None:
        """Close the parent run of a sweep that is over (its dead children first, its job counts
        recounted): FINISHED when every job is, else FAILED."""
        rec = tracking.read_json(sweep_dir / tracking.PARENT_FILE) or {}
        uri = self.store_of(rec.get("uri"))
        if not uri:
            return None
        client = tracking._client(uri)
        parent = client.get_run(rec["run_id"])
        if parent.info.status == "RUNNING" and tracking.expired(parent, self.stale_after_s) is None:
            log.info("sweep %s is still running; its parent run stays open", sweep_dir)
            return None
        closed = tracking.reconcile(uri, rec["experiment_id"], self.stale_after_s, rec["run_id"])
        if client.search_runs([rec["experiment_id"]], max_results=1, filter_string=(
                f"tags.mlflow.parentRunId = '{rec['run_id']}' and attributes.status = 'RUNNING'")):
            log.warning("sweep %s: a job run is still RUNNING; its parent run stays open", sweep_dir)
            return None
        counts = tracking.count_jobs(tracking.planned_job_dirs(sweep_dir),
                                     {r: st for r, (st, _) in closed.items()})
        tracking.log_counts(client, rec["run_id"], counts)
        status = "FAILED" if counts["failed"] or counts["killed"] or counts["not_run"] else "FINISHED"
        client.set_tag(rec["run_id"], "rankexp.synced", str(int(time.time())))
        if status == "FAILED":  # why, as a sweep that closes itself says it
            tracking.close_run(client, rec["run_id"], status, "jobs_failed", tracking.summary(counts),
                               members=False)
        else:
            for key in ("error", tracking.TAG_REASON):
                if key in parent.data.tags:  # what went wrong at the time is mended now
                    client.delete_tag(rec["run_id"], key)
            client.set_terminated(rec["run_id"], status)
        log.info("sweep %s: %s → parent run %s %s", sweep_dir, tracking.summary(counts), rec["run_id"], status)
        return status


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rankexp.sync", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", type=Path, help="a multirun dir, a job dir, or a tree of them")
    p.add_argument("--uri", help="log into this store instead of the one each job recorded")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    tracking.quiet_store_logs()
    if not args.dir.exists():
        print(f"error: {args.dir} does not exist", file=sys.stderr)
        return 2
    syncer, tally = Syncer(args.uri), dict.fromkeys(
        ("logged", "present", "held", "no result", "no store", "store error"), 0)
    dirs = job_dirs(args.dir)
    try:
        for d in dirs:
            outcome, run_id = syncer.sync(d)
            tally[outcome] += 1
            if outcome == "logged":
                log.info("logged %s as run %s", d, run_id)
            elif outcome != "present":
                log.warning("%s: %s", d, outcome)
        for sweep in sorted({d.parent for d in dirs} | {args.dir}):
            if (sweep / tracking.PARENT_FILE).exists():
                syncer.close_parent(sweep)
    except Exception as e:
        print(f"error: {tracking.redact(str(e)) if isinstance(e, tracking.TrackingError) else tracking._first_line(e)}",
              file=sys.stderr)
        return 2
    log.info("sync %s: %d logged, %d already in the store, %d held by a live run, %d without a "
             "result, %d without a store, %d refused by the store", args.dir, *tally.values())
    return 1 if tally["no result"] or tally["no store"] or tally["store error"] else 0


if __name__ == "__main__":
    private_files()
    raise SystemExit(main())
