"""One Hydra job: check → skip or claim → compute → job directory → MLflow.

The config is checked before any run exists.  A config with a FINISHED run is skipped
(``tracking.force`` reruns it); else the job creates its run and claims the config
(:func:`rankexp.tracking.claim`), standing down when an earlier live claimant holds it.
Everything goes to the job directory first (:mod:`rankexp.jobdir`); a store that fails the job
does not stop it: the job fails with exit status 1 and ``python -m rankexp.sync`` logs it
later.  SIGTERM/SIGINT/SIGHUP end a run KILLED, a Slurm time limit FAILED (``TIMEOUT``);
submitit's SIGUSR2 makes a training job checkpoint and requeue (the next attempt supersedes
this run).
"""

from __future__ import annotations

import contextlib
import functools
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
from omegaconf import DictConfig, OmegaConf

from . import interrupt, naming, tracking
from .config import CheckedJob, RankexpConfig, checked_job, flatten, resolve_device
from .models.families import family_of
from .result import Measurement
from .tasks import TASKS
from .tasks.loop import duration
from .tasks.measure import RUN_FACTS

log = logging.getLogger("rankexp")
#: a run's description says what its charts' "Step" is: the UI names the axis only "Step"
STEP_AXIS = ("Charts: **Step** is the layer l (1 … depth) for per-layer series, the path order k "
             "for `path_*`, the depth for `T_*` and the training step (the epoch with "
             "`task.epochs`) for training curves.")

#: the scalars a job's INFO line shows, those it has (else its first two science scalars)
HEADLINE = ("erank_io", "stable_rank_io", "best_test_accuracy")
#: tasks that checkpoint, so a time-limit warning (SIGUSR2) can requeue them
RESUMABLE_TASKS = {"train"}


def derived_params(s: RankexpConfig) -> dict[str, float]:
    """What the model family derives from the config: ``beta_eff``, ``nominal_ratio`` βα^M
    (Eq. 21) and ``depth_factor`` βα^M√L for the residual MLP and plain nets; none else."""
    derived = family_of(s).derived
    return dict(derived(s)) if derived is not None else {}


def run_params(container: dict[str, Any], s: RankexpConfig) -> dict[str, Any]:
    """The run's MLflow params: the config flattened with dots, without ``tracking.*``,
    ``device``, ``threads`` (the ``torch_threads`` tag), unset values, and (for a measurement)
    ``data.*``, the memory budget and the options of probes it does not run; plus
    :func:`derived_params`."""
    c = {k: v for k, v in container.items() if k not in ("tracking", "device", "threads")}
    if s.task.name == "measure":
        c.pop("data", None)
        task = {k: v for k, v in c["task"].items() if k != "max_memory_gb"}
        task["options"] = {p: o for p, o in (task.get("options") or {}).items() if p in s.task.probes}
        c["task"] = task
    return {k: v for k, v in {**flatten(c), **derived_params(s)}.items()
            if v is not None and v != {}}


def run_name(s: RankexpConfig, ctx: JobContext) -> str:
    """The name its sweep gave the job (in a sweep ``tracking.run_name`` names the parent),
    else ``tracking.run_name``, else :func:`rankexp.naming.config_name`."""
    names = sweep_record(ctx).get("names", [])
    return names[ctx.num] if ctx.num is not None and ctx.num < len(names) \
        else s.tracking.run_name or naming.config_name(s)


def sweep_record(ctx: JobContext) -> dict[str, Any]:
    """The sweeper's record of this job's sweep (:data:`rankexp.tracking.NAMES_FILE`), or {}."""
    return (tracking.read_json(ctx.sweep_dir / tracking.NAMES_FILE) or {}) if ctx.sweep_dir else {}


def sweep_progress(ctx: JobContext) -> tuple[str, str]:
    """``("job 3/8 ", "; 3 done in 1m10s, ETA 3m30s")`` for a job of a sweep as it ends (ETA from
    the sweep's throughput so far), else empty strings."""
    record = sweep_record(ctx)
    if ctx.num is None or "names" not in record:
        return "", ""
    total = len(record["names"])
    done = sum((tracking.read_json(ctx.sweep_dir / str(i) / tracking.STATUS_FILE) or {}).get("status")
               in ("FINISHED", "SKIPPED", "FAILED", "KILLED") for i in range(total))
    elapsed = time.time() - float(record.get("started", time.time()))
    eta = f", ETA {duration(elapsed / done * (total - done))}" if done < total else ""
    return f"job {ctx.num + 1}/{total} ", f"; {done} done in {duration(elapsed)}{eta}"


def save_result(out_dir: Path, result: Measurement, extra: dict[str, Any],
                arrays_dir: Path | None = None) -> None:
    """Write ``result.json`` (scalars, series, ``extra``) into ``out_dir`` and ``arrays.npz``
    there too, or into ``arrays_dir`` (kept on disk, not uploaded); atomically both."""
    import io

    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {**extra, "scalars": result.scalars, "series": {
        k: {"steps": np.asarray(st).tolist(), "values": np.asarray(v).tolist()}
        for k, (st, v) in result.series.items()}}
    tracking.write_atomic(out_dir / "result.json", json.dumps(doc, indent=1, default=float).encode())
    if result.arrays:
        buf = io.BytesIO()
        np.savez_compressed(buf, **result.arrays)
        tracking.write_atomic((arrays_dir or out_dir) / "arrays.npz", buf.getvalue())


@dataclass
class JobContext:
    """Where the running Hydra job is: its directory, its sweep's (None for a single run),
    its overrides (one string, and one each) and its launcher's config."""

    job_dir: Path
    sweep_dir: Path | None
    overrides: str
    launcher: DictConfig | None
    num: int | None = None  # the job's number in its sweep
    override_list: tuple[str, ...] = ()


def job_context() -> JobContext:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return JobContext(Path.cwd(), None, "", None)
    hc = HydraConfig.get()
    sweep = Path(hc.sweep.dir) if hc.mode == RunMode.MULTIRUN else None
    typed = OmegaConf.to_container(hc.overrides.task)  # unresolved: ${oc.env:…} as typed
    return JobContext(Path(hc.runtime.output_dir), sweep, " ".join(typed),
                      hc.launcher if sweep else None, hc.job.get("num") if sweep else None,
                      tuple(hc.overrides.task))


#: below this width a job's matrices are too small for a second torch thread to pay
THREADS_MIN_WIDTH = 128


def job_threads(s: RankexpConfig, launcher: DictConfig | None) -> int:
    """The torch threads of a job: ``threads=N`` as given; ``auto``: the cores this process may
    use (its affinity; under Slurm its ``cpus_per_task``) ÷ the jobs a joblib launcher runs
    beside it, else, outside Slurm, no more than :func:`idle_cores` (threads on busy cores wait
    for each other: several times slower than one thread); 1 below :data:`THREADS_MIN_WIDTH`."""
    if s.threads != "auto":
        return int(s.threads)
    cores = len(os.sched_getaffinity(0))
    if os.environ.get("SLURM_CPUS_PER_TASK", "").isdigit():
        cores = min(cores, int(os.environ["SLURM_CPUS_PER_TASK"]))
    if launcher is not None and "joblib" in str(launcher.get("_target_", "")):
        n_jobs = int(launcher.get("n_jobs") or 1)
        cores //= n_jobs if n_jobs > 0 else max(1, cores + 1 + n_jobs)
    elif not os.environ.get("SLURM_JOB_ID"):
        cores = min(cores, idle_cores())
    return max(1, cores) if s.width >= THREADS_MIN_WIDTH else 1


@functools.cache
def idle_cores() -> int:
    """The cores other processes leave idle (CPUs − the 1-minute load average) when this
    process's first job starts; later jobs of a sequential sweep keep it (their load is its own)."""
    return round((os.cpu_count() or 1) - os.getloadavg()[0])


def pin_threads(s: RankexpConfig, launcher: DictConfig | None) -> None:
    """Set the job's torch and OpenMP threads to :func:`job_threads` (logged as the
    ``torch_threads`` tag)."""
    threads = job_threads(s, launcher)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)


FAULT_ENV, HANG_ENV, SLEEP_ENV = "RANKEXP_FAULT_KILL", "RANKEXP_FAULT_HANG", "RANKEXP_FAULT_SLEEP"


def _fault_injection(overrides: str) -> None:
    """Failure-handling tests: ``$RANKEXP_FAULT_KILL=alpha=2``: the job with that override
    SIGKILLs itself once its run exists (an OOM kill); ``$RANKEXP_FAULT_HANG=alpha=2``: it waits
    for a signal (a time limit); ``$RANKEXP_FAULT_SLEEP=1.5``: every job idles 1.5 s longer."""
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


class _TimeLimit:
    """Submitit's SIGUSR2 (the Slurm time limit is near): a stop request (checkpoint, requeue)
    for a resumable task; any other goes on, and Slurm's SIGTERM then means TIMEOUT."""

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
    """Run one job end to end; returns ``{"status", "run_id", "scalars"}``.  Raises
    ConfigError (before any run exists), TrackingError (the store cannot be used, or stopped
    answering), JobInterrupted (a signal: the run is KILLED, or FAILED at a time limit), or
    whatever the task raised (the run is FAILED)."""
    interrupt.clear()
    logging.raiseExceptions = False  # a log line a full disk refuses is dropped, no traceback
    ctx = job_context()
    checked = checked_job(cfg, ctx.override_list)  # the sweeper's check of this job, or now
    s = checked.settings
    pin_threads(s, ctx.launcher)
    limit = _TimeLimit(s.task.name in RESUMABLE_TASKS)
    try:
        with interrupt.installed({signal.SIGUSR2: limit}) as previous:
            return Job(checked, ctx, limit, previous.get(signal.SIGUSR2)).run()
    finally:
        if os.environ.get("SUBMITIT_EXECUTOR"):
            # the job is over: a late time-limit warning must neither requeue nor kill it
            signal.signal(signal.SIGUSR2, signal.SIG_IGN)


class Job:
    """The state of one job while it runs (see the module docstring for its steps)."""

    def __init__(self, checked: CheckedJob, ctx: JobContext, limit: _TimeLimit, requeue_handler: Any):
        self.s, self.ctx, self.limit, self.job_dir = checked.settings, ctx, limit, ctx.job_dir
        # submitit's own USR2 handler (checkpoint + requeue)
        self.requeue_handler = requeue_handler if callable(requeue_handler) else None
        self.container, self.chash, self.legacy = checked.container, checked.config_hash, \
            checked.legacy_hash
        self.device = resolve_device(self.s.device)
        self.uri = self.exp_id = self.run_id = None
        self.offline: str | None = None  # why the store failed this job
        self.logger: tracking.RunLogger | None = None
        self.name = run_name(self.s, ctx)

    def run(self) -> dict[str, Any]:
        s, job_dir, t, t0 = self.s, self.job_dir, self.s.tracking, time.time()
        tags = self._tags()
        previous = tracking.read_json(job_dir / tracking.STATUS_FILE) or {}
        earlier = previous.get("run_id") if previous.get("config_hash") == self.chash else None
        if t.enabled:
            done = self._connect(tags)
            if done and done == earlier and previous.get("status") == "FINISHED":
                log.info("this job already FINISHED as run %s (an earlier attempt)", done)
                return {"status": "FINISHED", "run_id": done, "scalars": {}}
            if done:
                log.info("skipping: this config (hash %s) already FINISHED as run %s "
                         "(tracking.force=true reruns it)", self.chash, done)
                tracking.write_status(job_dir, "SKIPPED", run_id=done, config_hash=self.chash)
                return {"status": "SKIPPED", "run_id": done, "scalars": {}}
        out = job_dir / tracking.RESULT_DIR
        out.mkdir(parents=True, exist_ok=True)
        text = tracking.redact(yaml.safe_dump(self.container, sort_keys=False))
        tracking.write_atomic(out / "config.yaml", text.encode())
        params = run_params(self.container, s)
        tracking.write_json(job_dir / tracking.RUN_FILE, {
            "uri": tracking.redact(self.uri or ""), "experiment": t.experiment, "run_name": self.name,
            "params": params, "tags": tags, "config_hash": self.chash, "legacy_hash": self.legacy,
            "start_time": int(time.time() * 1000), "log_arrays": t.log_arrays})
        journal = job_dir / tracking.JOURNAL_FILE
        journal.unlink(missing_ok=True)
        try:
            self.logger = tracking.Journal(journal)
            if t.enabled and self.offline is None:
                stood_down = self._start_run(params, tags, journal, earlier if previous.get(
                    "status") in ("RUNNING", "FAILED", "KILLED") else None)
                if stood_down is not None:
                    return stood_down
            tracking.write_status(job_dir, "RUNNING", run_id=self.run_id, config_hash=self.chash,
                                  **tracking.owner_tags())
            result = self._compute(out)
        except BaseException as e:
            with interrupt.deferred():  # a second signal must not cut the bookkeeping short
                self._failed(e)
            raise
        if t.enabled and t.force and self.run_id:  # the rerun replaces the config's old result
            try:
                old = tracking.supersede_finished(self.uri, self.exp_id, self.chash, self.run_id)
                log.debug("tracking.force: run %s supersedes %s", self.run_id, ", ".join(old) or "none")
            except Exception as e:
                log.error("tracking.force: the old runs of this config stay FINISHED beside run %s "
                          "(%s)", self.run_id, tracking._first_line(e))
        tracking.write_status(job_dir, "FINISHED", run_id=self.run_id, config_hash=self.chash)
        scalars = result.scalars
        headline = [k for k in HEADLINE if k in scalars] or [
            k for k in scalars if k not in RUN_FACTS and not k.endswith("_std")][:2]
        job, eta = sweep_progress(self.ctx)
        took = time.time() - t0
        log.info("%s%s finished in %s: %s%s%s", job, self.name,
                 f"{took:.1f}s" if took < 10 else duration(took),
                 ", ".join(f"{k}={scalars[k]:.4g}" for k in headline),
                 f" (run {self.run_id})" if self.run_id else "", eta)
        return {"status": "FINISHED", "run_id": self.run_id, "scalars": result.scalars}

    def _tags(self) -> dict[str, str]:
        dev = self.device
        return {
            **{str(k): str(v) for k, v in self.s.tracking.tags.items()},  # tracking.tags first
            "config_hash": self.chash,
            "git_commit": tracking.git_commit(),
            "overrides": tracking.redact(self.ctx.overrides),
            "device": str(dev) + (f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else ""),
            "task": self.s.task.name,
            "torch_threads": str(torch.get_num_threads()),
            "job_dir": str(self.job_dir),
            **tracking.owner_tags(),
            **tracking.system_tags(),
            tracking.TAG_NOTE: "\n\n".join(filter(None, [self.s.tracking.note,
                                                          STEP_AXIS])),
        }

    def _connect(self, tags: dict[str, str]) -> str | None:
        """The store and experiment (the sweep's parent's, else checked here); returns a
        FINISHED run of this config to skip to (unless ``tracking.force``)."""
        t = self.s.tracking
        tracking.configure_http(t.http_retries, t.http_timeout_s, t.http_backoff)
        self.uri = tracking.resolve_uri(t.uri)
        sweep = self.ctx.sweep_dir
        parent = tracking.read_json(sweep / tracking.PARENT_FILE) if sweep else None
        if parent and parent["uri"] == tracking.redact(self.uri) and parent["experiment"] == t.experiment:
            self.exp_id = parent["experiment_id"]
            tags.update({"mlflow.parentRunId": parent["run_id"], "sweep_id": parent["sweep_id"]})
        else:  # a single run (or a sweep without rankexp's sweeper): check everything here
            tracking.check_store(self.uri)
            self.exp_id = tracking.prepare_experiment(self.uri, t.experiment, t.description)
            tracking.reconcile(self.uri, self.exp_id, t.stale_after_s)
            tags["sweep_id"] = str(sweep or "")
        if not t.resume or t.force:
            return None
        try:
            return tracking.find_finished(self.uri, self.exp_id, self.chash, self.legacy)
        except Exception as e:  # the store went away: compute into the job directory
            self._offline(e)
            return None

    def _start_run(self, params: dict[str, Any], tags: dict[str, str], journal: Path,
                   earlier: str | None) -> dict[str, Any] | None:
        """Create the job's run, supersede this job's earlier attempt, claim the config.
        Returns the job's outcome (SKIPPED) if it stands down, else None."""
        t = self.s.tracking
        logger = tracking.RunLogger(self.uri, self.exp_id, self.name, params, tags, journal)
        try:
            self.run_id = logger.start()
            self.logger = logger
            if earlier:
                tracking.supersede(self.uri, earlier, self.run_id)
            held = tracking.claim(self.uri, self.exp_id, self.chash, self.run_id, t.stale_after_s,
                                  finished_counts=t.resume and not t.force, ignore=[earlier or ""])
        except Exception as e:  # the store went away, or refuses: compute into the job directory
            self._offline(e)
            return None
        if held.won:
            return None
        with contextlib.suppress(Exception):  # else the job directory says it stood down
            tracking.stand_down(self.uri, self.run_id, held)
        reason = "finished" if held.status == "FINISHED" else "held"
        tracking.write_status(self.job_dir, "SKIPPED", run_id=held.holder, config_hash=self.chash,
                              reason=reason, stood_down=self.run_id, held_by=held.where)
        log.info("skipping: this config (hash %s) is %s %s", self.chash,
                 "already FINISHED as" if reason == "finished" else "being computed by", held.where)
        return {"status": "SKIPPED", "run_id": held.holder, "scalars": {}}

    def _offline(self, e: BaseException) -> None:
        self.offline = tracking._first_line(e)
        if self.logger is not None:
            self.logger.lost = self.offline
        log.error("tracking store %s failed (%s): computing anyway, into %s", tracking.redact(self.uri),
                  self.offline, self.job_dir)

    def _compute(self, out: Path) -> Measurement:
        """Run the task, save its result, log it (or fail clearly when the store failed)."""
        s, logger = self.s, self.logger
        beat = (tracking.Heartbeat(self.uri, self.run_id, s.tracking.heartbeat_s)
                if self.run_id and self.offline is None else contextlib.nullcontext())
        # a training run's CPU/memory (GPU with nvidia-ml-py) as MLflow system metrics
        system = logger.system_metrics() if s.task.name == "train" else contextlib.nullcontext()
        with beat, system:
            _fault_injection(self.ctx.overrides)
            result = TASKS[s.task.name](s, self.device, self.job_dir, logger, self.chash)
        save_result(out, result, {"config_hash": self.chash, "run_id": self.run_id},
                    None if s.tracking.log_arrays else self.job_dir)
        if not s.tracking.enabled:
            return result
        try:
            if self.offline is not None:
                raise tracking.TrackingLost(f"tracking store {tracking.redact(self.uri)} failed "
                                            f"({self.offline})")
            logger.finish(result.scalars, result.series, out)
        except tracking.TrackingLost as e:
            raise tracking.TrackingLost(f"{e}; the result is in {self.job_dir}: log it with "
                                        f"`python -m rankexp.sync {self.ctx.sweep_dir or self.job_dir}`"
                                        " once the store is back") from None
        return result

    def _failed(self, e: BaseException) -> None:
        """Close the run and the job's status for whatever stopped the job."""
        if isinstance(e, interrupt.JobInterrupted):
            status, reason, message = self._interrupted(e.signal_name)
        elif isinstance(e, KeyboardInterrupt):
            status, reason, message = "KILLED", "SIGINT", "interrupted (KeyboardInterrupt)"
        elif isinstance(e, SystemExit):
            status, reason, message = "KILLED", "requeued", "checkpointed and requeued by submitit"
        elif isinstance(e, tracking.TrackingError):
            status, reason, message = "FAILED", "store_error", str(e)
        else:
            status, reason, message = "FAILED", "exception", f"{type(e).__name__}: {e}"
            log.error("job failed: %s", message, exc_info=e)
        if self.logger is not None and self.logger.run_id is not None:
            self.logger.lost = None  # a refusal may not stop the closing request
            self.logger.end(status, reason, message)
        tracking.write_status(self.job_dir, status, run_id=self.run_id, config_hash=self.chash,
                              reason=reason, error=message[:2000])
        if status == "KILLED":
            log.warning("job stopped (%s): run %s is KILLED", reason, self.run_id)

    def _interrupted(self, name: str) -> tuple[str, str, str]:
        """(status, reason, message) for a stop request; at a Slurm time-limit warning a
        resumable task is handed to submitit's handler, which requeues it (SystemExit) or
        refuses once ``max_num_timeout`` is spent (UncompletedJobError)."""
        if name == "SIGUSR2" and self.requeue_handler is not None:
            try:
                self.requeue_handler(signal.SIGUSR2, None)
            except SystemExit:
                log.warning("time limit near: checkpointed, requeued by submitit")
            except Exception as e:  # submitit's UncompletedJobError: no requeue left
                return "FAILED", "TIMEOUT", f"time limit reached, not requeued: {e}"
            return "KILLED", "requeued", "time limit near: checkpointed and requeued"
        if self.limit.warned:
            return "FAILED", "TIMEOUT", f"{name} after the time-limit warning: the Slurm time limit"
        return "KILLED", name, f"interrupted by {name}"
