"""``hydra/sweeper=rankexp`` (the default): a sweep checked as a whole, with its parent run.

A Sweeper plugin on Hydra's public interface (as Hydra's example sweeper plugin: the launcher
from ``Plugins.instance().instantiate_launcher``, each job composed by ``load_sweep_config``):

1. Its jobs are a union of grids (:mod:`.grids`).
2. Every job is composed and checked (:func:`rankexp.config.check_task`) and each store
   (:func:`rankexp.tracking.check_store`) before the first job starts: any bad job, every bad
   one listed, exit 2, nothing created.  A job whose config hash an earlier job has is left
   out; an in-process job reuses the check's composition (:class:`ComposedOnce`) and result
   (:data:`rankexp.config.CHECKED_JOBS`).
3. It owns the parent run (:class:`rankexp.tracking.SweepRun`), closed with every job's outcome.
4. Exit status: 0 every job FINISHED or skipped, 1 a job failed, was killed or did not run, 2
   an invalid sweep, 128+N when signal N stopped it (its runs KILLED).
"""

import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any

from hydra.core.config_loader import ConfigLoader
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from rankexp import cli, console, interrupt, naming, tracking
from rankexp.config import CHECKED_JOBS, ConfigError, check_options_used, check_task

from . import grids

log = logging.getLogger(__name__)


def _message(e: BaseException) -> str:
    """One line for a composition or config error: :func:`rankexp.cli.one_line`, else the
    first lines of Hydra's message and its cause's."""
    line = cli.one_line(e)
    if line is not None:
        return line
    parts = [str(e).strip()] + ([str(e.__cause__).strip()] if e.__cause__ is not None else [])
    lines = [ln.strip() for p in parts for ln in p.splitlines()[:2] if ln.strip()]
    return " — ".join(lines) or type(e).__name__


def _label(job: list[str], swept: Any) -> str:
    """A job by its swept overrides (all of them when it sweeps nothing)."""
    return " ".join(o for o in job if o.split("=", 1)[0].lstrip("+~") in swept) or " ".join(job)


class ComposedOnce:
    """Hydra's config loader whose ``load_sweep_config`` hands the in-process basic launcher the
    config the whole-sweep check composed for that job (each job composed once, ~0.1 s); the
    rest of the loader's interface is the wrapped loader's."""

    def __init__(self, inner: ConfigLoader) -> None:
        self.inner, self.composed = inner, {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        cfg = self.composed.pop(tuple(sweep_overrides), None)
        if cfg is None:
            return self.inner.load_sweep_config(master_config, sweep_overrides)
        OmegaConf.set_readonly(cfg.hydra, None)  # resolving the job dir may have locked it
        return cfg


class RankexpSweeper(Sweeper):
    """See the module docstring."""

    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None,
                 grids: Any = None) -> None:
        self.max_batch_size, self.params, self.grids = max_batch_size, params, grids

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        self.hydra_context, self.config = hydra_context, config
        self.once = None
        if str(config.hydra.launcher.get("_target_", "")).endswith(".BasicLauncher"):
            self.once = ComposedOnce(hydra_context.config_loader)  # jobs run in this process
            hydra_context = HydraContext(config_loader=self.once, callbacks=hydra_context.callbacks)
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        cli.mark_composed()
        plan = self._plan(arguments)
        with interrupt.installed():
            try:
                parent = self._prepare(plan)
            except interrupt.JobInterrupted as e:
                raise SystemExit(128 + signal.Signals[e.signal_name].value) from None
            interrupted, returns = None, []
            try:
                self._execute(parent, returns)
            except interrupt.JobInterrupted as e:
                interrupted = e.signal_name
            except KeyboardInterrupt:
                interrupted = "SIGINT"
            finally:
                with interrupt.deferred():
                    status = self._finish(parent, interrupted, returns)
        if interrupted:
            raise SystemExit(128 + signal.Signals[interrupted].value)
        if status != "FINISHED":
            raise SystemExit(1)
        return returns

    def _prepare(self, plan: grids.Plan):
        """Check the whole sweep, leave out the twins, open the parent run (None offline)."""
        checked = self._check_all(plan.jobs, set(plan.swept))
        plan = plan.drop(checked.pop("keys"))
        for job, twin in plan.dropped:
            log.info("left out %s: the same config as a job%s", _label(job, plan.swept),
                     f" of grid {twin!r}" if twin else "")
        checked["names"] = plan.names(checked["names"])
        self.jobs, self.swept, self.dirs = plan.jobs, plan.swept, checked["job_dirs"]
        return self._open_parent(checked)

    def _execute(self, parent, returns: list) -> None:
        returns += self._launch(self.jobs)

    def _plan(self, arguments: list[str]) -> grids.Plan:
        """The jobs (:func:`.grids.expand`); exits 2 on malformed grids."""
        try:
            return grids.expand(self.params, self.grids, arguments, OverridesParser.create())
        except grids.GridError as e:
            print(f"error: invalid sweep — nothing was started: {e}", file=sys.stderr)
            raise SystemExit(2) from None

    def _check_all(self, jobs: list[list[str]], swept: set[str], first: int = 0) -> dict[str, Any]:
        """Compose and check every job (numbered from ``first``) and every store; exit 2 listing
        every problem.  ``keys``: each job's (config hash, store, experiment); a job whose key
        an earlier job has is left out (and not numbered)."""
        if not jobs:
            self._refuse(0, ["  the sweep has no jobs: "
                             f"{' '.join(self.config.hydra.overrides.task)} expands to nothing "
                             "(an empty range or list?)"])
        launcher = self.config.hydra.launcher
        if "joblib" in str(launcher.get("_target_", "")) and launcher.get("n_jobs") == 0:
            self._refuse(len(jobs), ["  hydra.launcher.n_jobs=0: joblib runs no job with 0 workers; "
                                     "give a count ≥ 1, or a negative one (-1: every core)"])
        local = "submitit" not in str(launcher.get("_target_", ""))
        loader = self.hydra_context.config_loader
        CHECKED_JOBS.clear()
        errors, keys, job_dirs, hashes, settings, names = [], [], [], [], [], []
        seen: set[tuple] = set()
        original = HydraConfig.instance().cfg
        try:
            for i, overrides in enumerate(jobs):
                label = _label(overrides, swept)
                try:
                    cfg = loader.load_sweep_config(self.config, overrides)
                    with open_dict(cfg.hydra.job):
                        cfg.hydra.job.num = cfg.hydra.job.id = first + len(hashes)
                    checked = check_task(cfg, device=local, overrides=overrides)
                except Exception as e:  # composition (Hydra/OmegaConf) or config errors
                    errors.append(f"  #{first + i} {label}: {_message(e)}")
                    continue
                t = checked.settings.tracking  # a config hash names a run within its store
                keys.append((checked.config_hash, t.enabled and t.uri, t.experiment))
                if keys[-1] in seen:
                    continue
                seen.add(keys[-1])
                CHECKED_JOBS[tuple(cfg.hydra.overrides.task)] = checked
                if self.once is not None:
                    self.once.composed[tuple(overrides)] = cfg
                job_dirs.append(self._job_dir(cfg))
                hashes.append(checked.config_hash)
                settings.append(checked.settings)
                names.append(naming.config_name(checked.settings))
        finally:
            HydraConfig.instance().cfg = original
        try:
            if not errors and first == 0:  # the whole sweep (a contour's first round)
                check_options_used(settings)
        except ConfigError as e:
            errors.append(f"  {e}")
        stores: set[str] = set()
        for s in settings if not errors else []:  # a store is checked (created) for a valid sweep only
            t = s.tracking
            if not t.enabled:
                continue
            tracking.configure_http(t.http_retries, t.http_timeout_s, t.http_backoff)
            try:
                uri = tracking.resolve_uri(t.uri)
                if uri not in stores:
                    stores.add(uri)
                    tracking.check_store(uri)
            except tracking.TrackingError as e:
                if f"  {e}" not in errors:
                    errors.append(f"  {e}")
        if errors:
            CHECKED_JOBS.clear()
            if self.once is not None:
                self.once.composed.clear()
            self._refuse(len(jobs), errors)
        return {"keys": keys, "job_dirs": job_dirs, "hashes": hashes, "settings": settings,
                "names": names}

    @staticmethod
    def _refuse(count: int, errors: list[str]) -> None:
        print(f"error: invalid sweep — nothing was started ({count} jobs):\n" + "\n".join(errors),
              file=sys.stderr)
        raise SystemExit(2)

    @staticmethod
    def _job_dir(cfg: DictConfig) -> Path:
        """``hydra.sweep.dir / hydra.sweep.subdir`` of one job, as its launcher resolves it."""
        from omegaconf.errors import InterpolationResolutionError

        try:
            return Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
        except InterpolationResolutionError:  # a ${hydra:…} in the pattern
            HydraConfig.instance().set_config(cfg)
            return Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)

    def _open_parent(self, checked: dict[str, Any]):
        """The sweep directory and, when the jobs log to MLflow, the parent run."""
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        tracking.write_json(sweep_dir / tracking.NAMES_FILE, {  # the plan: every job's name and dir
            "started": time.time(), "names": checked["names"],
            "job_dirs": [str(d.resolve()) for d in checked["job_dirs"]]})
        first = checked["settings"][0]
        t = first.tracking
        if not t.enabled:
            return None
        command = tracking.command_line()
        headline = {"train": "best_test_accuracy"}.get(first.task.name, "erank_io, stable_rank_io")
        note = (f"```\n{command}\n```\n\n{len(checked['job_dirs'])} jobs in `{sweep_dir}`"
                f" (size={first.size.value}).\n\nSwept: {', '.join(self.swept) or 'nothing'}; "
                f"headline: {headline} (the run table's Columns).")
        experiment = self.config.hydra.runtime.choices.get("experiment") or t.experiment
        parent = tracking.SweepRun(
            tracking.resolve_uri(t.uri), t.experiment, sweep_dir, checked["job_dirs"],
            " ".join(OmegaConf.to_container(self.config.hydra.overrides.task)),  # as typed
            t.heartbeat_s, t.stale_after_s,
            name=t.run_name or naming.sweep_name(experiment, first.size.value),
            note=f"{t.note}\n\n{note}" if t.note else note,
            tags={str(k): str(v) for k, v in t.tags.items()}, description=t.description)
        try:
            parent.open()
        except Exception as e:  # noqa: BLE001 — any store failure: nothing has run
            print(f"error: could not open the sweep's run in {tracking.redact(parent.uri)}: "
                  f"{tracking._first_line(e)}",
                  file=sys.stderr)
            raise SystemExit(2) from None
        return parent

    def _launch(self, jobs: list[list[str]], first: int = 0) -> list:
        """The jobs in batches of ``max_batch_size`` through the launcher, numbered from
        ``first``; a failed job does not stop the sweep.  A bar of jobs done on a terminal, unless
        joblib's workers write their lines there themselves."""
        n = self.max_batch_size if self.max_batch_size and self.max_batch_size > 0 else len(jobs)
        parallel = "joblib" in str(self.config.hydra.launcher.get("_target_", ""))
        with console.sweep_bar(self.dirs[first:first + len(jobs)], enabled=not parallel):
            return [self.launcher.launch(jobs[i:i + n], initial_job_idx=first + i)
                    for i in range(0, len(jobs), n)]

    def _finish(self, parent, interrupted: str | None, returns: list) -> str:
        """Report failed jobs one line each, close the parent (or just count), return its status."""
        for idx, r in enumerate(r for batch in returns for r in batch):
            if isinstance(r, JobReturn) and r.status == JobStatus.FAILED:
                log.error("job #%d (%s) failed: %s (job dir %s)", idx, _label(self.jobs[idx], self.swept),
                          _message(r._return_value), self.dirs[idx])
        if parent is not None:
            return parent.close(interrupted)[0]
        counts = tracking.count_jobs(self.dirs)
        log.info("sweep %s: %s", self.config.hydra.sweep.dir, tracking.summary(counts))
        bad = counts["failed"] or counts["killed"] or counts["not_run"]
        return "KILLED" if interrupted else "FAILED" if bad else "FINISHED"
