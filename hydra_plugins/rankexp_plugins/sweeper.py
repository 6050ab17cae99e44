"""``hydra/sweeper=rankexp`` (the default): Hydra's basic sweeper, made trustworthy.

Same grid, batches and ``hydra.sweeper.params`` as Hydra's ``BasicSweeper``; what it adds:

0. **A sweep can be a union of grids** (``hydra.sweeper.grids``, :mod:`.grids`): an
   experiment's every configuration in one sweep, one check, one parent run.

1. **The whole sweep is checked before its first job starts.**  Every job is composed (once:
   :class:`~hydra_plugins.rankexp_plugins.loader.TemplateConfigLoader`) and checked
   (:func:`rankexp.config.check_job`: unknown keys, values, paths, the device for local
   launchers), the launcher's time limits too, and each store the jobs log to
   (:func:`rankexp.tracking.check_store`).  Any bad job: every bad combination is listed, the
   command exits 2, nothing is created — no run, no sweep directory.
2. **It owns the sweep's parent run** (:class:`rankexp.tracking.SweepRun`): opened once the
   sweep is valid, after closing stale runs of the experiment whose owners are gone; closed
   with the true outcome of every job, whatever stopped the sweep.
3. **Signals stop it cleanly.**  SIGTERM/SIGINT/SIGHUP in the sweeping process close the
   in-flight run KILLED (the basic launcher runs jobs in this process) and the parent KILLED
   with true counts; the exit status is 128+N.
4. **Exit status agrees with MLflow**: 0 when every job FINISHED or was skipped, 1 when a job
   failed, was killed or did not run (one line per failed job), 2 for an invalid sweep.
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from . import grids
from .loader import TemplateConfigLoader

log = logging.getLogger(__name__)


def _message(e: BaseException) -> str:
    """One line for a composition or config error: rankexp's (:func:`rankexp.errors.one_line`:
    key, value, what is allowed, a suggestion), else Hydra's message and its cause's."""
    from rankexp.errors import one_line

    line = one_line(e)
    if line is not None:
        return line
    parts = [str(e).strip()]
    if e.__cause__ is not None and str(e.__cause__).strip():
        parts.append(str(e.__cause__).strip())
    lines = [line.strip() for p in parts for line in p.splitlines()[:2] if line.strip()]
    return " — ".join(lines) or type(e).__name__


class RankexpSweeper(BasicSweeper):
    """See the module docstring."""

    def __init__(self, max_batch_size: int | None, params: dict[str, str] | None = None,
                 grids: Any = None) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)
        self.grids = grids

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        self.loader = TemplateConfigLoader(hydra_context.config_loader)
        context = HydraContext(config_loader=self.loader, callbacks=hydra_context.callbacks)
        super().setup(hydra_context=context, task_function=task_function, config=config)

    # ------------------------------------------------------------------ the sweep
    def sweep(self, arguments: list[str]) -> Any:
        from rankexp import cli, interrupt, startup

        cli.mark_composed()
        plan = self._plan(arguments)
        jobs, swept = plan.jobs, set(plan.swept)
        with interrupt.installed():
            try:
                checked = self._check_all(jobs, swept)
                checked["names"] = plan.names(checked["names"])
                parent = self._open_parent(checked)
            except interrupt.JobInterrupted as e:
                raise SystemExit(128 + signal.Signals[e.signal_name].value) from None
            interrupted, returns = None, []
            startup.end()  # the sweep is checked and its parent open (rankexp.startup)
            try:
                returns = self._launch_all()
            except interrupt.JobInterrupted as e:
                interrupted = e.signal_name
            except KeyboardInterrupt:
                interrupted = "SIGINT"
            finally:
                with interrupt.deferred():
                    detached = None if interrupted else getattr(self.launcher, "detached", None)
                    status = (self._detach(parent, detached, checked) if detached else
                              self._close(parent, checked["job_dirs"], interrupted, returns, jobs, swept))
        if interrupted:
            raise SystemExit(128 + signal.Signals[interrupted].value)
        if status not in ("FINISHED", "DETACHED"):
            raise SystemExit(1)
        return returns

    def _plan(self, arguments: list[str]) -> grids.Plan:
        """The sweep's jobs: the union of ``hydra.sweeper.grids`` (:mod:`.grids`; without grids
        the basic sweeper's product), a job whose config another job already has left out, in
        launcher batches (``self.overrides``).  Exits 2 on malformed grids."""
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        try:
            plan = grids.expand(self.params, self.grids, arguments, parser)
        except grids.GridError as e:
            print(f"error: invalid sweep — nothing was started: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        if len(plan.axes) > 1:
            plan = grids.drop_repeats(plan, self.loader, self.config)
        for job, twin in plan.dropped:
            log.info("left out %s: the same config as a job of grid %r", " ".join(job), twin)
        self.overrides = plan.batches(self.max_batch_size)
        return plan

    def _check_all(self, jobs: list[list[str]], swept: set[str], first: int = 0) -> dict[str, Any]:
        """Compose and check every job and every store; exit 2 listing every problem.  The jobs
        are numbered from ``first`` (a later round of :class:`~.contour.ContourSweeper`)."""
        from rankexp import tracking
        from rankexp.config import check_slurm_limits
        from rankexp.naming import config_name  # torch-free: the check never loads torch

        target = str(self.config.hydra.launcher.get("_target_", ""))
        local = "submitit" not in target
        if not jobs:
            self._refuse(0, ["  the sweep has no jobs: "
                             f"{' '.join(self.config.hydra.overrides.task)} expands to nothing "
                             "(an empty range or list?)"])
        errors, job_dirs, hashes, settings, names = [], [], [], [], []
        try:
            check_slurm_limits(self.config.hydra.launcher)
        except ValueError as e:
            errors.append(f"  launcher: {e}")
        if "Slurm" in target:
            from .slurm import check_cluster

            errors += [f"  launcher: {m}" for m in check_cluster(self.config.hydra.launcher)]
        original = HydraConfig.instance().cfg
        try:
            for idx, overrides in enumerate(jobs, start=first):
                label = " ".join(o for o in overrides if o.split("=", 1)[0].lstrip("+~") in swept)
                try:
                    cfg = self.loader.load_sweep_config(self.config, overrides)
                    with open_dict(cfg.hydra.job):
                        cfg.hydra.job.num = cfg.hydra.job.id = idx
                    job_dirs.append(self._job_dir(cfg))
                    checked = self.loader.check(cfg, device=local, overrides=overrides)  # once
                    s = checked.settings
                    hashes.append(checked.config_hash)
                    settings.append(s)
                    names.append(config_name(s))
                except Exception as e:  # composition (Hydra/OmegaConf) or config errors
                    errors.append(f"  #{idx} {label or ' '.join(overrides)}: {_message(e)}")
        finally:
            HydraConfig.instance().cfg = original
        stores: set[str] = set()
        for s in settings if not errors else []:  # a store is checked (created) for a valid sweep only
            t = s.tracking
            if not t.enabled:
                continue
            tracking.configure_http(t.http_retries, t.http_timeout_s, t.http_backoff)
            try:
                uri = tracking.resolve_uri(t.uri)
                if uri in stores:  # each store once, answering or not
                    continue
                stores.add(uri)
                tracking.check_store(uri)
            except tracking.TrackingError as e:
                if f"  {e}" not in errors:
                    errors.append(f"  {e}")
        if errors:
            self._refuse(len(jobs), errors)
        return {"job_dirs": job_dirs, "hashes": hashes, "settings": settings, "names": names}

    @staticmethod
    def _refuse(count: int, errors: list[str]) -> None:
        print(f"error: invalid sweep — nothing was started ({count} jobs):\n" + "\n".join(errors),
              file=sys.stderr)
        raise SystemExit(2)

    @staticmethod
    def _job_dir(cfg: DictConfig) -> Path:
        """``hydra.sweep.dir / hydra.sweep.subdir`` of one job, as its launcher will resolve it
        (through Hydra's ``${hydra:…}`` resolver only when the pattern needs it: that copy
        costs more than the rest of the check)."""
        from omegaconf.errors import InterpolationResolutionError

        try:
            return Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
        except InterpolationResolutionError:
            HydraConfig.instance().set_config(cfg)
            return Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)

    def _open_parent(self, checked: dict[str, Any]):
        """The sweep directory and, when the jobs log to MLflow, the parent run."""
        from rankexp import naming, tracking

        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        tracking.write_json(sweep_dir / tracking.NAMES_FILE, {  # the plan: every job's name and dir
            "started": time.time(), "names": checked["names"],
            "job_dirs": [str(d.resolve()) for d in checked["job_dirs"]]})
        first = checked["settings"][0].tracking
        if not first.enabled:
            return None
        choices = self.config.hydra.runtime.choices
        command = tracking.command_line()
        note = (f"```\n{command}\n```\n\n{len(checked['job_dirs'])} jobs in `{sweep_dir}`"
                f" (size={checked['settings'][0].size.value}).")
        parent = tracking.SweepRun(
            tracking.resolve_uri(first.uri), first.experiment, sweep_dir, checked["job_dirs"],
            " ".join(self.config.hydra.overrides.task), first.heartbeat_s, first.stale_after_s,
            name=first.run_name or naming.sweep_name(choices.get("experiment") or first.experiment,
                                                     checked["settings"][0].size.value),
            note=f"{first.note}\n\n{note}" if first.note else note,
            tags={str(k): str(v) for k, v in first.tags.items()}, description=first.description)
        try:
            parent.open(checked["hashes"], resume=first.resume and not first.force)
        except Exception as e:
            print(f"error: could not open the sweep's run in {parent.uri}: "
                  f"{tracking._first_line(e)}", file=sys.stderr)
            raise SystemExit(2) from None
        return parent

    def _launch_all(self, first: int = 0) -> list:
        """Hydra's batch loop, without its re-validation and without stopping at a failed job;
        the jobs are numbered from ``first``."""
        returns = []
        while not self.is_done():
            batch = self.get_job_batch()
            results = self.launcher.launch(batch, initial_job_idx=first)
            first += len(batch)
            returns.append(results)
        return returns

    @staticmethod
    def _detach(parent, plan: dict, checked: dict[str, Any]) -> str:
        """A detached Slurm sweep (``hydra.launcher.detach=true``): the jobs close the parent."""
        from rankexp import sweepctl

        t = checked["settings"][0].tracking
        return sweepctl.detach(parent, plan, t.heartbeat_s, t.stale_after_s)

    def _close(self, parent, job_dirs: list[Path], interrupted: str | None, returns: list,
               jobs: list[list[str]], swept: set[str]) -> str:
        """Report failed jobs one line each, close the parent (or just count), return its status."""
        from rankexp import tracking

        for idx, r in enumerate(r for batch in returns for r in batch):
            if isinstance(r, JobReturn) and r.status == JobStatus.FAILED:
                label = " ".join(o for o in jobs[idx] if o.split("=", 1)[0].lstrip("+~") in swept)
                log.error("job #%d (%s) failed: %s (job dir %s)", idx, label, _message(r._return_value),
                          job_dirs[idx])
        if parent is not None:
            status, _ = parent.close(interrupted)
            return status
        counts = tracking.count_jobs(job_dirs)
        log.info("sweep %s: %s", self.config.hydra.sweep.dir, tracking.summary(counts))
        bad = counts["failed"] or counts["killed"] or counts["not_run"]
        return "KILLED" if interrupted else "FAILED" if bad else "FINISHED"

