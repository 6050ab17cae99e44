"""A job directory's files (``status.json``, ``run.json``, the sweep's records), written
atomically, and the job counts a sweep reports from them."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .schema import NAMES_FILE, PARENT_FILE, RUN_FILE, STATUS_FILE, STORE_DOWN_FILE


def write_json(path: Path, doc: dict) -> None:
    """Write ``doc`` to ``path`` atomically (a reader never sees half a file)."""
    write_atomic(path, json.dumps(doc, indent=1, default=str).encode())


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it and a rename: a reader
    sees the old file or the new one, never half of one, and a failed write (a full disk)
    leaves no temporary file behind.

    Raises:
        OSError: the write failed (``path`` is then unchanged).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


#: job states whose ``run_id`` is the job's own run (SKIPPED names the run that held the config)
OWN_RUN_STATES = ("RUNNING", "FAILED", "KILLED")


def write_status(job_dir: Path, status: str, **extra: Any) -> None:
    """Record a job's state (RUNNING / FINISHED / SKIPPED / FAILED / KILLED) in its job dir."""
    write_json(job_dir / STATUS_FILE, {"status": status, "time": time.time(), **extra})


def mark_store_down(sweep_dir: Path | None, uri: str, reason: str) -> None:
    """Tell the sweep's other jobs that the store at ``uri`` did not answer (best effort)."""
    if sweep_dir is not None:
        with contextlib.suppress(OSError):
            write_json(Path(sweep_dir) / STORE_DOWN_FILE, {"uri": uri, "reason": reason,
                                                           "time": time.time()})


def store_known_down(sweep_dir: Path | None, uri: str) -> tuple[str, float] | None:
    """``(why, seconds ago)`` a job of this sweep found the store at ``uri`` unreachable, or
    ``None``."""
    doc = read_json(Path(sweep_dir) / STORE_DOWN_FILE) if sweep_dir is not None else None
    if not doc or doc.get("uri") != uri:
        return None
    return doc.get("reason") or "no answer", time.time() - float(doc.get("time") or 0)


def clear_store_down(sweep_dir: Path | None) -> None:
    if sweep_dir is not None:
        with contextlib.suppress(OSError):
            (Path(sweep_dir) / STORE_DOWN_FILE).unlink(missing_ok=True)


def read_parent(sweep_dir: Path) -> dict[str, str] | None:
    """The parent-run record a :class:`SweepRun` left in the sweep directory."""
    return read_json(sweep_dir / PARENT_FILE)


def planned_job_dirs(sweep_dir: str | os.PathLike | None, total: Any = None) -> list[Path]:
    """Every job directory of a sweep's plan — those of jobs that never started included, so
    counts add up after any kill: the sweeper's record (:data:`NAMES_FILE`, ``job_dirs``);
    for a sweep recorded before that, the directories with a job file, padded to ``total``
    (the parent's ``jobs_total`` tag) with directories that do not exist (``not_run``)."""
    if not sweep_dir:
        return []
    sweep = Path(sweep_dir)
    record = read_json(sweep / NAMES_FILE) or {}
    if record.get("job_dirs"):
        return [Path(d) for d in record["job_dirs"]]
    found = sorted({p.parent for name in (STATUS_FILE, RUN_FILE) for p in sweep.glob(f"*/{name}")})
    missing = max(0, int(total or 0) - len(found)) if str(total or "0").isdigit() else 0
    return found + [sweep / f".not-run-{i}" for i in range(missing)]


#: job outcomes a sweep counts (``held``: another live run held the config; it was not run here)
JOB_STATES = ("finished", "skipped", "failed", "killed", "not_run", "held")


def count_jobs(job_dirs: Iterable[Path], run_status: dict[str, str] | None = None) -> Counter:
    """Outcome counts of a sweep's jobs from their ``status.json``; the store's word wins for a
    run in ``run_status`` (closed by reconciling); a job still marked RUNNING whose run was not
    closed counts as killed, a job with no status file as ``not_run``."""
    counts = Counter({k: 0 for k in JOB_STATES})
    for d in job_dirs:
        doc = read_json(Path(d) / STATUS_FILE)
        status = doc.get("status") if doc else None
        if doc and doc.get("run_id") in (run_status or {}):
            status = run_status[doc["run_id"]]
        elif status == "RUNNING":
            status = "KILLED"
        elif status == "SKIPPED" and doc.get("reason") == "held":
            status = "HELD"
        key = {"HELD": "held", "FINISHED": "finished", "SKIPPED": "skipped", "FAILED": "failed",
               "KILLED": "killed"}.get(status or "", "not_run" if doc is None else "failed")
        counts[key] += 1
    return counts


def _log_counts(client, run_id: str, counts: Counter, seconds: float | None = None) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = [Metric(f"jobs_{k}", counts[k], now, 0) for k in JOB_STATES]
    metrics.append(Metric("jobs_total", sum(counts[k] for k in JOB_STATES), now, 0))
    if seconds is not None:
        metrics.append(Metric("sweep_seconds", seconds, now, 0))
    client.log_batch(run_id, metrics=metrics)


def summary(counts: Counter) -> str:
    held = f", {counts['held']} held by another live run" if counts["held"] else ""
    return (f"{counts['finished']} finished, {counts['skipped']} skipped (already FINISHED), "
            f"{counts['failed']} failed, {counts['killed']} killed, {counts['not_run']} not run"
            f"{held}")
