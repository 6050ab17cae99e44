"""The files rankexp writes (atomically) in a job's directory and its sweep's, and the job
counts a sweep reports from them; the one masking of secrets (:func:`redact`) for every file,
run and message.  No MLflow here."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["redact", "PARENT_FILE", "NAMES_FILE", "STATUS_FILE", "RUN_FILE", "JOURNAL_FILE",
           "RESULT_DIR", "JOB_STATES", "write_atomic", "write_json", "read_json", "write_status",
           "planned_job_dirs", "count_jobs", "summary"]

# files of a sweep directory (written by the sweeper) and of a job directory (by the job)
PARENT_FILE = "mlflow_parent.json"  # {"uri", "experiment", "experiment_id", "run_id", "sweep_id"}
NAMES_FILE = "run_names.json"  # {"started", "names": [job i's run name], "job_dirs": [...]}
STATUS_FILE, RUN_FILE, JOURNAL_FILE, RESULT_DIR = "status.json", "run.json", "metrics.jsonl", "result"


def redact(text: str) -> str:
    """``text`` with every URI password masked: ``postgresql://user:***@host/db``."""
    return re.sub(r"(\w[\w+.-]*://[^/:@\s]*):[^/@\s]*@", r"\1:***@", str(text))


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename (a failed write, raising
    OSError, leaves nothing behind)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_json(path: Path, doc: dict) -> None:
    """``doc`` as JSON, passwords masked (:func:`redact`)."""
    write_atomic(Path(path), redact(json.dumps(doc, indent=1, default=str)).encode())


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def write_status(job_dir: Path, status: str, **extra: Any) -> None:
    """A job's state (RUNNING, FINISHED, SKIPPED, FAILED, KILLED) in ``status.json``."""
    write_json(Path(job_dir) / STATUS_FILE, {"status": status, "time": time.time(), **extra})


def planned_job_dirs(sweep_dir: str | os.PathLike | None) -> list[Path]:
    """Every job directory of a sweep's plan (:data:`NAMES_FILE`), started or not."""
    record = read_json(Path(sweep_dir) / NAMES_FILE) if sweep_dir else None
    return [Path(d) for d in (record or {}).get("job_dirs", [])]


#: job outcomes a sweep counts (``held``: another live run held the config, it was not run here)
JOB_STATES = ("finished", "skipped", "failed", "killed", "not_run", "held")


def count_jobs(job_dirs: Iterable[Path], run_status: dict[str, str] | None = None) -> Counter:
    """Outcome counts from the jobs' ``status.json``; the store's word wins for a run in
    ``run_status``; a job still RUNNING counts as killed, one with no file as ``not_run``."""
    counts = Counter({k: 0 for k in JOB_STATES})
    for d in job_dirs:
        doc = read_json(Path(d) / STATUS_FILE)
        status = (doc or {}).get("status")
        if doc and doc.get("run_id") in (run_status or {}):
            status = run_status[doc["run_id"]]
        elif status == "RUNNING":
            status = "KILLED"
        elif status == "SKIPPED" and doc.get("reason") == "held":
            status = "HELD"
        key = "not_run" if doc is None else (status or "").lower()
        counts[key if key in JOB_STATES else "failed"] += 1
    return counts


def summary(counts: Counter) -> str:
    held = f", {counts['held']} held by another live run" if counts["held"] else ""
    return (f"{counts['finished']} finished, {counts['skipped']} skipped (already FINISHED), "
            f"{counts['failed']} failed, {counts['killed']} killed, {counts['not_run']} not run{held}")
