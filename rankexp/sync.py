"""``python -m rankexp.sync DIR [--uri URI]`` — log job results that never reached the store.

A job that could not reach its tracking store (a server outage, a lost network) still
computes and leaves its whole run in its job directory (:mod:`rankexp.app`).  This command
walks ``DIR`` — a multirun directory, one job directory, or any tree of them — and logs every
job whose config the store lacks (no FINISHED run with its ``config_hash`` in its experiment)
exactly as the live job would have: the same run name, params, tags (plus
``rankexp.synced_from``), metrics (scalars, series, and the points the task logged while
running, from ``metrics.jsonl``), artifacts (``result/``), start and end times, nested under
its sweep's parent run when that is in the same store — and a training run's learning-rate
member runs (the journal's ``members`` and ``member`` lines), nested under it.

It is idempotent by config hash: run twice, the second finds every config FINISHED and adds
nothing.  Like a live job it claims each config in the store before logging it
(:func:`rankexp.tracking.claim`), so two syncs at once, or a sync beside a sweep of the same
configs, log each config once; a config a live run holds is left to it (``held``).  It also closes what the outage left open: the job's earlier run, if the store has
it, is superseded (closed, tagged ``rankexp.superseded_by``, deleted), and each sweep's parent
run gets its job counts recomputed and its status set from them.

``--uri`` sends everything to another store (default: the URI each job recorded).
Exit status: 0 every result with a store is in it (or held by a live run); 1 some job could
not be logged (no result, no store, or the store refused it: one line each, its run ended
FAILED with ``rankexp.end_reason=store_error``); 2 a store could not be used.
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

    def __init__(self, uri: str | None = None, stale_after_s: float = 600):
        self.uri, self.stale_after_s = uri, stale_after_s
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
        ``present`` (already FINISHED in the store), ``held`` (a live run of another process
        is computing or logging that config now), ``no result`` (the job failed before it had
        one), ``no store`` (tracking was off and no ``--uri`` was given), ``store error`` (the
        store refused a request: the message is logged, the run it began is ended FAILED).

        Like a live job, it first creates its run and claims the config
        (:func:`rankexp.tracking.claim`), so two syncs, or a sync and a sweep, at once log
        each config once.

        Raises:
            TrackingError: the store cannot be used, or stopped answering.
        """
        record = tracking.read_json(job_dir / tracking.RUN_FILE) or {}
        result = tracking.read_json(job_dir / tracking.RESULT_DIR / "result.json")
        uri = self.uri or record.get("uri")
        if result is None or not uri:
            if uri and result is None:
                self._close_leftover(job_dir, uri, record)
            return ("no result" if result is None else "no store"), None
        exp_id = self._experiment(uri, record["experiment"])
        self._close_leftover(job_dir, uri, record)
        done = tracking.find_finished(uri, exp_id, record["config_hash"])
        if done:
            return "present", done
        logger = None
        try:
            logger = self._start(job_dir, uri, exp_id, record)
            held = tracking.claim(uri, exp_id, record["config_hash"], logger.run_id,
                                  self.stale_after_s)
            if not held.won:
                tracking.stand_down(uri, logger.run_id, held)
                log.info("%s: config held by %s", job_dir, held.where)
                return ("present" if held.status == "FINISHED" else "held"), held.holder
            return "logged", self._log(job_dir, uri, record, result, logger)
        except Exception as e:
            if tracking.is_outage(e):
                raise tracking.TrackingError(f"tracking store {tracking.redact(uri)} stopped "
                                             f"answering ({tracking._first_line(e)})") from None
            message = f"{type(e).__name__}: {tracking._first_line(e)}"
            log.error("%s: the store %s refused a request (%s)", job_dir, tracking.redact(uri),
                      message)
            if logger is not None and logger.run_id:
                logger.end("FAILED", "store_error", message)
            return "store error", None

    def _start(self, job_dir: Path, uri: str, exp_id: str, record: dict) -> tracking.RunLogger:
        """Create the synced run: the job's name, params and tags, this process as its owner."""
        tags = {**record["tags"], "rankexp.synced_from": str(job_dir.resolve()),
                **tracking.owner_tags()}  # the claim is stamped by tracking.claim
        parent = self._parent(job_dir, uri, record["experiment"])
        if parent:
            tags["mlflow.parentRunId"] = parent
        else:
            tags.pop("mlflow.parentRunId", None)
        logger = tracking.RunLogger(uri, exp_id, record["run_name"], record["params"], tags)
        logger.start(start_time=record.get("start_time"))
        return logger

    def _log(self, job_dir: Path, uri: str, record: dict, result: dict,
             logger: tracking.RunLogger) -> str:
        """Log the job's points, result and artifacts into its claimed run; supersede the run
        the outage cut short."""
        status = tracking.read_json(job_dir / tracking.STATUS_FILE) or {}
        journal = job_dir / tracking.JOURNAL_FILE
        for stamp, points in tracking.read_journal(journal):
            logger._send(points, {}, timestamp=stamp)
        lrs, member_points = tracking.read_member_journal(journal)
        if lrs:  # a training run's learning-rate members: runs of their own, as live
            logger.open_members(lrs)
            for stamp, i, points in member_points:
                logger._send_members([points if j == i else [] for j in range(len(lrs))], stamp)
        series = {k: (v["steps"], v["values"]) for k, v in result["series"].items()}
        logger.finish(result["scalars"], series, job_dir / tracking.RESULT_DIR,
                      end_time=int(1000 * status["time"]) if "time" in status else None)
        run_id = logger.run_id
        old = status.get("run_id") if status.get("status") in tracking.OWN_RUN_STATES else None
        if old and old != run_id and status.get("uri") == uri:
            tracking.supersede(uri, old, run_id)
        tracking.write_status(job_dir, "FINISHED", run_id=run_id, config_hash=record["config_hash"],
                              uri=uri, synced=time.time())
        return run_id

    def _close_leftover(self, job_dir: Path, uri: str, record: dict) -> None:
        """The job's own run, if the store still has it RUNNING although the job is over
        (the store refused to close it then), is closed as the job directory says."""
        status = tracking.read_json(job_dir / tracking.STATUS_FILE) or {}
        run_id = status.get("run_id")
        if not run_id or status.get("status") not in tracking.OWN_RUN_STATES \
                or status.get("uri") not in (None, uri):
            return
        client = tracking._client(uri)
        try:
            run = client.get_run(run_id)
        except Exception:
            return
        if run.info.status != "RUNNING" or run.data.tags.get("config_hash") != record.get("config_hash"):
            return
        verdict = tracking.owner_gone(run.data.tags, run.info.start_time, {}, self.stale_after_s,
                                      run_id)
        if verdict is not None:
            tracking.close_run(client, run_id, *verdict, params=record.get("params"))
            log.info("%s: closed its run %s, left RUNNING, as %s (%s)", job_dir, run_id,
                     verdict[0], verdict[1])

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
        closed = tracking.reconcile(rec["uri"], rec["experiment_id"], self.stale_after_s,
                                    parent_id=rec["run_id"])
        if client.search_runs([rec["experiment_id"]], max_results=1, filter_string=(
                f"tags.mlflow.parentRunId = '{rec['run_id']}' and attributes.status = 'RUNNING'")):
            log.warning("sweep %s: a job run is still RUNNING; its parent run %s stays open",
                        sweep_dir, rec["run_id"])
            return None
        dirs = tracking.planned_job_dirs(sweep_dir, parent.data.tags.get("jobs_total"))
        counts = tracking.count_jobs(dirs, {r: st for r, (st, _) in closed.items()})
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


def _guarded(where: Path, fn, *args):
    """``fn(*args)``; a store that refuses (anything but an outage) is one logged line and
    ``None``, so one bad job never stops the others; an outage raises TrackingError."""
    try:
        return fn(*args)
    except tracking.TrackingError:
        raise
    except Exception as e:
        if tracking.is_outage(e):
            raise tracking.TrackingError(f"the store stopped answering ({tracking._first_line(e)})"
                                         ) from None
        log.error("%s: the store refused a request (%s: %s)", where, type(e).__name__,
                  tracking._first_line(e))
        return None


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
    syncer = Syncer(args.uri)
    tally: dict[str, int] = {}
    try:
        for d in job_dirs(args.dir):
            outcome, run_id = _guarded(d, syncer.sync, d) or ("store error", None)
            tally[outcome] = tally.get(outcome, 0) + 1
            if outcome == "logged":
                log.info("logged %s as run %s", d, run_id)
            elif outcome != "present":
                log.warning("%s: %s", d, outcome)
        for sweep in sorted({d.parent for d in job_dirs(args.dir)} | {args.dir}):
            if (sweep / tracking.PARENT_FILE).exists():
                _guarded(sweep, syncer.close_parent, sweep)
    except tracking.TrackingError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    log.info("sync %s: %d logged, %d already in the store, %d held by a live run, %d without a "
             "result, %d without a store, %d refused by the store", args.dir, tally.get("logged", 0),
             tally.get("present", 0), tally.get("held", 0), tally.get("no result", 0),
             tally.get("no store", 0), tally.get("store error", 0))
    return 1 if tally.get("no result") or tally.get("no store") or tally.get("store error") else 0


if __name__ == "__main__":
    raise SystemExit(main())
