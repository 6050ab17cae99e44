"""Who owns a config in the store: finished configs, owner tags and the evidence that an owner
is gone (:func:`owner_gone`), closing stale runs (:func:`reconcile`), superseding an earlier
attempt, and the claim protocol (:func:`claim`, :func:`stand_down`)."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .jobdir import _log_counts, count_jobs, planned_job_dirs, read_json
from .provenance import slurm_job_id
from .schema import (
    MAX_PARAMS,
    ROLE_MEMBER,
    RUN_FILE,
    SLURM_KILLED,
    SLURM_LIVE,
    STATUS_FILE,
    TAG_ATTEMPT,
    TAG_CLAIM,
    TAG_HEARTBEAT,
    TAG_HOST,
    TAG_PID,
    TAG_PID_START,
    TAG_REASON,
    TAG_ROLE,
    TAG_SLURM,
    TAG_STOOD_DOWN,
    TAG_SUPERSEDED,
    _chunks,
    _param_value,
)
from .store import _client, _first_line, is_outage

log = logging.getLogger(__name__)


def find_finished(uri: str, experiment_id: str, config_hash: str) -> str | None:
    """Id of a FINISHED run with tag ``config_hash`` in the experiment, or ``None``."""
    runs = _client(uri).search_runs(
        [experiment_id],
        filter_string=f"tags.config_hash = '{config_hash}' and attributes.status = 'FINISHED'",
        max_results=1,
    )
    return runs[0].info.run_id if runs else None


def finished_configs(uri: str, experiment_id: str) -> dict[str, str]:
    """``{config_hash: run_id}`` of every FINISHED job run in the experiment (one paged search;
    a sweep asks once instead of once per job)."""
    client, out, token = _client(uri), {}, None
    while True:
        page = client.search_runs([experiment_id], filter_string="attributes.status = 'FINISHED'",
                                  max_results=1000, page_token=token)
        for r in page:
            h = r.data.tags.get("config_hash")
            if h and r.data.tags.get(TAG_ROLE) != "sweep":
                out.setdefault(h, r.info.run_id)
        token = page.token
        if not token:
            return out


def _pid_start(pid: int) -> str | None:
    """Start time of process ``pid`` (clock ticks since boot, /proc/PID/stat field 22), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def owner_tags() -> dict[str, str]:
    """Who owns a run created by this process: host, pid (+ start time), Slurm job, attempt,
    and a first heartbeat."""
    tags = {TAG_HOST: socket.gethostname(), TAG_PID: str(os.getpid()),
            TAG_PID_START: _pid_start(os.getpid()) or "", TAG_HEARTBEAT: str(int(time.time())),
            TAG_ATTEMPT: str(int(os.environ.get("SLURM_RESTART_COUNT", "0")) + 1)}
    job = slurm_job_id()
    if job:
        tags[TAG_SLURM] = job
    return tags


def slurm_states(job_ids: Iterable[str]) -> dict[str, str]:
    """``sacct``'s state of each job id (``CANCELLED by 0`` → ``CANCELLED``); ``{}`` where
    there is no ``sacct`` or it does not answer."""
    ids = sorted(set(job_ids))
    if not ids or shutil.which("sacct") is None:
        return {}
    try:
        p = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", ",".join(ids)],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return {}
    states = {}
    for line in p.stdout.splitlines():
        if "|" in line:
            job, state = line.split("|", 1)
            states[job.strip()] = state.split()[0] if state.split() else ""
    return states


def job_ended(tags: dict[str, str], run_id: str | None) -> tuple[str, str, str] | None:
    """``(status, reason, message)`` when the job directory of run ``run_id`` (tag ``job_dir``,
    where this machine sees it) says that job is over — FAILED, KILLED, or stood down — while
    the store could not be told (it refused, or went away): its owner will not close it."""
    if not run_id or not tags.get("job_dir"):
        return None
    doc = read_json(Path(tags["job_dir"]) / STATUS_FILE) or {}
    if doc.get("status") == "SKIPPED" and doc.get("stood_down") == run_id:
        return "KILLED", "stood_down", f"config held by {doc.get('held_by', '?')}; stood down"
    if doc.get("run_id") != run_id or doc.get("status") not in ("FAILED", "KILLED"):
        return None
    message = doc.get("error") or f"the job ended {doc['status']} (its status.json)"
    return doc["status"], doc.get("reason") or "exception", message


def owner_gone(tags: dict[str, str], start_ms: int, sacct: dict[str, str],
               stale_after_s: float, run_id: str | None = None) -> tuple[str, str, str] | None:
    """``(status, reason, message)`` for a RUNNING run whose owner can no longer close it,
    or ``None`` while it may be alive.  Evidence, strongest first: the job directory's own
    record that the job ended (:func:`job_ended`, given ``run_id``), Slurm's state of the job
    (``sacct``), the owner's pid on this host (with its start time), the heartbeat's age."""
    ended = job_ended(tags, run_id)
    if ended is not None:
        return ended
    job = tags.get(TAG_SLURM)
    if job and job in sacct:
        state = sacct[job]
        if state in SLURM_LIVE:
            return None
        status = "KILLED" if state in SLURM_KILLED else "FAILED"
        return status, state, f"Slurm job {job} ended {state} without closing the run"
    host, pid = tags.get(TAG_HOST), tags.get(TAG_PID)
    if host == socket.gethostname() and pid and pid.isdigit():
        started = _pid_start(int(pid))
        if started is not None and started == tags.get(TAG_PID_START, started):
            return None
        return "KILLED", "owner_gone", f"process {pid} on {host} ended without closing the run"
    beat = float(tags.get(TAG_HEARTBEAT) or start_ms / 1000)
    age = time.time() - beat
    if age > stale_after_s:
        return "FAILED", "heartbeat_lost", f"no heartbeat from {host}:{pid} for {age:.0f} s"
    return None


def close_run(client, run_id: str, status: str, reason: str, message: str = "",
              params: dict[str, Any] | None = None, members: bool = True) -> None:
    """End a run that will not finish: ``rankexp.end_reason``, ``error``, the ``params`` its
    owner had not sent yet (they ride on a job's first batch) and the status — and (with
    ``members``) its learning-rate member runs the same way (:func:`close_members`)."""
    from mlflow.entities import Param, RunTag

    tags = [RunTag(TAG_REASON, reason)] + ([RunTag("error", message[:5000])] if message else [])
    pending = [Param(k, _param_value(v)) for k, v in sorted((params or {}).items())]
    try:
        client.log_batch(run_id, tags=tags, params=pending[:MAX_PARAMS])
        for chunk in _chunks(pending[MAX_PARAMS:], MAX_PARAMS):
            client.log_batch(run_id, params=chunk)
    except Exception as e:  # a refused param (or one already there): the reason, then the status
        if is_outage(e) or not pending:
            raise
        client.log_batch(run_id, tags=tags)
    client.set_terminated(run_id, status)
    if members:
        close_members(client, run_id, status, reason, message)


def close_members(client, run_id: str, status: str, reason: str, message: str = "",
                  experiment_id: str | None = None, delete: bool = False) -> list[str]:
    """End the member runs (``rankexp.role=member``) of training run ``run_id`` that are not
    ``status`` yet as ``status`` with ``reason`` (:func:`close_run`), and with ``delete``
    soft-delete every one of them (a superseded training run's).  Two requests when it has
    none (the run's experiment, one search).  Returns the ids of the members it touched."""
    if experiment_id is None:
        experiment_id = client.get_run(run_id).info.experiment_id
    found = client.search_runs([experiment_id], max_results=10_000, filter_string=(
        f"tags.mlflow.parentRunId = '{run_id}' and tags.`{TAG_ROLE}` = '{ROLE_MEMBER}'"))
    touched = []
    for r in found:
        if r.info.status != status:
            close_run(client, r.info.run_id, status, reason, message, members=False)
        if delete:
            client.delete_run(r.info.run_id)
        if delete or r.info.status != status:
            touched.append(r.info.run_id)
    return touched


def _unsent_params(run) -> dict[str, Any]:
    """The params of a job run killed before its first batch, from its job directory's
    ``run.json`` (when this machine sees it and it is that run's); else none."""
    if run.data.params or run.data.tags.get(TAG_ROLE) == "sweep" or not run.data.tags.get("job_dir"):
        return {}
    record = read_json(Path(run.data.tags["job_dir"]) / RUN_FILE) or {}
    if record.get("config_hash") != run.data.tags.get("config_hash"):
        return {}
    return record.get("params") or {}


def reconcile(uri: str, experiment_id: str, stale_after_s: float,
              parent_id: str | None = None) -> dict[str, tuple[str, str]]:
    """Close the RUNNING runs of the experiment (or of one sweep: ``parent_id``) whose owner is
    gone (:func:`owner_gone`); a stale sweep parent also gets its job counts from its sweep
    directory.  Returns ``{run_id: (status, reason)}`` of the runs it closed."""
    client = _client(uri)
    filt = "attributes.status = 'RUNNING'"
    if parent_id:
        filt += f" and tags.mlflow.parentRunId = '{parent_id}'"
    runs = client.search_runs([experiment_id], filter_string=filt, max_results=10_000)
    members = [r for r in runs if r.data.tags.get(TAG_ROLE) == ROLE_MEMBER]
    runs = [r for r in runs if r.data.tags.get(TAG_ROLE) != ROLE_MEMBER]
    sacct = slurm_states(r.data.tags[TAG_SLURM] for r in runs if TAG_SLURM in r.data.tags)
    closed = {}
    for r in runs:
        verdict = owner_gone(r.data.tags, r.info.start_time, sacct, stale_after_s, r.info.run_id)
        if verdict is None:
            continue
        status, reason, message = verdict
        try:
            if r.data.tags.get(TAG_ROLE) == "sweep":
                _log_counts(client, r.info.run_id, count_jobs(
                    planned_job_dirs(r.data.tags.get("sweep_id"), r.data.tags.get("jobs_total"))))
            close_run(client, r.info.run_id, status, reason, message, _unsent_params(r))
        except Exception as e:
            if is_outage(e):
                raise
            log.error("could not close stale run %s as %s: the store refused (%s)",
                      r.info.run_id, status, _first_line(e))
            continue
        closed[r.info.run_id] = (status, reason)
        log.warning("closed stale run %s (%s) as %s: %s", r.info.run_id, r.info.run_name, status,
                    message)
    closed.update(_close_orphans(client, [m for m in members if m.data.tags.get(
        "mlflow.parentRunId") not in closed]))
    return closed


def _close_orphans(client, members: list) -> dict[str, tuple[str, str]]:
    """RUNNING member runs whose training run is over (or gone): ended with its status and
    reason (KILLED ``orphaned`` when it is missing), deleted with it when it was."""
    from mlflow.exceptions import MlflowException

    parents: dict[str, Any] = {}
    closed = {}
    for m in members:
        pid = m.data.tags.get("mlflow.parentRunId", "")
        if pid not in parents:
            try:
                parents[pid] = client.get_run(pid)
            except MlflowException:
                parents[pid] = None
        parent = parents[pid]
        if parent is not None and parent.info.status == "RUNNING":
            continue  # its training run's owner closes it (or a later reconcile, with it)
        status = parent.info.status if parent is not None else "KILLED"
        reason = (parent.data.tags.get(TAG_REASON) if parent is not None else None) or "orphaned"
        close_run(client, m.info.run_id, status, reason,
                  f"its training run {pid} ended {status}" if parent is not None
                  else f"its training run {pid} is gone", members=False)
        if parent is None or parent.info.lifecycle_stage == "deleted":
            client.delete_run(m.info.run_id)
        closed[m.info.run_id] = (status, reason)
        log.warning("closed member run %s (%s) as %s: its training run %s is over",
                    m.info.run_id, m.info.run_name, status, pid)
    return closed


def correct_timeouts(uri: str, experiment_id: str, parent_id: str) -> dict[str, tuple[str, str]]:
    """A Slurm job stopped at its time limit gets SIGTERM like a cancelled one; its run, closed
    KILLED by the signal, is FAILED with reason ``TIMEOUT`` once ``sacct`` says so."""
    client = _client(uri)
    runs = [r for r in client.search_runs(
        [experiment_id], max_results=10_000,
        filter_string=f"tags.mlflow.parentRunId = '{parent_id}' and attributes.status = 'KILLED'")
        if TAG_SLURM in r.data.tags and r.data.tags.get(TAG_REASON, "").startswith("SIG")]
    sacct = slurm_states(r.data.tags[TAG_SLURM] for r in runs)
    fixed = {}
    for r in runs:
        job = r.data.tags[TAG_SLURM]
        if sacct.get(job) == "TIMEOUT":
            close_run(client, r.info.run_id, "FAILED", "TIMEOUT",
                      f"Slurm job {job} reached its time limit (sacct: TIMEOUT)")
            fixed[r.info.run_id] = ("FAILED", "TIMEOUT")
    return fixed


def supersede(uri: str, old_run_id: str, new_run_id: str) -> bool:
    """The run ``new_run_id`` is a later attempt of the same job as ``old_run_id``: close the old
    one (KILLED, if still RUNNING), tag it ``rankexp.superseded_by`` and delete it — and its
    learning-rate member runs (:func:`close_members`) — so the job has one live run.  A
    FINISHED run is never superseded.  Returns whether it was."""
    from mlflow.entities import RunTag
    from mlflow.exceptions import MlflowException

    client = _client(uri)
    try:
        old = client.get_run(old_run_id)
    except MlflowException:
        return False
    if old.info.status == "FINISHED" or old.info.lifecycle_stage == "deleted":
        return False
    client.log_batch(old_run_id, tags=[RunTag(TAG_SUPERSEDED, new_run_id)])
    if old.info.status == "RUNNING":
        close_run(client, old_run_id, "KILLED", "superseded", f"superseded by run {new_run_id}",
                  members=False)
    # its learning-rate members go with it (the new run has members of its own)
    close_members(client, old_run_id, "KILLED", "superseded", f"superseded by run {new_run_id}",
                  experiment_id=old.info.experiment_id, delete=True)
    client.delete_run(old_run_id)
    log.info("run %s supersedes the earlier attempt %s (closed, tagged, deleted)", new_run_id,
             old_run_id)
    return True


@dataclass
class Claim:
    """The outcome of :func:`claim`: ``won``, or the run that holds the config instead —
    ``holder`` (its id), ``status`` (``FINISHED``, or ``RUNNING`` with a live owner) and
    ``where`` (its name, sweep and owner, for the message)."""

    won: bool
    holder: str | None = None
    status: str | None = None
    where: str = ""


def claim_tags() -> dict[str, str]:
    """The tag a job run carries from its creation: when it claimed its config (Unix ms,
    this host's clock), the order :func:`claim` decides by."""
    return {TAG_CLAIM: str(time.time_ns() // 1_000_000)}


def _claim_order(r) -> tuple[int, str]:
    tag = r.data.tags.get(TAG_CLAIM, "")
    return (int(tag) if tag.isdigit() else int(r.info.start_time or 0)), r.info.run_id


#: how long a claimant waits for a rival run that exists but has not stamped its claim yet
#: (its process is between creating its run and :func:`claim`'s first write: milliseconds,
#: seconds under load); after it, such a rival is ordered by its start time
CLAIM_PENDING_S = 30.0


def claim(uri: str, experiment_id: str, config_hash: str, run_id: str, stale_after_s: float,
          finished_counts: bool = True, ignore: Iterable[str] = ()) -> Claim:
    """Claim ``config_hash`` for the just-created run ``run_id``, through the store itself.

    The protocol (it works on SQLite, on a database and through a tracking server, for every
    process that can reach the store): each job first creates its run, tagged with its config
    hash, then *stamps* its claim (:data:`TAG_CLAIM`, :func:`claim_tags`: the time now, taken
    after its run is visible to everyone) and looks up the experiment's live runs of that hash.
    A FINISHED one (when ``finished_counts``: not under ``tracking.force``) holds the config.
    Otherwise, of the RUNNING runs whose owner is alive (:func:`owner_gone` — a run whose owner
    is gone is closed here and its claim taken over), the earliest stamp wins, ties broken by
    run id; a rival that exists but has not stamped yet is waited for (up to
    :data:`CLAIM_PENDING_S`).  So exactly one computes: a rival this claimant did not see
    created its run after this claimant's stamp, and so stamps later; a rival it saw it waits
    for.  (A stamp taken when the run is created instead — before it is visible — let a slow
    writer's early stamp arrive after another writer had already won: both computed.)  The
    others stand down (:func:`stand_down`) before computing.  Assumes the writers' clocks agree
    to better than the time between two claims (NTP does).  A run that carries a stamp already
    keeps it (a second call orders by the same stamp).

    ``ignore``: runs that are not rivals (the earlier attempt of this very job, which it
    supersedes).

    Returns:
        :class:`Claim`: ``won=True``, or the holder.
    """
    client = _client(uri)
    stamp = client.get_run(run_id).data.tags.get(TAG_CLAIM)
    if stamp is None:
        stamp = claim_tags()[TAG_CLAIM]
        client.set_tag(run_id, TAG_CLAIM, stamp)
    mine = (int(stamp) if stamp.isdigit() else 0, run_id)
    skip = {run_id, *ignore}
    deadline = time.monotonic() + CLAIM_PENDING_S
    while True:
        runs = client.search_runs([experiment_id], filter_string=f"tags.config_hash = '{config_hash}'",
                                  max_results=1000)
        others = [r for r in runs if r.info.run_id not in skip and r.data.tags.get(TAG_ROLE) != "sweep"]
        if finished_counts:
            done = [r for r in others if r.info.status == "FINISHED"]
            if done:
                return Claim(False, done[0].info.run_id, "FINISHED", _describe(done[0]))
        live = _live_rivals(client, [r for r in others if r.info.status == "RUNNING"], stale_after_s)
        if any(TAG_CLAIM not in r.data.tags for r in live) and time.monotonic() < deadline:
            time.sleep(0.1)  # a rival between creating its run and stamping it
            continue
        first = min(live, key=_claim_order, default=None)
        if first is None or mine <= _claim_order(first):
            return Claim(True)
        return Claim(False, first.info.run_id, "RUNNING", _describe(first))


def _live_rivals(client, running: list, stale_after_s: float) -> list:
    """The RUNNING rivals whose owner is alive; the others are closed (their claims taken)."""
    sacct = slurm_states(r.data.tags[TAG_SLURM] for r in running if TAG_SLURM in r.data.tags)
    live = []
    for r in running:
        verdict = owner_gone(r.data.tags, r.info.start_time, sacct, stale_after_s, r.info.run_id)
        if verdict is None:
            live.append(r)
            continue
        status, reason, message = verdict
        close_run(client, r.info.run_id, status, reason, message, _unsent_params(r))
        log.warning("took over the claim of run %s (%s), closed %s: %s", r.info.run_id,
                    r.info.run_name, status, message)
    return live


def _describe(r) -> str:
    t = r.data.tags
    owner = f"{t.get(TAG_HOST, '?')}:{t.get(TAG_PID, '?')}"
    if t.get(TAG_SLURM):
        owner += f", Slurm job {t[TAG_SLURM]}"
    sweep = t.get("sweep_id") or "no sweep"
    return f"run {r.info.run_id} ({r.info.run_name}) of {sweep}, owner {owner}"


def stand_down(uri: str, run_id: str, held: Claim) -> None:
    """Close the run of a claimant that lost (:func:`claim`): KILLED, ``rankexp.end_reason=
    stood_down``, tagged ``rankexp.stood_down_for=<holder>`` and soft-deleted — it never
    computed, so it is hidden like a superseded run, and the config keeps one live run."""
    from mlflow.entities import RunTag

    client = _client(uri)
    message = f"config held by {held.where} ({held.status}); this claimant stood down"
    client.log_batch(run_id, tags=[RunTag(TAG_STOOD_DOWN, held.holder or ""),
                                   RunTag(TAG_REASON, "stood_down"), RunTag("error", message)])
    client.set_terminated(run_id, "KILLED")
    client.delete_run(run_id)


class Heartbeat:
    """Refresh the tag ``rankexp.heartbeat`` of a run every ``every_s`` seconds from a daemon
    thread; failures (an outage) are skipped silently — the owner's other evidence remains."""

    def __init__(self, uri: str, run_id: str, every_s: float):
        self.uri, self.run_id, self.every_s = uri, run_id, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="rankexp-heartbeat")

    def _beat(self) -> None:
        client = _client(self.uri)
        while not self._stop.wait(self.every_s):
            with contextlib.suppress(Exception):
                client.set_tag(self.run_id, TAG_HEARTBEAT, str(int(time.time())))

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
