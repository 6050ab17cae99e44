"""The sweep's parent run (:class:`SweepRun`): opened once the sweep is valid, closed with the
true outcome of every job."""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .jobdir import _log_counts, count_jobs, read_json, store_known_down, summary, write_json
from .ownership import (
    Heartbeat,
    close_run,
    correct_timeouts,
    finished_configs,
    owner_tags,
    reconcile,
)
from .provenance import git_commit, system_tags
from .schema import FINISHED_FILE, NAMES_FILE, PARENT_FILE, TAG_NOTE, TAG_ROLE, TrackingError
from .store import (
    _client,
    _first_line,
    describe_experiment,
    prepare_experiment,
    quick_bounds,
    redact,
)
from .write import metric_key

log = logging.getLogger(__name__)


class SweepRun:
    """The parent run of one multirun: opened after the whole sweep is valid, closed with the
    true outcome of every job — after closing the children whose owners are gone."""

    def __init__(self, uri: str, experiment: str, sweep_dir: Path, job_dirs: list[Path],
                 overrides: str, heartbeat_s: float, stale_after_s: float,
                 name: str | None = None, note: str = "", tags: dict[str, str] | None = None,
                 description: str | None = None):
        self.uri, self.experiment, self.sweep_dir = uri, experiment, Path(sweep_dir).resolve()
        self.name, self.note = name or f"sweep·{self.sweep_dir.name}", note
        self.user_tags, self.description = dict(tags or {}), description
        self.job_dirs, self.overrides = job_dirs, overrides
        self.heartbeat_s, self.stale_after_s = heartbeat_s, stale_after_s
        self.client = _client(uri)
        self.experiment_id = self.run_id = None
        self._heartbeat: Heartbeat | None = None
        self.t0 = time.time()

    def open(self, config_hashes: Iterable[str], resume: bool) -> None:
        """Prepare the experiment, close stale runs in it, snapshot its FINISHED configs (jobs
        skip them without asking the store) and create the parent run."""
        self.experiment_id = prepare_experiment(self.uri, self.experiment)
        if self.description:
            describe_experiment(self.uri, self.experiment_id, self.description)
        reconcile(self.uri, self.experiment_id, self.stale_after_s)
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        if resume:
            wanted = set(config_hashes)
            done = {h: r for h, r in finished_configs(self.uri, self.experiment_id).items() if h in wanted}
            write_json(self.sweep_dir / FINISHED_FILE, done)
        tags = {**self.user_tags, "sweep_id": str(self.sweep_dir), TAG_ROLE: "sweep", "overrides": self.overrides,
                "git_commit": git_commit(), "jobs_total": str(len(self.job_dirs)), **owner_tags(),
                **system_tags(), **({TAG_NOTE: self.note} if self.note else {})}
        run = self.client.create_run(self.experiment_id, run_name=self.name, tags=tags)
        self.run_id = run.info.run_id
        write_json(self.sweep_dir / PARENT_FILE, {
            "uri": self.uri, "experiment": self.experiment, "experiment_id": self.experiment_id,
            "run_id": self.run_id, "sweep_id": str(self.sweep_dir)})
        self._heartbeat = Heartbeat(self.uri, self.run_id, self.heartbeat_s).__enter__()
        log.info("MLflow: %s, experiment %r (id %s), sweep run %s", self.uri, self.experiment,
                 self.experiment_id, self.run_id)

    def close(self, interrupted: str | None = None, grace_s: float = 10.0) -> tuple[str, Counter]:
        """Close the children whose jobs ended or whose owners are gone (waiting up to
        ``grace_s`` for live ones of an interrupted sweep), count the jobs, log the counts and
        end the parent — only once every child is closed, so a parent never ends over a
        RUNNING child: KILLED if interrupted, FAILED if a job failed, was killed or did not
        run, else FINISHED.  A store a job found unreachable is asked with one-second bounds."""
        if self._heartbeat is not None:
            self._heartbeat.__exit__()
        down = store_known_down(self.sweep_dir, self.uri)
        with quick_bounds() if down else contextlib.nullcontext():
            closed, problem = self._close_children(interrupted, grace_s)
            counts = count_jobs(self.job_dirs, {r: s for r, (s, _) in closed.items()})
            status = "KILLED" if interrupted else (
                "FAILED" if counts["failed"] or counts["killed"] or counts["not_run"] else "FINISHED")
            log.info("sweep %s: %s%s", self.sweep_dir, summary(counts),
                     f"; interrupted by {interrupted}: rerun the same command to resume "
                     "(FINISHED configs are skipped)" if interrupted else "")
            try:
                if problem:
                    raise TrackingError(problem)
                _log_counts(self.client, self.run_id, counts, time.time() - self.t0)
                if status == "FINISHED":
                    self.client.set_terminated(self.run_id, "FINISHED")
                else:
                    message = (f"interrupted by {interrupted}: {summary(counts)}; rerun the same "
                               "command to resume" if interrupted else summary(counts))
                    close_run(self.client, self.run_id, status, interrupted or "jobs_failed", message,
                              members=False)  # (a sweep has jobs, not learning-rate members)
            except Exception as e:
                log.error("could not close the sweep run %s in %s (%s); `python -m rankexp.sync %s` "
                          "closes it once the store answers", self.run_id, redact(self.uri),
                          _first_line(e), self.sweep_dir)
        return status, counts

    def _close_children(self, interrupted: str | None, grace_s: float
                        ) -> tuple[dict[str, tuple[str, str]], str | None]:
        """Reconcile the sweep's children; returns the runs closed and, if a child may still be
        RUNNING (the store refused to close it, or could not be asked), why."""
        closed: dict[str, tuple[str, str]] = {}
        end = time.monotonic() + (grace_s if interrupted else 0)
        try:
            while True:
                closed.update(reconcile(self.uri, self.experiment_id, self.stale_after_s,
                                        parent_id=self.run_id))
                running = self._running_children()
                if time.monotonic() >= end or not running:
                    break
                time.sleep(0.5)
            closed.update(correct_timeouts(self.uri, self.experiment_id, self.run_id))
        except Exception as e:
            log.error("could not check the sweep's runs in %s (%s)", redact(self.uri), _first_line(e))
            return closed, f"its job runs could not be checked: {_first_line(e)}"
        if running and not interrupted:
            return closed, ("a job run of the sweep is still RUNNING in the store (it refused to "
                            "close it), so the sweep run is left open")
        return closed, None

    def _running_children(self) -> bool:
        return bool(self.client.search_runs(
            [self.experiment_id], max_results=1,
            filter_string=f"tags.mlflow.parentRunId = '{self.run_id}' and attributes.status = 'RUNNING'"))


# --------------------------------------------------------------------------- sweeps in rounds
def extend_sweep(run: SweepRun, job_dirs: list[Path], names: list[str],
                 config_hashes: Iterable[str], resume: bool) -> None:
    """A sweep that learns its jobs round by round (``hydra/sweeper=contour``) tells its parent
    and its jobs about every job so far: the plan (:data:`NAMES_FILE`: names and job dirs, so
    counts and run names cover every round), the FINISHED configs among them
    (:data:`FINISHED_FILE`, when resuming: a job of a rerun skips what the store holds) and the
    parent's ``jobs_total`` tag."""
    record = read_json(run.sweep_dir / NAMES_FILE) or {}
    write_json(run.sweep_dir / NAMES_FILE, {
        "started": record.get("started", time.time()), "names": list(names),
        "job_dirs": [str(Path(d).resolve()) for d in job_dirs]})
    run.job_dirs = list(job_dirs)
    if resume:
        wanted = set(config_hashes)
        done = {h: r for h, r in finished_configs(run.uri, run.experiment_id).items() if h in wanted}
        write_json(run.sweep_dir / FINISHED_FILE, done)
    run.client.set_tag(run.run_id, "jobs_total", str(len(job_dirs)))


def log_tables(run: SweepRun, tables: dict[str, Any], scalars: dict[str, float],
               folder: str = "contour") -> None:
    """Log pandas tables as artifacts ``<folder>/<name>.csv`` and ``.json`` (records) of the
    sweep's parent run, and ``scalars`` as its metrics."""
    import tempfile

    from mlflow.entities import Metric

    with tempfile.TemporaryDirectory() as tmp:
        for name, df in tables.items():
            df.to_csv(Path(tmp) / f"{name}.csv", index=False)
            df.to_json(Path(tmp) / f"{name}.json", orient="records", indent=1)
        run.client.log_artifacts(run.run_id, tmp, folder)
    now = int(time.time() * 1000)
    if scalars:
        run.client.log_batch(run.run_id, metrics=[Metric(metric_key(k), float(v), now, 0)
                                                  for k, v in scalars.items()])
