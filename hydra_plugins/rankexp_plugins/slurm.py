"""``hydra/launcher=slurm``: hydra-submitit-launcher's Slurm launcher, waiting for every job.

The plugin's ``launch`` returns at the first job that failed (raising), while the others of
the array still run, so the sweep would count them before they end.  Here every job's outcome
comes back — a failed or vanished one as a FAILED ``JobReturn`` carrying submitit's error —
and an interrupted sweep (SIGTERM, Ctrl-C) cancels the jobs it submitted (``scancel``), so
their runs end KILLED instead of logging into a closed sweep.  A job Slurm keeps pending for
a reason no wait fixes (its request exceeds what the partition, QOS or account allows:
:data:`IMPOSSIBLE`) is reported and cancelled within a minute instead of waiting forever;
:func:`check_cluster` is the sweeper's check of the request against the cluster (``sinfo``,
``sbatch --help``) before anything exists.  Submission is the plugin's own, with one change:
each job's interpreter starts with SIGUSR2 ignored (submitit's ``python`` command, wrapped in
``trap '' USR2``).  Slurm may send the time-limit warning up to a minute
early — with a short limit, while the job is still importing torch — and its default action
would kill the job before submitit and rankexp install their handlers.

Two keys the plugin does not have (:class:`RankexpSlurmConf`):

* ``jobs_per_task=k`` packs k jobs of the sweep into one array task, run one after the other
  in its interpreter (each job its own run, job directory and outcome), so a sweep of
  thousands of short jobs is ⌈N/k⌉ scheduler entries and ⌈N/k⌉ interpreter start-ups.
* ``detach=true`` submits the array, writes the sweep's plan (:data:`rankexp.sweepctl.PLAN_FILE`)
  and returns: the sweeper leaves the parent run open, and each job, as it ends, counts the
  sweep into the parent run; the job that finds every job ended closes it
  (:func:`rankexp.sweepctl.job_ended`).  ``rankexp status`` / ``rankexp cancel`` follow it.
"""


import contextlib
import difflib
import logging
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf, SlurmQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
from omegaconf import OmegaConf

log = logging.getLogger(__name__)


#: squeue reasons of a pending job that no wait will fix: the request exceeds what its
#: partition, QOS or account allows, or names what does not exist
IMPOSSIBLE = re.compile(r"PartitionConfig|PartitionNodeLimit|PartitionTimeLimit|BadConstraints|"
                        r"InvalidAccount|InvalidQOS|(QOS|Assoc)Max\w*PerJob\w*")
PENDING_GRACE_S = 30.0  # a job pending for such a reason this long is reported and cancelled
SQUEUE_EVERY_S = 10.0


@dataclass
class RankexpSlurmConf(SlurmQueueConf):
    """The plugin's ``SlurmQueueConf`` and rankexp's two keys (see the module docstring)."""

    _target_: str = "hydra_plugins.rankexp_plugins.slurm.RankexpSlurmLauncher"
    #: submit, write the plan, return; the jobs close the sweep's parent run themselves
    detach: bool = False
    #: jobs of the sweep run one after the other inside one array task (≥ 1)
    jobs_per_task: int = 1


ConfigStore.instance().store(group="hydra/launcher", name="rankexp_slurm", node=RankexpSlurmConf,
                             provider="rankexp")


@dataclass
class Pack:
    """What one array task runs: the plugin's call arguments of each of its jobs, in order."""

    sweep_dir: str
    detach: bool
    jobs: list[tuple] = field(default_factory=list)

    @property
    def numbers(self) -> list[int]:
        return [j[2] for j in self.jobs]


class RankexpSlurmLauncher(SlurmLauncher):
    """See the module docstring."""

    def __init__(self, **params: Any) -> None:
        self.detach = bool(params.pop("detach", False))
        self.jobs_per_task = int(params.pop("jobs_per_task", 1) or 1)
        super().__init__(**params)
        self.detached: dict | None = None  # the plan, once a detached sweep is submitted

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit

        assert self.config is not None
        packs = self._packs(job_overrides, initial_job_idx)
        tasks = self._submit(submitit, packs)
        if self.detach:
            from rankexp import sweepctl

            beats = {k: OmegaConf.select(self.config, f"tracking.{k}") for k in ("heartbeat_s", "stale_after_s")}
            self.detached = sweepctl.write_plan(Path(packs[0].sweep_dir), tasks, packs, {**self.params, **beats})
            return []
        try:
            return self._wait(tasks, packs)
        except BaseException:
            log.warning("sweep interrupted: cancelling its Slurm jobs %s", [j.job_id for j in tasks])
            for job in tasks:
                with contextlib.suppress(Exception):
                    job.cancel(check=False)
            raise

    def __call__(self, pack: Pack) -> list[JobReturn]:  # type: ignore[override]
        """One array task, in the job: its jobs one after the other (the plugin's ``__call__``
        each); a detached sweep's parent run is counted after each and kept alive meanwhile.
        A stop signal ends the task after the job it interrupted (the others are not run)."""
        from rankexp import startup, sweepctl

        startup.begin()  # the task's imports (torch, MLflow) without the cyclic GC: rankexp.startup
        returns = []
        try:
            with sweepctl.parent_heartbeat(Path(pack.sweep_dir)) if pack.detach else contextlib.nullcontext():
                for args in pack.jobs:
                    try:
                        returns.append(super().__call__(*args))
                    finally:
                        if pack.detach:
                            sweepctl.job_ended(Path(pack.sweep_dir))
        finally:
            startup.end()
        return returns

    def _packs(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[Pack]:
        """The batch's jobs, ``jobs_per_task`` to an array task, in order."""
        assert self.config is not None
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).resolve()
        # Hydra's state (a deep copy of its singletons: 0.13 s under load), the same for every
        # job: copied once, not per job as the plugin does (2,000 jobs: minutes), and pickled
        # once per array task
        state, jobs = Singleton.get_state(), []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            jobs.append((list(overrides), "hydra.sweep.dir", idx, f"job_id_for_{idx}", state))
        k = max(1, self.jobs_per_task)
        return [Pack(str(sweep_dir), self.detach, jobs[i:i + k]) for i in range(0, len(jobs), k)]

    def _wait(self, tasks: list, packs: list[Pack]) -> list[JobReturn]:
        """Every job's outcome, in order (a task's outcome is that of each of its jobs)."""
        returns = []
        for pack, outcome in zip(packs, self._wait_tasks(tasks, [
                [o for j in p.jobs for o in j[0]] for p in packs]), strict=True):
            if isinstance(outcome, list) and len(outcome) == len(pack.jobs):
                returns += outcome
            else:  # the task failed as a whole (or ended early): its unfinished jobs share that
                done = outcome if isinstance(outcome, list) else []
                error = outcome._return_value if isinstance(outcome, JobReturn) else RuntimeError(
                    f"array task ended after {len(done)} of its {len(pack.jobs)} jobs")
                returns += done + [JobReturn(overrides=list(j[0]), status=JobStatus.FAILED,
                                             _return_value=error) for j in pack.jobs[len(done):]]
        return returns

    def _wait_tasks(self, jobs: list, job_overrides: Sequence[Sequence[str]]) -> list:
        """Every task's outcome, in order; a task pending for a reason no wait fixes
        (:data:`IMPOSSIBLE`) is reported and cancelled after :data:`PENDING_GRACE_S`."""
        returns: dict[int, Any] = {}
        seen: dict[str, float] = {}  # job id → when first seen pending for an impossible reason
        asked = -math.inf
        while len(returns) < len(jobs):
            waiting = [i for i in range(len(jobs)) if i not in returns]
            for i in waiting:
                if jobs[i].done():
                    returns[i] = _outcome(jobs[i], job_overrides[i])
            now, stuck = time.monotonic(), {}
            if now - asked >= SQUEUE_EVERY_S:  # squeue at most this often (a busy cluster)
                asked = now
                stuck = _impossible({jobs[i].job_id for i in waiting if i not in returns})
            for i in waiting:
                job, why = jobs[i], stuck.get(jobs[i].job_id)
                if i in returns or why is None:
                    continue
                first = seen.setdefault(job.job_id, now)
                if now - first >= PENDING_GRACE_S:
                    message = (f"Slurm job {job.job_id} cannot start: pending with reason {why} "
                               "(the request exceeds what its partition, QOS or account allows); "
                               "cancelled — lower the request (hydra.launcher.*) or pick another "
                               "partition")
                    log.error("%s", message)
                    with contextlib.suppress(Exception):
                        job.cancel(check=False)
                    returns[i] = JobReturn(overrides=list(job_overrides[i]), status=JobStatus.FAILED,
                                           _return_value=RuntimeError(message))
            if len(returns) < len(jobs):
                time.sleep(2)
        return [returns[i] for i in range(len(jobs))]

    def _submit(self, submitit: Any, packs: list[Pack]) -> list:
        """The plugin's submission (one array, the same parameters), one task per pack."""
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
        return executor.map_array(self, packs)


def _outcome(job: Any, overrides: Sequence[str]) -> Any:
    try:
        return job.results()[0]
    except Exception as e:  # submitit: FailedJobError, UncompletedJobError
        return JobReturn(overrides=list(overrides), status=JobStatus.FAILED, _return_value=e)


def _impossible(job_ids: set[str]) -> dict[str, str]:
    """``{job id: squeue reason}`` of the jobs pending for an :data:`IMPOSSIBLE` reason."""
    if not job_ids:
        return {}
    arrays = sorted({j.split("_")[0] for j in job_ids})
    try:
        p = subprocess.run(["squeue", "-h", "-r", "-j", ",".join(arrays), "-o", "%i|%T|%r"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return {}
    out = {}
    for line in p.stdout.splitlines():
        job, state, reason = (line.split("|") + ["", ""])[:3]
        if job in job_ids and state == "PENDING" and IMPOSSIBLE.fullmatch(reason.strip()):
            out[job] = reason.strip()
    return out


# --------------------------------------------------------------------------- the whole-sweep check
def check_cluster(launcher: Any) -> list[str]:
    """What the cluster says about the launcher's request, before anything exists: Slurm is
    there and answers (``sinfo``), the partition exists and is up, and one job's CPUs
    (``cpus_per_task`` × ``tasks_per_node``), memory (``mem_gb``), GPUs (``gpus_per_node``),
    nodes and time limit (``timeout_min``) fit its largest node and its limits; every
    ``additional_parameters`` key is an sbatch option (``sbatch --help``).

    Returns:
        One message per problem (empty: the request fits).
    """
    k = launcher.get("jobs_per_task", 1)
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        return [f"hydra.launcher.jobs_per_task={k!r}: must be a whole number ≥ 1 (jobs run one "
                "after the other in each array task)"]
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return ["hydra/launcher=slurm needs Slurm, and sbatch/sinfo are not on PATH: this machine "
                "is not a Slurm submit host (run the sweep where sbatch works, or drop "
                "hydra/launcher=slurm for a local sweep)"]
    part = launcher.get("partition")
    rows = _sinfo(["-p", str(part)] if part else [])
    if isinstance(rows, str):
        return [rows]
    if not part:
        rows = [r for r in rows if r["partition"].endswith("*")] or rows
    if not rows:
        names = _sinfo([])
        known = ", ".join(sorted({r["partition"].rstrip("*") for r in names})) \
            if isinstance(names, list) else "?"
        return [f"hydra.launcher.partition={part!r}: Slurm has no such partition (it has: {known})"]
    return _fits(launcher, rows) + _unknown_options(launcher)


def _sinfo(args: list[str]) -> list[dict[str, str]] | str:
    fields = ("partition", "avail", "cpus", "memory", "timelimit", "gres", "nodes")
    try:
        p = subprocess.run(["sinfo", "-h", "-o", "%P|%a|%c|%m|%l|%G|%D", *args],
                           capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.SubprocessError) as e:
        return (f"Slurm does not answer (sinfo: {type(e).__name__}, after at most 15 s); is "
                "slurmctld up, SLURM_CONF right?")
    if p.returncode != 0:
        line = next((x for x in p.stderr.splitlines() if x.strip()), f"exit {p.returncode}")
        return f"Slurm does not answer (sinfo: {line.strip()}); is slurmctld up, SLURM_CONF right?"
    return [dict(zip(fields, line.split("|"), strict=False)) for line in p.stdout.splitlines()
            if line.count("|") == len(fields) - 1]


def _number(text: str) -> float:
    """``"2"``, ``"2+"``, ``"21695"`` → the number; anything else (``n/a``) → infinity."""
    m = re.match(r"\d+", text.strip())
    return float(m[0]) if m else math.inf


def _minutes(limit: str) -> float:
    """A Slurm time limit (``infinite``, ``1-00:00:00``, ``2:00:00``, ``30:00``) in minutes."""
    limit = limit.strip().lower()
    if not limit or limit in ("infinite", "unlimited", "n/a", "none"):
        return math.inf
    days, _, rest = limit.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    h, m, sec = ([0] * (3 - len(parts)) + parts) if len(parts) > 1 else (0, parts[0], 0)
    return int(days or 0) * 1440 + h * 60 + m + sec / 60


def _fits(launcher: Any, rows: list[dict[str, str]]) -> list[str]:
    part = rows[0]["partition"].rstrip("*")
    where = f"partition {part}"
    if all(r["avail"] != "up" for r in rows):
        return [f"{where} is {rows[0]['avail']} (sinfo): no job would start there"]
    errors = []
    cpus, mem = max(_number(r["cpus"]) for r in rows), max(_number(r["memory"]) for r in rows)
    want = int(launcher.get("cpus_per_task") or 1) * int(launcher.get("tasks_per_node") or 1)
    if want > cpus:
        errors.append(f"hydra.launcher.cpus_per_task={launcher.get('cpus_per_task')} (× "
                      f"tasks_per_node={launcher.get('tasks_per_node') or 1}) — {where}'s largest "
                      f"node has {cpus:g} CPUs")
    if launcher.get("mem_gb") and float(launcher.mem_gb) * 1024 > mem:
        errors.append(f"hydra.launcher.mem_gb={launcher.mem_gb} — {where}'s largest node has "
                      f"{mem / 1024:.1f} GB ({mem:g} MB)")
    limit = max(_minutes(r["timelimit"]) for r in rows)
    if launcher.get("timeout_min") and float(launcher.timeout_min) > limit:
        errors.append(f"hydra.launcher.timeout_min={launcher.timeout_min} — {where} allows at "
                      f"most {limit:g} min")
    nodes = sum(int(_number(r["nodes"])) for r in rows)
    if int(launcher.get("nodes") or 1) > nodes:
        errors.append(f"hydra.launcher.nodes={launcher.nodes} — {where} has {nodes} nodes")
    gpus = max((_number(g.split(":")[-1].split("(")[0]) for r in rows for g in r["gres"].split(",")
                if g.startswith("gpu")), default=0)
    if int(launcher.get("gpus_per_node") or 0) > gpus:
        errors.append(f"hydra.launcher.gpus_per_node={launcher.gpus_per_node} — {where}'s nodes "
                      f"have {gpus:g} GPUs (gres {rows[0]['gres']})")
    return errors


def _unknown_options(launcher: Any) -> list[str]:
    extra = dict(launcher.get("additional_parameters") or {})
    if not extra:
        return []
    try:
        text = subprocess.run(["sbatch", "--help"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    known = set(re.findall(r"--([a-z][a-z0-9-]*)", text))
    bad = [k for k in extra if str(k).replace("_", "-") not in known]
    if not known or not bad:
        return []
    return [f"hydra.launcher.additional_parameters.{k}: sbatch has no option --{str(k).replace('_', '-')}"
            + (f" (did you mean --{close[0]}?)" if (close := difflib.get_close_matches(
                str(k).replace("_", "-"), sorted(known), n=1)) else "") for k in bad]
