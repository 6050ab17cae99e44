"""``hydra/launcher=local``: hydra-joblib-launcher's parallel local sweep, surviving a lost worker.

When one loky worker process dies under a job (the OOM killer, ``kill -9``), loky breaks its
whole pool: it SIGKILLs the other workers and ``joblib.Parallel`` raises
``TerminatedWorkerError``, so Hydra's launcher aborts the sweep — the other in-flight job
killed, the rest never run.  Here the same jobs run through the plugin's own ``execute_job``
under ``joblib.Parallel``; after a breakdown the launcher reads each job's directory
(``status.json``) and goes on with a fresh pool:

* the job whose worker died first (told by a watcher of this process's children through Linux
  pidfds) is FAILED with ``rankexp.end_reason=worker_lost`` and its exit signal;
* the jobs loky killed with it, and those not started, run again (the rerun supersedes the
  killed attempt's run);
* when the first death cannot be told apart (several workers died at once, no pidfds), every
  in-flight job runs again once, and a job in flight at two breakdowns is FAILED
  ``worker_lost``.

Jobs that ended before the breakdown keep their outcome; the sweep's summary counts the lost
job as failed, and each is reported in one line.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher

log = logging.getLogger(__name__)


class WorkerDeaths:
    """Records, from a daemon thread, this process's child processes as they exit, in order
    (``events``: ``[(monotonic time, {pid, …})]``, the pids found exited at one wake-up)."""

    def __init__(self) -> None:
        self.events: list[tuple[float, set[int]]] = []
        self._stop = threading.Event()
        self._fds: dict[int, int] = {}
        self._thread = threading.Thread(target=self._watch, daemon=True, name="rankexp-workers")

    @staticmethod
    def children() -> set[int]:
        pids: set[int] = set()
        for f in Path("/proc/self/task").glob("*/children"):
            with contextlib.suppress(OSError, ValueError):
                pids |= {int(p) for p in f.read_text().split()}
        return pids

    def _watch(self) -> None:
        poller = select.poll()
        while not self._stop.is_set():
            for pid in self.children() - self._fds.keys():
                try:
                    self._fds[pid] = os.pidfd_open(pid)
                except OSError:
                    continue
                poller.register(self._fds[pid], select.POLLIN)
            ready = poller.poll(100)
            if ready:
                by_fd = {fd: pid for pid, fd in self._fds.items()}
                self.events.append((time.monotonic(), {by_fd[fd] for fd, _ in ready}))
                for fd, _ in ready:
                    poller.unregister(fd)

    def first_death(self, pids: set[int]) -> set[int]:
        """The pids among ``pids`` seen exiting first (together), or an empty set."""
        for _, dead in self.events:
            if dead & pids:
                return dead & pids
        return set()

    def __enter__(self) -> WorkerDeaths:
        if hasattr(os, "pidfd_open") and Path("/proc/self/task").is_dir():
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=1)
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)


class RankexpJoblibLauncher(JoblibLauncher):
    """See the module docstring."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from hydra_plugins.hydra_joblib_launcher import _core  # joblib, numpy: when launching
        from joblib import Parallel, delayed
        from joblib.externals.loky.process_executor import TerminatedWorkerError

        setup_globals()
        assert self.config is not None and self.hydra_context is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        cfg = dict(self.joblib, backend="loky")
        _core.process_joblib_cfg(cfg)
        log.info("Joblib.Parallel(%s) is launching %d jobs", ",".join(f"{k}={v}" for k, v in cfg.items()),
                 len(job_overrides))
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.info("\t#%d : %s", idx, " ".join(filter_overrides(overrides)))
        returns: dict[int, JobReturn] = {}
        breakdowns: dict[int, int] = {}  # job → breakdowns it was in flight at
        while len(returns) < len(job_overrides):
            todo = [i for i in range(len(job_overrides)) if i not in returns]
            state = Singleton.get_state()
            try:
                with WorkerDeaths() as deaths:
                    done = Parallel(**cfg)(delayed(_core.execute_job)(
                        initial_job_idx + i, job_overrides[i], self.hydra_context, self.config,
                        self.task_function, state) for i in todo)
                returns.update(zip(todo, done, strict=True))
            except TerminatedWorkerError as e:
                time.sleep(0.2)  # the watcher's last wake-up
                self._after_breakdown(todo, job_overrides, initial_job_idx, returns, breakdowns,
                                      deaths, e)
        return [returns[i] for i in range(len(job_overrides))]

    def _after_breakdown(self, todo: list[int], job_overrides: Sequence[Sequence[str]], first: int,
                         returns: dict[int, JobReturn], breakdowns: dict[int, int],
                         deaths: WorkerDeaths, error: BaseException) -> None:
        """Sort the jobs of a broken pool by their job directories: ended ones keep their
        outcome, the lost one is FAILED ``worker_lost``, the others run again."""
        from rankexp import tracking

        sweep = Path(str(self.config.hydra.sweep.dir))
        docs = {i: tracking.read_json(sweep / str(first + i) / tracking.STATUS_FILE) or {}
                for i in todo}
        flying = {i: int(d[tracking.TAG_PID]) for i, d in docs.items()
                  if d.get("status") == "RUNNING" and str(d.get(tracking.TAG_PID, "")).isdigit()}
        culprits = deaths.first_death(set(flying.values()))
        exit_codes = str(error).split("The exit codes of the workers are", 1)[-1].split("\n")[0].strip()
        for i in todo:
            doc, overrides = docs[i], list(job_overrides[i])
            if doc.get("status") in ("FINISHED", "SKIPPED", "FAILED", "KILLED"):
                ok = doc["status"] in ("FINISHED", "SKIPPED")
                returns[i] = JobReturn(overrides=overrides, _return_value=doc,
                                       status=JobStatus.COMPLETED if ok else JobStatus.FAILED)
                if not ok:
                    returns[i]._return_value = RuntimeError(doc.get("error") or doc["status"])
            elif i in flying:
                breakdowns[i] = breakdowns.get(i, 0) + 1
                lost = flying[i] in culprits if len(culprits) == 1 else breakdowns[i] > 1
                if lost:
                    returns[i] = self._lost(sweep / str(first + i), doc, overrides, flying[i],
                                            exit_codes)
                else:
                    log.warning("job #%d was killed with its pool (another worker died): it runs "
                                "again", first + i)

    @staticmethod
    def _lost(job_dir: Path, doc: dict, overrides: list[str], pid: int, exit_codes: str) -> JobReturn:
        """FAILED ``worker_lost``: the job's run (if the store answers) and its status."""
        from rankexp import tracking

        message = (f"its worker process {pid} died (exit {exit_codes or 'unknown'}: killed, e.g. "
                   "by the OOM killer or kill -9); the sweep goes on without it")
        log.error("job %s: %s", job_dir.name, message)
        run_id, uri = doc.get("run_id"), doc.get("uri")
        params = (tracking.read_json(job_dir / tracking.RUN_FILE) or {}).get("params")  # not sent yet
        if run_id and uri:
            try:
                tracking.close_run(tracking._client(uri), run_id, "FAILED", "worker_lost", message,
                                   params)
            except Exception as e:  # the run's owner is dead: the next reconcile closes it
                log.warning("could not close run %s (%s)", run_id, tracking._first_line(e))
        tracking.write_status(job_dir, "FAILED", run_id=run_id, config_hash=doc.get("config_hash"),
                              uri=uri, reason="worker_lost", error=message)
        return JobReturn(overrides=overrides, status=JobStatus.FAILED, _return_value=RuntimeError(message))
