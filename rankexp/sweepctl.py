"""Detached Slurm sweeps: the plan, the jobs' own accounting, ``rankexp status`` and ``cancel``.

``hydra.launcher.detach=true`` (``hydra/launcher=slurm``): the sweeper checks the whole sweep
and opens its parent run as usual, the launcher submits the array and writes the plan
(:data:`PLAN_FILE` in the sweep directory: the Slurm array and task ids, which jobs each task
runs, the store and the parent run), and the command returns.  From then on the sweep has no
foreground process:

* each array task keeps the parent run's heartbeat fresh while it runs
  (:func:`parent_heartbeat`), and after each of its jobs counts the sweep into the parent run
  (``jobs_finished``, ``jobs_failed``, …, ``jobs_running``) under an exclusive lock on
  :data:`LOCK_FILE` in the shared sweep directory (POSIX ``lockf``, which NFS supports);
  the job that finds every job of the plan ended closes the parent with the true status
  (:class:`rankexp.tracking.SweepRun`'s close: stale children reconciled first, FINISHED only
  if every job finished or was skipped) — several jobs ending at once take turns on the lock,
  so the counts are never lost or double-counted and a re-close after a requeue is the truth;
* ``rankexp status DIR|SWEEP_ID`` prints each job's state from the store, its ``status.json``
  and ``sacct``, done/total and an ETA; when ``sacct`` says no task of the array is alive but
  the parent is still RUNNING (a task killed before it could count: OOM, SIGKILL, a node
  lost), it closes the parent with the true counts;
* ``rankexp cancel DIR|SWEEP_ID`` cancels the array (``scancel``), waits for Slurm to end its
  tasks, closes every run left RUNNING (KILLED, from ``sacct``) and the parent KILLED.

``SWEEP_ID`` is the sweep directory (the ``sweep_id`` tag of every run of the sweep), the parent
run's id, or the Slurm array id.  The parent run of a detached sweep has no owning process: its
liveness is its heartbeat (``tracking.stale_after_s``); an array left pending longer than that
may be closed by another sweep's stale-run check, and the last job then closes it again with
the truth.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import tracking

log = logging.getLogger(__name__)

PLAN_FILE = "detached.json"  #: the plan of a detached sweep, in its sweep directory
LOCK_FILE = ".detached.lock"  #: the lock the jobs, ``status`` and ``cancel`` take turns on
CANCEL_FILE = "cancelled.json"  #: written by ``rankexp cancel`` before ``scancel``
CLOSED_FILE = "closed.json"  #: the status and counts the parent was last closed with
TAG_DETACHED = "rankexp.slurm_arrays"  #: on the parent run: the sweep's Slurm array ids
ENDED = ("FINISHED", "SKIPPED", "FAILED", "KILLED")  #: a job's ``status.json`` once it is over
CANCEL_WAIT_S = 60.0  # how long `cancel` waits for Slurm to end the tasks it cancelled


# --------------------------------------------------------------------------- the plan
def write_plan(sweep_dir: Path, tasks: list, packs: list, params: dict[str, Any]) -> dict:
    """Record the submitted array tasks (``tasks``: submitit jobs, one per pack) in
    :data:`PLAN_FILE`, adding to the plan of an earlier batch of the same sweep; returns it."""
    plan = tracking.read_json(sweep_dir / PLAN_FILE) or {
        "sweep_dir": str(sweep_dir), "submitted": time.time(), "arrays": [], "tasks": {},
        "jobs_per_task": None, "array_parallelism": params.get("array_parallelism")}
    for job, pack in zip(tasks, packs, strict=True):
        plan["tasks"][str(job.job_id)] = pack.numbers
        array = str(job.job_id).split("_")[0]
        if array not in plan["arrays"]:
            plan["arrays"].append(array)
    plan["jobs_per_task"] = max(len(p.jobs) for p in packs)
    plan["heartbeat_s"], plan["stale_after_s"] = params.get("heartbeat_s"), params.get("stale_after_s")
    plan["parent"] = tracking.read_parent(sweep_dir)
    plan["jobs_total"] = len(tracking.planned_job_dirs(sweep_dir))
    tracking.write_json(sweep_dir / PLAN_FILE, plan)
    return plan


def read_plan(sweep_dir: Path) -> dict | None:
    return tracking.read_json(Path(sweep_dir) / PLAN_FILE)


def detach(parent: tracking.SweepRun | None, plan: dict, heartbeat_s: float, stale_after_s: float) -> str:
    """The sweeper's end of a detached sweep: the parent run is handed to the jobs (its owner
    tags now name the array, its heartbeat theirs) and the user is told how to follow it."""
    sweep_dir = Path(plan["sweep_dir"])
    if plan.get("heartbeat_s") is None:  # a launcher that did not know the tracking settings
        plan.update(heartbeat_s=heartbeat_s, stale_after_s=stale_after_s)
        with _locked(sweep_dir):
            tracking.write_json(sweep_dir / PLAN_FILE, {**(read_plan(sweep_dir) or plan), **{
                k: plan[k] for k in ("heartbeat_s", "stale_after_s")}})
    arrays = ",".join(plan["arrays"])
    if parent is not None:
        if parent._heartbeat is not None:
            parent._heartbeat.__exit__()
        tracking.log_now(parent.client, parent.run_id, tags={
            tracking.TAG_PID: "detached", tracking.TAG_SLURM: plan["arrays"][0],
            TAG_DETACHED: arrays, tracking.TAG_HEARTBEAT: str(int(time.time()))})
    total, ntasks = plan["jobs_total"], len(plan["tasks"])
    print(f"detached: {total} jobs in {ntasks} Slurm array task{'s' * (ntasks != 1)} (array "
          f"{arrays}); plan in {sweep_dir / PLAN_FILE}\n"
          f"  follow: rankexp status {sweep_dir}\n  stop:   rankexp cancel {sweep_dir}", flush=True)
    return "DETACHED"


@contextlib.contextmanager
def _locked(sweep_dir: Path) -> Iterator[None]:
    """An exclusive POSIX lock on the sweep directory's :data:`LOCK_FILE` while inside."""
    with open(Path(sweep_dir) / LOCK_FILE, "a+") as fh:
        fcntl.lockf(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.lockf(fh, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- in the jobs
@contextlib.contextmanager
def parent_heartbeat(sweep_dir: Path) -> Iterator[None]:
    """While an array task runs: the detached parent run's heartbeat, refreshed now and every
    ``tracking.heartbeat_s`` (the parent has no process of its own)."""
    plan, parent = read_plan(sweep_dir) or {}, tracking.read_parent(sweep_dir)
    if not parent:
        yield
        return
    with contextlib.suppress(Exception):
        tracking._client(parent["uri"]).set_tag(parent["run_id"], tracking.TAG_HEARTBEAT,
                                                str(int(time.time())))
    with tracking.Heartbeat(parent["uri"], parent["run_id"], float(plan.get("heartbeat_s") or 30)):
        yield


def job_ended(sweep_dir: Path) -> None:
    """After each job of a detached sweep: count the sweep into its parent run, and close the
    parent if every job of the plan has ended (see the module docstring).  Never raises: a
    store that does not answer leaves the closing to the next job or ``rankexp status``."""
    try:
        with _locked(sweep_dir):
            if not (Path(sweep_dir) / CANCEL_FILE).exists():
                _count_or_close(Path(sweep_dir))
    except Exception as e:
        log.error("could not count the sweep %s into its parent run (%s); `rankexp status %s` "
                  "does it later", sweep_dir, tracking._first_line(e), sweep_dir)


def _job_states(sweep_dir: Path) -> list[dict]:
    return [tracking.read_json(d / tracking.STATUS_FILE) or {}
            for d in tracking.planned_job_dirs(sweep_dir)]


def _count_or_close(sweep_dir: Path, *, force: bool = False) -> str | None:
    """Under the lock: the parent's running counts, or its close once every job ended (or
    ``force``: no task of the array is alive); returns the status it was closed with."""
    parent, plan = tracking.read_parent(sweep_dir), read_plan(sweep_dir) or {}
    if not parent:
        return None
    states = _job_states(sweep_dir)
    if force or all(s.get("status") in ENDED for s in states):
        return _close_parent(sweep_dir, parent, plan)
    dirs = tracking.planned_job_dirs(sweep_dir)
    counts = tracking.count_jobs([d for d, s in zip(dirs, states, strict=True) if s.get("status") in ENDED])
    running = sum(s.get("status") == "RUNNING" for s in states)
    counts["not_run"] += len(states) - sum(counts.values()) - running  # not started yet
    _log_progress(tracking._client(parent["uri"]), parent["run_id"], counts, running)
    return None


def _log_progress(client, run_id: str, counts: Counter, running: int) -> None:
    """The parent's counts while the sweep runs: ``jobs_<outcome>`` of the ended jobs,
    ``jobs_running``, ``jobs_not_run`` (not started yet) and ``jobs_total``."""
    metrics = {f"jobs_{k}": counts[k] for k in tracking.JOB_STATES}
    metrics.update(jobs_running=running, jobs_total=sum(counts.values()) + running)
    tracking.log_now(client, run_id, metrics=metrics)


def _close_parent(sweep_dir: Path, parent: dict, plan: dict, interrupted: str | None = None,
                  grace_s: float = 0.0) -> str:
    """Close the parent run with the true counts (:meth:`tracking.SweepRun.close`), once per
    outcome: a second closer that finds the same counts does nothing."""
    run = tracking.SweepRun(parent["uri"], parent["experiment"], sweep_dir,
                            tracking.planned_job_dirs(sweep_dir), "", float(plan.get("heartbeat_s") or 30),
                            float(plan.get("stale_after_s") or 600))
    run.experiment_id, run.run_id = parent["experiment_id"], parent["run_id"]
    run.t0 = float(plan.get("submitted") or run.t0)
    before = tracking.read_json(sweep_dir / CLOSED_FILE) or {}
    counts = tracking.count_jobs(run.job_dirs)
    if not interrupted and before.get("counts") == dict(counts) and before.get("status"):
        return before["status"]
    status, counts = run.close(interrupted, grace_s)
    tracking.write_json(sweep_dir / CLOSED_FILE, {"status": status, "counts": dict(counts),
                                                  "time": time.time()})
    log.info("sweep %s closed %s: %s", sweep_dir, status, tracking.summary(counts))
    return status


# --------------------------------------------------------------------------- status, cancel
class SweepNotFound(ValueError):
    """``DIR|SWEEP_ID`` names no sweep this machine can see."""


def resolve(target: str) -> Path:
    """The sweep directory named by ``target``: a directory, or the parent run's id or the Slurm
    array id of a sweep in the store (``$MLFLOW_TRACKING_URI``, else ``./mlflow.db``).

    Raises:
        SweepNotFound: nothing matches (the message says what was tried).
    """
    path = Path(target).expanduser()
    if path.is_dir():
        if not (path / tracking.NAMES_FILE).exists():
            raise SweepNotFound(f"{path} is no sweep directory (it has no {tracking.NAMES_FILE})")
        return path.resolve()
    uri = tracking.resolve_uri(None)
    sqlite = tracking._sqlite_path(uri)
    if sqlite is not None and not sqlite.exists():
        raise SweepNotFound(f"{target!r} is no directory, and there is no store {uri} to look it up in")
    client = tracking._client(uri)
    with contextlib.suppress(Exception):
        return Path(client.get_run(target).data.tags["sweep_id"])
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, max_results=2, filter_string=(
        f"tags.`{tracking.TAG_ROLE}` = 'sweep' and tags.`{TAG_DETACHED}` LIKE '%{target}%'")
        ) if experiments and target.isdigit() else []
    if not runs:
        raise SweepNotFound(f"{target!r} is no sweep directory, sweep run id or Slurm array id "
                            f"of a detached sweep in {tracking.redact(uri)}")
    return Path(runs[0].data.tags["sweep_id"])


def _store_runs(parent: dict | None) -> dict[str, Any]:
    """``{run_id: run}`` of the parent's children and the parent itself ({} without a store)."""
    if not parent:
        return {}
    client = tracking._client(parent["uri"])
    runs = client.search_runs([parent["experiment_id"]], max_results=50_000,
                              filter_string=f"tags.mlflow.parentRunId = '{parent['run_id']}'")
    out = {r.info.run_id: r for r in runs}
    with contextlib.suppress(Exception):
        out[parent["run_id"]] = client.get_run(parent["run_id"])
    return out


def _rows(sweep_dir: Path, plan: dict, sacct: dict[str, str], runs: dict[str, Any]) -> list[dict]:
    """One row per job of the plan: its Slurm task and state, status.json, store status, times."""
    task_of = {int(j): t for t, jobs in plan.get("tasks", {}).items() for j in jobs}
    names = (tracking.read_json(sweep_dir / tracking.NAMES_FILE) or {}).get("names") or []
    rows = []
    for i, d in enumerate(tracking.planned_job_dirs(sweep_dir)):
        doc = tracking.read_json(d / tracking.STATUS_FILE) or {}
        task = task_of.get(i, "")
        array = task.split("_")[0]
        state = sacct.get(task) or next((v for k, v in sacct.items() if k.startswith(f"{array}_[")), "")
        run = runs.get(doc.get("run_id") or "")
        start = run.info.start_time / 1000 if run else None
        end = run.info.end_time / 1000 if run and run.info.end_time else None
        rows.append({"job": i, "task": task, "slurm": state or ("" if not task else "?"),
                     "status": doc.get("status") or "", "run": doc.get("run_id") or "",
                     "store": run.info.status if run else "", "start": start, "end": end,
                     "name": names[i] if i < len(names) else d.name})
    return rows


def eta_seconds(rows: list[dict], now: float) -> float | None:
    """Seconds until every job has ended at the rate jobs have ended so far (jobs ended per
    second since the first one started), or None before the first ends; 0 once all did."""
    done = [r for r in rows if r["status"] in ENDED]
    left = len(rows) - len(done)
    if not left:
        return 0.0
    starts = [r["start"] for r in rows if r["start"]]
    if not done or not starts:
        return None
    return left * (now - min(starts)) / len(done)


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "ETA — (no job has ended yet)"
    m, s = divmod(int(round(seconds)), 60)
    return f"ETA {m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"ETA {m}:{s:02d}"


def status(target: str, out=sys.stdout) -> int:
    """``rankexp status DIR|SWEEP_ID``: print the table and the summary; returns 0."""
    sweep_dir = resolve(target)
    plan, parent = read_plan(sweep_dir) or {}, tracking.read_parent(sweep_dir)
    tasks = list(plan.get("tasks", {}))
    sacct = tracking.slurm_states([*tasks, *plan.get("arrays", [])])
    runs = _store_runs(parent)
    alive = [t for t in tasks if sacct.get(t) in tracking.SLURM_LIVE] + [
        k for k, v in sacct.items() if "[" in k and v in tracking.SLURM_LIVE]
    top = runs.get(parent["run_id"]) if parent else None
    if plan and top is not None and top.info.status == "RUNNING" and sacct and not alive:
        with _locked(sweep_dir):  # every task is over, yet nobody closed the parent
            closed = _count_or_close(sweep_dir, force=True)
        print(f"no task of array {','.join(plan['arrays'])} is alive (sacct): closed the sweep "
              f"run {parent['run_id']} {closed}", file=out)
        runs = _store_runs(parent)
        top = runs.get(parent["run_id"])
    rows = _rows(sweep_dir, plan, sacct, runs)
    print(f"{'job':>4}  {'slurm task':<12} {'sacct':<10} {'status.json':<11} {'store':<9} "
          f"{'seconds':>8}  {'run':<32}  name", file=out)
    now = time.time()
    for r in rows:
        secs = f"{(r['end'] or now) - r['start']:.1f}" if r["start"] else ""
        print(f"{r['job']:>4}  {r['task']:<12} {r['slurm']:<10} {r['status']:<11} {r['store']:<9} "
              f"{secs:>8}  {r['run']:<32}  {r['name']}", file=out)
    counts = Counter(r["status"] or "not started" for r in rows)
    done = sum(counts[s] for s in ENDED)
    parts = ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items()))
    where = f"sweep run {parent['run_id']} {top.info.status if top else '?'}" if parent else "no store"
    print(f"{sweep_dir}: {done}/{len(rows)} done ({parts}); {where}; {_eta(eta_seconds(rows, now))}",
          file=out)
    return 0


def cancel(target: str, out=sys.stdout) -> int:
    """``rankexp cancel DIR|SWEEP_ID``: ``scancel`` the sweep's arrays, wait for Slurm to end
    them, close what is left RUNNING (KILLED) and the parent KILLED; returns 0, or 1 if
    ``scancel`` failed."""
    sweep_dir = resolve(target)
    plan = read_plan(sweep_dir)
    if not plan:
        raise SweepNotFound(f"{sweep_dir} is no detached sweep (no {PLAN_FILE}); a foreground "
                            "sweep stops with Ctrl-C or SIGTERM to its process")
    with _locked(sweep_dir):
        tracking.write_json(sweep_dir / CANCEL_FILE, {"time": time.time()})
    p = subprocess.run(["scancel", *plan["arrays"]], capture_output=True, text=True, timeout=60)
    if p.returncode:
        print(f"error: scancel {' '.join(plan['arrays'])}: {p.stderr.strip()}", file=sys.stderr)
        return 1
    tasks, end = list(plan["tasks"]), time.monotonic() + CANCEL_WAIT_S
    while time.monotonic() < end:
        sacct = tracking.slurm_states([*tasks, *plan["arrays"]])
        if sacct and not any(v in tracking.SLURM_LIVE for v in sacct.values()):
            break
        time.sleep(1)
    parent = tracking.read_parent(sweep_dir)
    if parent:
        with _locked(sweep_dir):
            closed = _close_parent(sweep_dir, parent, plan, interrupted="scancel", grace_s=30)
        print(f"cancelled array {','.join(plan['arrays'])}; sweep run {parent['run_id']} {closed}: "
              f"{tracking.summary(tracking.count_jobs(tracking.planned_job_dirs(sweep_dir)))}", file=out)
    else:
        print(f"cancelled array {','.join(plan['arrays'])}", file=out)
    return 0


def main(argv: list[str]) -> int:
    """``rankexp status DIR|SWEEP_ID`` / ``rankexp cancel DIR|SWEEP_ID``."""
    ap = argparse.ArgumentParser(prog=f"rankexp {argv[0] if argv else ''}".strip(), description=(
        "Follow or stop a detached Slurm sweep (hydra.launcher.detach=true): its directory "
        "(multirun/DATE/TIME), its sweep run's id or its Slurm array id."))
    ap.add_argument("command", choices=("status", "cancel"))
    ap.add_argument("sweep", metavar="DIR|SWEEP_ID")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    tracking.quiet_store_logs()
    try:
        return (status if args.command == "status" else cancel)(args.sweep)
    except (SweepNotFound, tracking.TrackingError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
