"""One Hydra job: check → claim → compute → job directory → MLflow.

Data flow (design.md §3) and what a job promises (issue 8):

* The composed config is checked before anything else (:func:`rankexp.config.check_job`:
  unknown keys, values, input paths, device), so a mistake never creates a run — once: a job
  of a sweep run in the sweeper's process takes the whole-sweep check's result
  (:func:`rankexp.config.checked_job`).
* A single run checks its store (:func:`rankexp.tracking.check_store`) and closes stale runs
  of its experiment before its own run exists; a job of a sweep leaves that to the sweeper
  (hydra_plugins/rankexp_plugins) and only asks whether the store answers *now*
  (:func:`rankexp.tracking.unreachable`, bounded by ``tracking.http_*``).  A job that cannot
  reach the store still computes, writes everything to its job directory and fails clearly;
  ``python -m rankexp.sync`` logs it later with the same params, tags, metrics and artifacts.
* The job creates its run and claims its config in the store
  (:func:`rankexp.tracking.claim`) before computing: when a FINISHED run or an earlier live
  claimant holds it, the job stands down (its run closed ``stood_down`` and hidden; the job
  SKIPPED, naming the holder), so many writers never compute or log a config twice.
* A store that refuses a request (permission, full disk, validation) is not an outage: the
  result stays in the job directory and the run ends FAILED with reason ``store_error``.  An
  outage found by one job of a sweep is known to the others (``store_down.json``).
* Every run ends FINISHED, FAILED or KILLED: SIGTERM/SIGINT/SIGHUP end it KILLED (reason: the
  signal); a Slurm time limit ends it FAILED with reason ``TIMEOUT``; submitit's SIGUSR2 (time
  limit near) makes a training job requeue itself from its checkpoint, while a measurement,
  which has nothing to checkpoint, goes on.
* A requeued attempt *supersedes* the run of the attempt before it
  (:func:`rankexp.tracking.supersede`): MLflow's params are write-once and its metric
  histories append-only, so a new run holding the whole series (the training task backfills
  the points from before its checkpoint) is exact where reopening the old one would duplicate
  points; the old run is closed, tagged and soft-deleted — one config, one live run.

The job directory (``multirun/<date>/<time>-<pid>/<n>/`` or ``outputs/…``)::

    result/          config.yaml, result.json, arrays.npz — the run's artifacts, one upload
    run.json         the run as logged (or to be logged): URI, experiment, name, params, tags
    metrics.jsonl    points the task logged while running (training curves)
    status.json      RUNNING, then FINISHED / SKIPPED / FAILED / KILLED, run id, reason, error
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from omegaconf import DictConfig

from . import interrupt, naming, tracking
from .config import (
    CheckedJob,
    RankexpConfig,
    checked_job,
    flatten,
    resolve_device,
)
from .models.families import family_of
from .result import Measurement
from .tasks import TASKS

log = logging.getLogger("rankexp")

#: tasks that checkpoint, so a time-limit warning (SIGUSR2) can requeue them
RESUMABLE_TASKS = {"train"}
#: a store another job of the sweep found unreachable this recently is not asked again (older
#: news: asked once, with one-second bounds, whether it is back)
RECHECK_DOWN_S = 30.0


def derived_params(s: RankexpConfig) -> dict[str, float]:
    """What the model family derives from the config (its declared ``derived``): for the
    residual MLP and the plain nets ``beta_eff`` (depth-scaled β), ``nominal_ratio`` βα^M
    (Eq. 21; M = 1 for ``model=plain``, one matrix per layer) and ``depth_factor`` βα^M√L; a
    ConvNet or an LM has no β, α: none."""
    derived = family_of(s).derived
    return dict(derived(s)) if derived is not None else {}


def run_params(container: dict[str, Any], s: RankexpConfig) -> dict[str, Any]:
    """The run's MLflow params: what defines the experiment — the resolved config flattened with
    dots, without where/how it is recorded or run (``tracking.*``, ``device``: tags), without
    ``data.*`` and the memory budget for a measurement, without options of probes it does not
    run and without unset values (``lr: None``) — plus :func:`derived_params`."""
    c = {k: v for k, v in container.items() if k not in ("tracking", "device")}
    if s.task.name == "measure":
        c.pop("data", None)
        task = {k: v for k, v in c["task"].items() if k != "max_memory_gb"}
        task["options"] = {p: o for p, o in (task.get("options") or {}).items() if p in s.task.probes}
        c["task"] = task
    return {k: v for k, v in {**flatten(c), **derived_params(s)}.items()
            if v is not None and v != {}}


def base_name(s: RankexpConfig) -> str:
    """A single run's name from its config (:func:`rankexp.naming.config_name`)."""
    return naming.config_name(s)


def run_name(s: RankexpConfig, ctx: JobContext | None = None) -> str:
    """The job's run name: the one its sweep gave it (``run_names.json``; in a sweep
    ``tracking.run_name`` names the parent run), else ``tracking.run_name``, else
    :func:`base_name`."""
    names = sweep_record(ctx).get("names", [])
    return names[ctx.num] if ctx is not None and ctx.num is not None and ctx.num < len(names) \
        else s.tracking.run_name or base_name(s)


def sweep_record(ctx: JobContext | None) -> dict[str, Any]:
    """The sweeper's record of this job's sweep (:data:`rankexp.tracking.NAMES_FILE`), or {}."""
    if ctx is None or ctx.sweep_dir is None:
        return {}
    return tracking.read_json(ctx.sweep_dir / tracking.NAMES_FILE) or {}


def sweep_progress(ctx: JobContext, name: str) -> str | None:
    """``job 3/8 post·α1·L96 — 2 done in 1m10s, ETA 3m30s`` for a job of a sweep (ETA from the
    sweep's throughput so far, so parallel launchers are estimated right), else None."""
    record = sweep_record(ctx)
    if ctx.num is None or "names" not in record:
        return None
    total = len(record["names"])
    done = sum((tracking.read_json(ctx.sweep_dir / str(i) / tracking.STATUS_FILE) or {}).get("status")
               in ("FINISHED", "SKIPPED", "FAILED", "KILLED") for i in range(total) if i != ctx.num)
    elapsed = time.time() - float(record.get("started", time.time()))
    from .tasks.train import duration

    eta = f", ETA {duration(elapsed / done * (total - done))}" if done else ""
    return f"job {ctx.num + 1}/{total} {name} — {done} done in {duration(elapsed)}{eta}"


# --------------------------------------------------------------------------- results on disk
def save_result(out_dir: Path, result: Measurement, extra: dict[str, Any],
                arrays_dir: Path | None = None) -> None:
    """Write ``result.json`` (scalars, series, ``extra``) into ``out_dir`` and ``arrays.npz``
    there too, or into ``arrays_dir`` (arrays kept on disk but not uploaded)."""
    import io

    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        **extra,
        "scalars": result.scalars,
        "series": {k: {"steps": np.asarray(st).tolist(), "values": np.asarray(v).tolist()}
                   for k, (st, v) in result.series.items()},
    }
    tracking.write_atomic(out_dir / "result.json", json.dumps(doc, indent=1, default=float).encode())
    if result.arrays:  # atomically too: a full disk leaves no half-written file behind
        buf = io.BytesIO()
        np.savez_compressed(buf, **result.arrays)
        tracking.write_atomic((arrays_dir or out_dir) / "arrays.npz", buf.getvalue())


@dataclass
class JobContext:
    """Where the running Hydra job is: its directory, its sweep's (None for a single run),
    its override string and its launcher's config."""

    job_dir: Path
    sweep_dir: Path | None
    overrides: str
    launcher: DictConfig | None
    num: int | None = None  # the job's number in its sweep
    override_list: tuple[str, ...] = ()  # the command line's overrides of this job, one each


def job_context() -> JobContext:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return JobContext(Path.cwd(), None, "", None)
    hc = HydraConfig.get()
    sweep = Path(hc.sweep.dir) if hc.mode == RunMode.MULTIRUN else None
    return JobContext(Path(hc.runtime.output_dir), sweep, " ".join(hc.overrides.task),
                      hc.launcher if sweep else None, hc.job.get("num") if sweep else None,
                      tuple(hc.overrides.task))


def pin_threads(launcher: DictConfig | None) -> None:
    """A joblib worker (``hydra/launcher=local``) uses cores ÷ workers torch/OpenMP threads:
    every worker at all cores' threads oversubscribes the machine (platform.md: 6× slower)."""
    if launcher is None or "joblib" not in str(launcher.get("_target_", "")):
        return
    cores = len(os.sched_getaffinity(0))
    n_jobs = int(launcher.get("n_jobs") or 1)
    workers = n_jobs if n_jobs > 0 else max(1, cores + 1 + n_jobs)
    threads = max(1, cores // workers)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)


# --------------------------------------------------------------------------- fault injection
FAULT_ENV = "RANKEXP_FAULT_KILL"
HANG_ENV = "RANKEXP_FAULT_HANG"
SLEEP_ENV = "RANKEXP_FAULT_SLEEP"


def _fault_injection(overrides: str) -> None:
    """Failure-handling tests.  ``$RANKEXP_FAULT_KILL=alpha=2``: the job with that override
    SIGKILLs itself right after its run exists — the way an OOM killer or a Slurm preemption
    ends a job, with no chance to report.  ``$RANKEXP_FAULT_HANG=alpha=2``: it waits (signals
    still land) — a job that runs past its time limit.  ``$RANKEXP_FAULT_SLEEP=1.5``: every job
    computes 1.5 s longer, idle (races between writers, without burning the CPU)."""
    if os.environ.get(SLEEP_ENV):
        time.sleep(float(os.environ[SLEEP_ENV]))
    mine = overrides.split()
    if os.environ.get(FAULT_ENV) in mine:
        log.warning("%s=%s: killing this job (pid %d)", FAULT_ENV, os.environ[FAULT_ENV], os.getpid())
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(HANG_ENV) in mine:
        log.warning("%s=%s: hanging until a signal (pid %d)", HANG_ENV, os.environ[HANG_ENV], os.getpid())
        for _ in range(36_000):
            time.sleep(0.1)


# --------------------------------------------------------------------------- signals
class _TimeLimit:
    """Submitit's SIGUSR2 says the Slurm time limit is near.  A resumable task turns it into a
    stop request (checkpoint, then requeue); any other task goes on, and the SIGTERM Slurm
    sends at the limit then means TIMEOUT."""

    def __init__(self, resumable: bool):
        self.resumable, self.warned = resumable, False

    def __call__(self, signum: int, frame: Any) -> None:
        self.warned = True
        if self.resumable:
            interrupt.handler(signum, frame)
        else:
            log.warning("SIGUSR2: the Slurm time limit is near; this task cannot checkpoint, so "
                        "it goes on (raise hydra.launcher.timeout_min if it is cut off)")


def run(cfg: DictConfig) -> dict[str, Any]:
    """Run one job end to end; returns ``{"status", "run_id", "scalars"}``.

    Raises:
        ConfigError: invalid config (before any run exists).
        TrackingError: the store cannot be used (single run: before any run exists), or it
            stopped answering (the result is in the job directory, for ``rankexp.sync``).
        JobInterrupted: a signal stopped the job (its run is KILLED, or FAILED at a time limit).
        Exception: whatever the task raised; the MLflow run is then FAILED.
    """
    interrupt.clear()
    # a log record that cannot be written (a full disk under the job log) is dropped, not
    # printed as a "--- Logging error ---" traceback (logging's advice for production)
    logging.raiseExceptions = False
    ctx = job_context()
    checked = checked_job(cfg, ctx.override_list)  # the sweeper's check of this job, or now
    s = checked.settings
    pin_threads(ctx.launcher)
    limit = _TimeLimit(s.task.name in RESUMABLE_TASKS)
    try:
        with interrupt.installed({signal.SIGUSR2: limit}) as previous:
            return Job(checked, ctx, limit, previous.get(signal.SIGUSR2)).run()
    finally:
        if os.environ.get("SUBMITIT_EXECUTOR"):
            # this process's one job is over: a late time-limit warning must neither requeue
            # it (submitit's handler) nor kill it while it exits (Python's default at shutdown)
            signal.signal(signal.SIGUSR2, signal.SIG_IGN)


class Job:
    """The state of one job while it runs (see the module docstring for its steps)."""

    def __init__(self, checked: CheckedJob, ctx: JobContext, limit: _TimeLimit,
                 requeue_handler: Any):
        s = checked.settings
        self.s, self.ctx, self.limit = s, ctx, limit
        # submitit's own USR2 handler (checkpoint + requeue) when running as a submitit job
        self.requeue_handler = requeue_handler if callable(requeue_handler) else None
        self.container, self.chash = checked.container, checked.config_hash
        self.device = resolve_device(s.device)
        self.job_dir = ctx.job_dir
        self.uri = self.exp_id = self.run_id = None
        self.offline: str | None = None  # why the store cannot be reached (or refused the run)
        self.refused = False  # … the store answered, refusing: not an outage
        self.logger: tracking.Journal | None = None
        self.name = run_name(s, ctx)

    # ------------------------------------------------------------------ steps
    def run(self) -> dict[str, Any]:
        s, job_dir = self.s, self.job_dir
        line = sweep_progress(self.ctx, self.name)
        if line:
            log.info("%s", line)
        tags = self._tags()
        previous = tracking.read_json(job_dir / tracking.STATUS_FILE) or {}
        if previous.get("config_hash") != self.chash:
            previous = {}
        if s.tracking.enabled:
            done = self._prepare_tracking(tags)
            again = s.tracking.resume and not s.tracking.force
            if (again and done is None and previous.get("status") == "FINISHED"
                    and previous.get("run_id") and self._store_status(previous["run_id"]) == "FINISHED"):
                # an earlier attempt of this very job finished (a Slurm requeue after the end):
                # the job stays FINISHED, counted once — not "skipped" as done by another sweep
                log.info("this job already FINISHED as run %s (an earlier attempt); nothing to do",
                         previous["run_id"])
                return {"status": "FINISHED", "run_id": previous["run_id"], "scalars": {}}
            if done:
                log.info("skipping: this config (hash %s) already FINISHED as run %s "
                         "(tracking.force=true reruns it)", self.chash, done)
                tracking.write_status(job_dir, "SKIPPED", run_id=done, config_hash=self.chash)
                return {"status": "SKIPPED", "run_id": done, "scalars": {}}
        out = job_dir / tracking.RESULT_DIR
        out.mkdir(parents=True, exist_ok=True)
        tracking.write_atomic(out / "config.yaml",
                              yaml.safe_dump(self.container, sort_keys=False).encode())
        params = run_params(self.container, s)
        tracking.write_json(job_dir / tracking.RUN_FILE, {
            "uri": self.uri, "experiment": s.tracking.experiment, "experiment_id": self.exp_id,
            "run_name": self.name, "params": params, "tags": tags, "config_hash": self.chash,
            "start_time": int(time.time() * 1000), "log_arrays": s.tracking.log_arrays})
        journal = job_dir / tracking.JOURNAL_FILE
        journal.unlink(missing_ok=True)
        try:
            if s.tracking.enabled and self.offline is None:
                stood_down = self._start_run(params, tags, journal, previous)
                if stood_down is not None:
                    return stood_down
            run_id = self.run_id
            if self.offline is not None or not s.tracking.enabled:
                self.logger = tracking.Journal(journal)
            tracking.write_status(job_dir, "RUNNING", run_id=run_id, config_hash=self.chash,
                                  uri=self.uri, **tracking.owner_tags())
            result = self._compute(run_id, out)
        except BaseException as e:
            with interrupt.deferred():  # a second signal must not cut the bookkeeping short
                self._failed(e)
            raise
        tracking.write_status(job_dir, "FINISHED", run_id=run_id, config_hash=self.chash,
                              uri=self.uri)
        headline = {k: result.scalars[k] for k in ("erank_io", "stable_rank_io", "best_test_accuracy")
                    if k in result.scalars}
        log.info("%s finished%s: %s", self.name, f" (run {run_id})" if run_id else "",
                 ", ".join(f"{k}={v:.4g}" for k, v in headline.items()))
        return {"status": "FINISHED", "run_id": run_id, "scalars": result.scalars}

    def _tags(self) -> dict[str, str]:
        dev = self.device
        return {
            **{str(k): str(v) for k, v in self.s.tracking.tags.items()},  # tracking.tags first
            "config_hash": self.chash,
            "git_commit": tracking.git_commit(),
            "overrides": self.ctx.overrides,
            "device": str(dev) + (f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else ""),
            "task": self.s.task.name,
            "torch_threads": str(torch.get_num_threads()),
            "job_dir": str(self.job_dir),
            **tracking.owner_tags(),
            **tracking.system_tags(),
            **({tracking.TAG_NOTE: self.s.tracking.note} if self.s.tracking.note else {}),
        }

    def _prepare_tracking(self, tags: dict[str, str]) -> str | None:
        """Find the store and experiment (the sweep's parent, else our own checks); returns the
        run id of a FINISHED run of this config to skip to, else None."""
        t = self.s.tracking
        tracking.configure_http(t.http_retries, t.http_timeout_s, t.http_backoff)
        self.uri = tracking.resolve_uri(t.uri)
        resume = t.resume and not t.force
        parent = tracking.read_parent(self.ctx.sweep_dir) if self.ctx.sweep_dir else None
        if parent and parent["uri"] == self.uri and parent["experiment"] == t.experiment:
            self.exp_id = parent["experiment_id"]
            tags["mlflow.parentRunId"] = parent["run_id"]
            tags["sweep_id"] = parent["sweep_id"]
            known = tracking.store_known_down(self.ctx.sweep_dir, self.uri)
            if known and known[1] < RECHECK_DOWN_S:  # another job just found it down: trust that
                self.offline = f"{known[0]}, found {known[1]:.0f} s ago by another job of the sweep"
            else:
                with tracking.quick_bounds() if known else contextlib.nullcontext():
                    self.offline = tracking.unreachable(self.uri)  # known down: asked briefly
                if known and self.offline is None:
                    tracking.clear_store_down(self.ctx.sweep_dir)
                if self.offline:
                    tracking.mark_store_down(self.ctx.sweep_dir, self.uri, self.offline)
            if self.offline:
                log.error("tracking store %s does not answer (%s): computing anyway; the result "
                          "goes to %s — log it later with `python -m rankexp.sync %s`",
                          self.uri, self.offline, self.job_dir, self.ctx.sweep_dir)
                return None
            finished = tracking.read_json(self.ctx.sweep_dir / tracking.FINISHED_FILE) or {}
            return finished.get(self.chash) if resume else None
        # a single run (or a sweep without rankexp's sweeper): check everything here
        tracking.check_store(self.uri)
        self.exp_id = tracking.prepare_experiment(self.uri, t.experiment)
        if t.description:
            tracking.describe_experiment(self.uri, self.exp_id, t.description)
        tracking.reconcile(self.uri, self.exp_id, t.stale_after_s)
        tags["sweep_id"] = str(self.ctx.sweep_dir) if self.ctx.sweep_dir else ""
        return tracking.find_finished(self.uri, self.exp_id, self.chash) if resume else None

    def _start_run(self, params: dict[str, Any], tags: dict[str, str], journal: Path,
                   previous: dict[str, Any]) -> dict[str, Any] | None:
        """Create the job's run, supersede an earlier attempt's, claim the config
        (:func:`rankexp.tracking.claim`).  Returns the job's outcome if it stands down for a
        run that holds the config (SKIPPED), else None — also when the store is lost
        (``self.offline``: the job computes into its job directory)."""
        t = self.s.tracking
        self.logger = tracking.RunLogger(self.uri, self.exp_id, self.name, params,
                                         tags, journal)  # the claim is stamped by tracking.claim
        try:
            self.run_id = self.logger.start()
        except Exception as e:  # the store went away (or refuses) just now: compute offline
            self._offline(e)
            return None
        # the earlier attempt's own run (a SKIPPED job's run id is the run that held its config)
        earlier = previous.get("run_id") if previous.get("status") in tracking.OWN_RUN_STATES else None
        if earlier:
            self._supersede(earlier, self.run_id)
        try:
            held = tracking.claim(self.uri, self.exp_id, self.chash, self.run_id, t.stale_after_s,
                                  finished_counts=t.resume and not t.force,
                                  ignore=[earlier] if earlier else [])
        except Exception as e:
            if not tracking.is_outage(e):
                raise tracking.StoreRefused(f"tracking store {tracking.redact(self.uri)} refused "
                                            f"a request ({tracking._first_line(e)})") from None
            self._offline(e)
            return None
        if held.won:
            return None
        with contextlib.suppress(Exception):  # else the job directory says it stood down
            tracking.stand_down(self.uri, self.run_id, held)
        reason = "finished" if held.status == "FINISHED" else "held"
        tracking.write_status(self.job_dir, "SKIPPED", run_id=held.holder, config_hash=self.chash,
                              uri=self.uri, reason=reason, stood_down=self.run_id,
                              held_by=held.where)
        log.info("skipping: this config (hash %s) is %s %s", self.chash,
                 "already FINISHED as" if reason == "finished" else "being computed by", held.where)
        return {"status": "SKIPPED", "run_id": held.holder, "scalars": {}}

    def _offline(self, e: BaseException) -> None:
        """The store failed this job's request: compute anyway, into the job directory.  An
        outage is told to the sweep's other jobs (:func:`rankexp.tracking.mark_store_down`)."""
        self.offline, self.refused = tracking._first_line(e), not tracking.is_outage(e)
        if not self.refused:
            tracking.mark_store_down(self.ctx.sweep_dir, self.uri, self.offline)
        log.error("tracking store %s %s (%s): computing anyway", tracking.redact(self.uri),
                  "refused the run" if self.refused else "stopped answering", self.offline)

    def _store_status(self, run_id: str) -> str | None:
        try:
            return tracking._client(self.uri).get_run(run_id).info.status
        except Exception:
            return None

    def _supersede(self, old: str, new: str) -> None:
        try:
            tracking.supersede(self.uri, old, new)
        except Exception as e:  # the new run is what matters; the old one is reconciled later
            log.warning("could not supersede the earlier run %s (%s)", old, tracking._first_line(e))

    def _compute(self, run_id: str | None, out: Path) -> Measurement:
        """Run the task, save its result, log it (or fail clearly when offline)."""
        s, logger = self.s, self.logger
        beat = (tracking.Heartbeat(self.uri, run_id, s.tracking.heartbeat_s) if run_id
                else contextlib.nullcontext())
        # a training run's CPU/memory (GPU with nvidia-ml-py) as MLflow system metrics; a
        # measurement lasts seconds, less than one sample
        system = (logger.system_metrics() if logger is not None and s.task.name == "train"
                  else contextlib.nullcontext())
        with beat, system:
            _fault_injection(self.ctx.overrides)
            result = TASKS[s.task.name](s, self.device, self.job_dir, logger, self.chash)
        save_result(out, result, {"config_hash": self.chash, "run_id": run_id},
                    None if s.tracking.log_arrays else self.job_dir)
        hint = (f"the result is in {self.job_dir}: log it with `python -m rankexp.sync "
                f"{self.ctx.sweep_dir or self.job_dir}` once the store is back")
        if isinstance(logger, tracking.RunLogger):
            try:
                logger.finish(result.scalars, result.series, out)
            except tracking.TrackingError as e:
                raise type(e)(f"{e}; {hint}") from None
        elif s.tracking.enabled and self.refused:
            raise tracking.StoreRefused(
                f"tracking store {tracking.redact(self.uri)} refused the run ({self.offline}); {hint}")
        elif s.tracking.enabled:
            raise tracking.TrackingLost(
                f"tracking store {tracking.redact(self.uri)} did not answer ({self.offline}); {hint}")
        return result

    # ------------------------------------------------------------------ endings
    def _failed(self, e: BaseException) -> None:
        """Close the run and the job's status for whatever stopped the job."""
        run_id = self.run_id
        if isinstance(e, interrupt.JobInterrupted):
            status, reason, message = self._interrupted(e.signal_name)
        elif isinstance(e, KeyboardInterrupt):
            status, reason, message = "KILLED", "SIGINT", "interrupted (KeyboardInterrupt)"
        elif isinstance(e, SystemExit):
            status, reason, message = "KILLED", "requeued", "checkpointed and requeued by submitit"
        elif isinstance(e, tracking.StoreRefused):
            status, reason, message = "FAILED", "store_error", str(e)
        elif isinstance(e, tracking.TrackingError):
            reason = "tracking_unreachable" if self.offline else "tracking_lost"
            status, message = "FAILED", str(e)
            tracking.mark_store_down(self.ctx.sweep_dir, self.uri, str(e)[:300])
        else:
            status, reason, message = "FAILED", "exception", f"{type(e).__name__}: {e}"
            log.error("job failed: %s", message, exc_info=e)
        if isinstance(self.logger, tracking.RunLogger):
            self.logger.end(status, reason, message)
        tracking.write_status(self.job_dir, status, run_id=run_id, config_hash=self.chash,
                              uri=self.uri, reason=reason, error=message[:2000])
        if status == "KILLED":
            log.warning("job stopped (%s): run %s is KILLED", reason, run_id)

    def _interrupted(self, name: str) -> tuple[str, str, str]:
        """(status, reason, message) for a stop request; at a Slurm time-limit warning a
        resumable task is handed to submitit's handler, which requeues it (SystemExit) or
        refuses once ``max_num_timeout`` is spent (UncompletedJobError)."""
        if name == "SIGUSR2" and self.requeue_handler is not None:
            try:
                self.requeue_handler(signal.SIGUSR2, None)
            except SystemExit:
                log.warning("time limit near: checkpointed, requeued by submitit")
                return "KILLED", "requeued", "time limit near: checkpointed and requeued"
            except Exception as e:  # submitit's UncompletedJobError: no requeue left
                return "FAILED", "TIMEOUT", f"time limit reached, not requeued: {e}"
            return "KILLED", "requeued", "time limit near: checkpointed and requeued"
        if self.limit.warned:
            return "FAILED", "TIMEOUT", f"{name} after the time-limit warning: the Slurm time limit"
        return "KILLED", name, f"interrupted by {name}"
