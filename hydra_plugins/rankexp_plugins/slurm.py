"""``hydra/launcher=slurm``: hydra-submitit-launcher's Slurm launcher, waiting for every job.

The plugin's ``launch`` returns at the first job that failed (raising), while the others of
the array still run, so the sweep would count them before they end.  Here every job's outcome
comes back — a failed or vanished one as a FAILED ``JobReturn`` carrying submitit's error —
and an interrupted sweep (SIGTERM, Ctrl-C) cancels the jobs it submitted (``scancel``), so
their runs end KILLED instead of logging into a closed sweep.  Submission is the plugin's own,
with one change: each job's interpreter starts with SIGUSR2 ignored (submitit's ``python``
command, wrapped in ``trap '' USR2``).  Slurm may send the time-limit warning up to a minute
early — with a short limit, while the job is still importing torch — and its default action
would kill the job before submitit and rankexp install their handlers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
from omegaconf import OmegaConf

log = logging.getLogger(__name__)


class RankexpSlurmLauncher(SlurmLauncher):
    """See the module docstring."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit

        assert self.config is not None
        jobs = self._submit(submitit, job_overrides, initial_job_idx)
        returns: list[JobReturn] = []
        try:
            for job, overrides in zip(jobs, job_overrides, strict=True):
                try:
                    returns.append(job.results()[0])
                except Exception as e:  # submitit: FailedJobError, UncompletedJobError
                    returns.append(JobReturn(overrides=list(overrides), status=JobStatus.FAILED,
                                             _return_value=e))
        except BaseException:
            log.warning("sweep interrupted: cancelling its Slurm jobs %s", [j.job_id for j in jobs])
            for job in jobs:
                with contextlib.suppress(Exception):
                    job.cancel(check=False)
            raise
        return returns

    def _submit(self, submitit: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list:
        """The plugin's submission (one array, the same parameters), unchanged."""
        params = self.params
        init_keys = {"max_num_timeout", "submitit_folder"}
        python = f"sh -c 'trap \"\" USR2; exec \"$0\" \"$@\"' {shlex.quote(sys.executable)}"
        executor = submitit.AutoExecutor(
            cluster=self._EXECUTOR, folder=params["submitit_folder"], slurm_python=python,
            **{f"{self._EXECUTOR}_max_num_timeout": params[k] for k in ("max_num_timeout",) if k in params})
        base = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in base else f"{self._EXECUTOR}_{k}": v
                                      for k, v in params.items() if k not in init_keys})
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if "mode" in self.config.hydra.sweep:
            os.chmod(sweep_dir, mode=int(str(self.config.hydra.sweep.mode), 8))
        log.info(f"Submitit '{self._EXECUTOR}' sweep output dir : {sweep_dir}")
        job_params = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            job_params.append((list(overrides), "hydra.sweep.dir", idx, f"job_id_for_{idx}",
                               Singleton.get_state()))
        return executor.map_array(self, *zip(*job_params, strict=True))
