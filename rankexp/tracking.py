"""The only module that talks to MLflow (design.md §5).

Schema of one run (one Hydra job):

* experiment: ``tracking.experiment`` (an experiment config sets it; default ``rankexp``);
* run name: short and readable, e.g. ``post·α1·β1·L48·d256``;
* params: the resolved config flattened with dots, plus ``nominal_ratio`` (βα^M)
  and ``depth_factor`` (βα^M√L);
* run name: the axes the sweep varies (:mod:`rankexp.naming`: ``post·α2·L96``); a single
  run ``post·α1·β1·L48·d256``; the sweep's parent ``<experiment>·<size>·<start time>``;
* tags: MLflow's system tags (``mlflow.source.name``/``.type``, ``mlflow.user``,
  ``mlflow.source.git.commit``: the UI's Source, Created by and commit) and
  ``rankexp.git_dirty``; ``config_hash`` (resume key), ``git_commit`` (``+dirty`` when the
  tree was), ``overrides``, ``sweep_id``, ``device``, ``task``, ``job_dir``, ``seed_std.<m>``
  (the seed spread of scalar ``m``); ``mlflow.parentRunId`` groups a multirun under one parent,
  whose ``mlflow.note.content`` (its description) is the command line;
* owner tags, so that a run whose process is gone can be found and closed:
  ``rankexp.host``, ``rankexp.pid``, ``rankexp.pid_start`` (the process's start time, so a
  recycled pid is not mistaken for the owner), ``rankexp.slurm_job_id`` (``A_T`` for array
  tasks), ``rankexp.attempt`` (Slurm restarts + 1) and ``rankexp.heartbeat`` (Unix seconds,
  refreshed every ``tracking.heartbeat_s``);
* end tags of a run that did not finish: ``rankexp.end_reason`` (a signal name, ``TIMEOUT``
  or another Slurm state, ``owner_gone``, ``heartbeat_lost``, ``tracking_lost``,
  ``store_error`` (the store refused a request), ``worker_lost`` (a local worker process
  died), ``exception``, ``superseded``, ``stood_down``) and ``error`` (the message);
* the claim (:func:`claim`): ``rankexp.claim_time`` (when the run claimed its config; the
  earliest live claim computes), ``rankexp.stood_down_for`` (the run a losing claimant gave
  way to; it is closed KILLED and soft-deleted like a superseded run);
* metrics: scalars at step 0; series with ``step = layer`` (or path order / train step);
  every name through :func:`metric_key` (names MLflow refuses, like ``train_loss_lr1e+06``,
  made legal — the one mapping, for writers and readers);
* artifacts: the job's ``result/`` folder (``config.yaml``, ``result.json``, ``arrays.npz``),
  uploaded in one ``log_artifacts``.

A requeued attempt of a job *supersedes* the attempt before it: the earlier run is closed,
tagged ``rankexp.superseded_by=<new run id>`` and deleted (MLflow's soft delete: hidden from
searches and the UI's default view, kept in the store), so one config has one live run.

A sweep's parent run has ``rankexp.role=sweep``, the same owner tags, and at its end the
metrics ``jobs_total``, ``jobs_finished``, ``jobs_skipped``, ``jobs_failed``, ``jobs_killed``,
``jobs_not_run`` and ``sweep_seconds``.

The default store is an embedded SQLite file; a fresh store is created under an
exclusive file lock so parallel first writers cannot race on schema migration or
experiment creation (platform.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
import posixpath
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PARENT_FILE = "mlflow_parent.json"
#: ``{"started": Unix time, "names": [run name of job 0, 1, …]}``, written by the sweeper
#: (names from the swept axes: rankexp.naming); jobs read their name and `job i/N` from it
NAMES_FILE = "run_names.json"
FINISHED_FILE = "finished.json"
#: ``{"uri", "reason", "time"}``: a job of the sweep found its store unreachable (the others
#: then ask it once, quickly, instead of each waiting out the full HTTP bounds)
STORE_DOWN_FILE = "store_down.json"
STATUS_FILE = "status.json"
RUN_FILE = "run.json"
JOURNAL_FILE = "metrics.jsonl"
RESULT_DIR = "result"
MAX_METRICS, MAX_PARAMS, MAX_TAGS = 1000, 100, 100  # log_batch limits (platform.md)
MAX_ENTITIES = 1000  # … and at most this many of them together
PARAM_VALUE_LIMIT = 6000

TAG_ROLE = "rankexp.role"
TAG_HOST, TAG_PID, TAG_PID_START = "rankexp.host", "rankexp.pid", "rankexp.pid_start"
TAG_SLURM, TAG_ATTEMPT, TAG_HEARTBEAT = "rankexp.slurm_job_id", "rankexp.attempt", "rankexp.heartbeat"
TAG_REASON, TAG_SUPERSEDED = "rankexp.end_reason", "rankexp.superseded_by"
#: a job run's claim on its config: when it was made (Unix ms; the claim order), and the run
#: a stood-down claimant gave way to
TAG_CLAIM, TAG_STOOD_DOWN = "rankexp.claim_time", "rankexp.stood_down_for"
TAG_DIRTY = "rankexp.git_dirty"
SEED_STD_PREFIX = "seed_std."  # tag seed_std.<m>: the seed spread of scalar metric <m>
TAG_NOTE = "mlflow.note.content"  # the run's description in the MLflow UI
#: Slurm states in which a job may still close its own run
SLURM_LIVE = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
              "SUSPENDED", "COMPLETING", "CONFIGURING", "STAGE_OUT", "SIGNALING", "STOPPED"}
#: Slurm end states that mean the job was stopped from outside rather than failed
SLURM_KILLED = {"CANCELLED", "PREEMPTED"}


class TrackingError(RuntimeError):
    """The tracking store cannot be used as configured (message says why and what to do)."""


# --------------------------------------------------------------------------- store
def configure_http(retries: int, timeout_s: int, backoff: int) -> None:
    """Bound MLflow's clients for this process.  HTTP: its own ``MLFLOW_HTTP_REQUEST_*``
    settings, read at every request (MLflow's defaults, 7 retries, backoff factor 2, 120 s
    timeout, turn an unreachable server into minutes per call).  A database URI
    (``postgresql://…``): the same number of connection attempts instead of MLflow's ten
    (``mlflow.store.db.utils.MAX_RETRY_COUNT``, whose doubling sleeps add up to 100 s), each
    bounded by libpq's ``PGCONNECT_TIMEOUT`` (unless set)."""
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = str(retries)
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(timeout_s)
    os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] = str(backoff)
    os.environ.setdefault("PGCONNECT_TIMEOUT", str(max(2, timeout_s)))
    with contextlib.suppress(ImportError, AttributeError):
        from mlflow.store.db import utils as db_utils

        db_utils.MAX_RETRY_COUNT = retries + 1
    quiet_store_logs()


def quiet_store_logs() -> None:
    """One message per store problem — ours, naming the store and what to do — instead of a
    urllib3 warning per retry and MLflow's logged traceback of each SQL error it re-raises."""
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)


def redact(uri: str) -> str:
    """``uri`` with its password masked (``postgresql://u:***@host/db``), for messages."""
    return re.sub(r"(://[^/:@]*):[^/@]*@", r"\1:***@", uri)


#: what an unreachable store's errors say (requests/urllib3, libpq, sockets)
_OUTAGE = ("connection refused", "timed out", "timeout", "name or service not known",
           "no route to host", "connection reset", "connection aborted", "remotedisconnected",
           "max retries exceeded", "could not connect", "server closed the connection",
           "temporary failure in name resolution", "network is unreachable",
           "failed to establish a new connection")


def is_outage(e: BaseException) -> bool:
    """Whether ``e`` says the store could not be reached (connection refused, a timeout, a
    name that does not resolve), rather than that it answered and refused the request
    (permission, disk full, read-only, validation: :class:`StoreRefused`)."""
    text = f"{type(e).__name__}: {e}".lower()
    if "error responses" in text:  # urllib3 retried 5xx answers: the server did answer
        return False
    return isinstance(e, (TimeoutError, ConnectionError)) or any(g in text for g in _OUTAGE)


def resolve_uri(uri: str | None, base_dir: str | os.PathLike | None = None) -> str:
    """The tracking URI to use.

    Order: ``uri`` (config) → ``$MLFLOW_TRACKING_URI`` → ``sqlite:///<base_dir>/mlflow.db``
    (``base_dir`` defaults to the current directory).

    Raises:
        TrackingError: a file-store URI (``file:`` or a bare path), which MLflow 3
            deprecates and refuses without ``MLFLOW_ALLOW_FILE_STORE``; rankexp
            never silently falls back to it.
    """
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or None
    if uri is None:
        base = Path(base_dir or os.getcwd()).resolve()
        stale = base / "mlruns"
        if any(stale.glob("*/meta.yaml")):
            log.warning(
                "%s holds an old MLflow file store; it is ignored (rankexp uses %s). "
                "Import it with `mlflow migrate-filestore` if you need those runs.",
                stale,
                base / "mlflow.db",
            )
        return f"sqlite:///{base / 'mlflow.db'}"
    scheme = uri.split(":", 1)[0].lower() if ":" in uri else ""
    if scheme in ("", "file") or (len(scheme) == 1 and uri[1:3] in (":\\", ":/")):
        raise TrackingError(
            f"tracking URI {uri!r} is MLflow's file store, which MLflow 3 has deprecated "
            "(it raises unless MLFLOW_ALLOW_FILE_STORE=true). Use an SQLite file "
            "(tracking.uri=sqlite:////abs/path/mlflow.db, the default is ./mlflow.db) or a "
            "server (tracking.uri=http://127.0.0.1:5000, see launchers/README.md)."
        )
    return uri


def _sqlite_path(uri: str) -> Path | None:
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///") :])
    return None


def _is_http(uri: str) -> bool:
    return uri.lower().startswith(("http://", "https://"))


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """Exclusive lock next to an SQLite store (no-op for servers, which serialize themselves)."""
    db = _sqlite_path(uri)
    if db is None:
        yield
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(str(db) + ".lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _first_line(e: BaseException) -> str:
    """The gist of a store error, in a line."""
    text = str(e).strip() or type(e).__name__
    if isinstance(e, OSError) and e.strerror:  # PermissionError, ENOSPC, EROFS: with the path
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    for gist in ("Connection refused", "Read timed out", "Name or service not known",
                 "No route to host", "Connection reset", "database or disk is full",
                 "attempt to write a readonly database"):
        if gist in text:
            return gist.lower()
    if "unsupported URI" in text:
        return "MLflow knows no store for this URI scheme"
    for line in text.splitlines():  # SQLAlchemy appends the SQL and a help link
        if line.strip():
            return line.strip()[:300]
    return text[:300]


def check_store(uri: str) -> None:
    """Make sure the store at ``uri`` can be used before any run is created: a known scheme,
    an SQLite file that is an MLflow database (a new one is created, under the store lock),
    a server that answers.  Uses the process's HTTP bounds (:func:`configure_http`).

    Raises:
        TrackingError: one message naming the URI or file, what is wrong and what to do.
    """
    db = _sqlite_path(uri)
    if uri.lower().startswith("sqlite:") and db is None:
        raise TrackingError(f"tracking URI {uri!r}: an SQLite store is sqlite:////absolute/path.db "
                            "(three slashes, then the path)")
    if db is not None:
        if not db.parent.is_dir():
            raise TrackingError(f"tracking store {uri}: the folder {db.parent} does not exist "
                                "(create it, or point tracking.uri elsewhere)")
        if db.is_file() and db.stat().st_size > 0:
            with open(db, "rb") as fh:
                if fh.read(16) != b"SQLite format 3\x00":
                    raise TrackingError(
                        f"tracking store {uri}: {db} is not an SQLite database (truncated or "
                        "overwritten?); move it aside to start a new store, or point "
                        "tracking.uri at another one")
    try:
        with _store_lock(uri):
            _client(uri).search_experiments(max_results=1)
            if db is not None:
                _use_wal(db)
    except TrackingError:
        raise
    except Exception as e:
        reason = _first_line(e)
        if db is not None and not is_outage(e) and ("full" in reason or "readonly" in reason
                                                   or "denied" in reason.lower()):
            raise TrackingError(
                f"tracking store {uri}: {db} refuses writes ({reason}); free space on its disk, "
                "fix its permissions, or point tracking.uri at another store") from None
        if db is not None:
            raise TrackingError(
                f"tracking store {uri}: {db} cannot be used as an MLflow store ({reason}); "
                "if it is damaged, move it aside to start a new store, or point tracking.uri "
                "at another one") from None
        if not _is_http(uri) and is_outage(e):
            raise TrackingError(
                f"database store {redact(uri)} does not answer ({reason}) after "
                f"{int(os.environ.get('MLFLOW_HTTP_REQUEST_MAX_RETRIES', '0')) + 1} attempts; "
                "start it, fix tracking.uri / $MLFLOW_TRACKING_URI, or use tracking=off") from None
        if _is_http(uri):
            raise TrackingError(
                f"tracking server {uri} does not answer ({reason}) after "
                f"{os.environ.get('MLFLOW_HTTP_REQUEST_MAX_RETRIES', '?')} retries; start it "
                "(eval \"$(launchers/mlflow-server.sh start)\"), fix tracking.uri / "
                "$MLFLOW_TRACKING_URI, or use tracking=off") from None
        raise TrackingError(
            f"tracking URI {redact(uri)!r} cannot be used ({reason}); use an SQLite file "
            "(sqlite:////abs/path/mlflow.db), a server (http://HOST:PORT) or a database "
            "MLflow supports (postgresql://…, mysql://…)") from None


#: file systems on which SQLite's WAL journal is safe (it needs shared memory on one host)
LOCAL_FILESYSTEMS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "tmpfs", "overlay", "apfs"}


def _filesystem(path: Path) -> str:
    """The type of the file system holding ``path`` (``/proc/mounts``; '' if unknown)."""
    best, kind = "", ""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return ""
    target = str(path.resolve())
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = fields[1].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, fields[2]
    return kind


def _use_wal(db: Path) -> None:
    """Switch an SQLite store on a local disk to SQLite's write-ahead log (a setting kept in
    the file): a commit then costs one fsync instead of three — 4 ms instead of 24 ms on this
    machine, where a job makes four commits — and readers (the MLflow UI) never block
    writers.  Not on network file systems, where WAL is unsafe."""
    import sqlite3

    if _filesystem(db.parent) not in LOCAL_FILESYSTEMS:
        return
    with contextlib.suppress(sqlite3.Error), contextlib.closing(sqlite3.connect(db, timeout=20)) as c:
        if c.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            c.execute("PRAGMA journal_mode=WAL")


def unreachable(uri: str) -> str | None:
    """Why the store at ``uri`` cannot be reached now, or ``None``: one bounded request to a
    server (local SQLite files are always reachable).  A job asks before computing, so an
    outage costs it seconds, and its result goes to the job directory instead."""
    if not _is_http(uri):
        return None
    try:
        _client(uri).search_experiments(max_results=1)
    except Exception as e:
        return _first_line(e)
    return None


def experiment_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name an experiment, or ``None``.  A name is data, not a path: an
    SQLite store keeps an experiment's artifacts in ``mlartifacts/<name>`` beside it, so a
    name must be one path component — no ``/`` or ``\\``, not ``.`` or ``..``, no control
    characters, no leading or trailing blank.  Any other character (unicode included) is
    fine."""
    if not name or not name.strip():
        return "must be a non-empty name"
    if name != name.strip():
        return "must not begin or end with a blank"
    if "/" in name or "\\" in name:
        return "is a name, not a path: no '/' or '\\' (e.g. fig6-ablation)"
    if name in (".", ".."):
        return "is a name, not a path: not '.' or '..'"
    if any(unicodedata.category(c) in ("Cc", "Cs") for c in name):
        return "must not contain control characters"
    return None


def prepare_experiment(uri: str, name: str) -> str:
    """Create the store's schema and the experiment ``name`` if missing; return its id.

    Safe under concurrency: SQLite stores are initialized under a file lock, and a
    lost creation race against a server is resolved by reading the winner's id.

    Raises:
        TrackingError: ``name`` is not a valid experiment name (:func:`experiment_name_problem`:
            no name writes outside the store's artifact root).
    """
    from mlflow.exceptions import MlflowException

    problem = experiment_name_problem(name)
    if problem:
        raise TrackingError(f"experiment name {name!r} {problem}")
    with _store_lock(uri):
        client = _client(uri)
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            if exp.lifecycle_stage == "deleted":
                client.restore_experiment(exp.experiment_id)
            return exp.experiment_id
        db = _sqlite_path(uri)
        location = None
        if db is not None:
            root = (db.parent / "mlartifacts").resolve()
            where = (root / name).resolve()
            if where.parent != root:  # a link or anything else leading out of the artifact root
                raise TrackingError(f"experiment name {name!r}: its artifacts would go to {where}, "
                                    f"outside the store's artifact root {root}")
            location = (db.parent / "mlartifacts" / name).as_uri()
        try:
            return client.create_experiment(name, artifact_location=location)
        except MlflowException:
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id


# --------------------------------------------------------------------------- helpers
_GIT: dict[str, str] = {}


def _git_state(repo: Path | None = None) -> dict[str, str]:
    """``{"sha": HEAD or "", "dirty": "true"/"false"/""}`` of the repository holding rankexp
    (asked once per process: two ``git`` calls)."""
    if not _GIT:
        repo = repo or Path(__file__).resolve().parent.parent
        _GIT.update(sha="", dirty="")
        try:
            sha = subprocess.run(
                ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
            ).stdout.strip()
            dirty = subprocess.run(
                ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.strip()
            if sha:
                _GIT.update(sha=sha, dirty="true" if dirty else "false")
        except (OSError, subprocess.SubprocessError):
            pass
    return _GIT


def git_commit(repo: Path | None = None) -> str:
    """``HEAD`` of the repository holding rankexp (``+dirty`` if modified), or ``unknown``."""
    g = _git_state(repo)
    return (g["sha"] + ("+dirty" if g["dirty"] == "true" else "")) if g["sha"] else "unknown"


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as the user typed it: ``rankexp …`` (the console script) or
    ``python -m rankexp …``."""
    argv = list(sys.argv if argv is None else argv)
    prog = "rankexp" if Path(argv[0]).name == "rankexp" else "python -m rankexp"
    return " ".join([prog, *(shlex.quote(a) for a in argv[1:])])


def system_tags() -> dict[str, str]:
    """MLflow's own tags, which its UI shows as Source, Created by and the commit
    (``mlflow.source.name``, ``mlflow.source.type``, ``mlflow.user``,
    ``mlflow.source.git.commit``), plus ``rankexp.git_dirty`` (``true`` when the working
    tree differed from that commit).  A Slurm job is ``JOB``, anything else ``LOCAL``."""
    import getpass

    g = _git_state()
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    tags = {"mlflow.source.name": "rankexp",
            "mlflow.source.type": "JOB" if slurm_job_id() else "LOCAL", "mlflow.user": user}
    if g["sha"]:
        tags.update({"mlflow.source.git.commit": g["sha"], TAG_DIRTY: g["dirty"]})
    return tags


def _chunks(items: list, n: int) -> Iterator[list]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


def _param_value(v: Any) -> str:
    s = json.dumps(v) if isinstance(v, (list, dict)) else str(v)
    return s[:PARAM_VALUE_LIMIT]


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


# --------------------------------------------------------------------------- owners
def _pid_start(pid: int) -> str | None:
    """Start time of process ``pid`` (clock ticks since boot, /proc/PID/stat field 22), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def slurm_job_id() -> str | None:
    """This process's Slurm job as ``sacct`` names it (``A_T`` for an array task), or None."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID")


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
              params: dict[str, Any] | None = None) -> None:
    """End a run that will not finish: ``rankexp.end_reason``, ``error``, the ``params`` its
    owner had not sent yet (they ride on a job's first batch) and the status."""
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
    one (KILLED, if still RUNNING), tag it ``rankexp.superseded_by`` and delete it, so the job
    has one live run.  A FINISHED run is never superseded.  Returns whether it was."""
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
        close_run(client, old_run_id, "KILLED", "superseded", f"superseded by run {new_run_id}")
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


def claim(uri: str, experiment_id: str, config_hash: str, run_id: str, stale_after_s: float,
          finished_counts: bool = True, ignore: Iterable[str] = ()) -> Claim:
    """Claim ``config_hash`` for the just-created run ``run_id``, through the store itself.

    The protocol (one ``search_runs`` for the common case; it works on SQLite, on a database
    and through a tracking server, for every process that can reach the store): each job
    first creates its run, tagged with its config hash and :func:`claim_tags`, then looks up
    the experiment's live runs of that hash.  A FINISHED one (when ``finished_counts``: not
    under ``tracking.force``) holds the config.  Otherwise, of the RUNNING runs whose owner is
    alive (:func:`owner_gone` — a run whose owner is gone is closed here and its claim taken
    over), the earliest claim wins, ties broken by run id; everyone sees the same runs in the
    same order, so exactly one of them computes.  The others stand down
    (:func:`stand_down`) before computing.  Assumes the writers' clocks agree to better than
    the time between two claims (NTP does).

    ``ignore``: runs that are not rivals (the earlier attempt of this very job, which it
    supersedes).

    Returns:
        :class:`Claim`: ``won=True``, or the holder.
    """
    client = _client(uri)
    runs = client.search_runs([experiment_id], filter_string=f"tags.config_hash = '{config_hash}'",
                              max_results=1000)
    skip = {run_id, *ignore}
    others = [r for r in runs if r.info.run_id not in skip and r.data.tags.get(TAG_ROLE) != "sweep"]
    if finished_counts:
        done = [r for r in others if r.info.status == "FINISHED"]
        if done:
            return Claim(False, done[0].info.run_id, "FINISHED", _describe(done[0]))
    running = [r for r in others if r.info.status == "RUNNING"]
    if not running:
        return Claim(True)
    mine = next((r for r in runs if r.info.run_id == run_id), None)
    if mine is None:  # not visible yet: read it (a database store sees its writes at once)
        mine = client.get_run(run_id)
    sacct = slurm_states(r.data.tags[TAG_SLURM] for r in running if TAG_SLURM in r.data.tags)
    live = [mine]
    for r in running:
        verdict = owner_gone(r.data.tags, r.info.start_time, sacct, stale_after_s, r.info.run_id)
        if verdict is None:
            live.append(r)
            continue
        status, reason, message = verdict
        close_run(client, r.info.run_id, status, reason, message, _unsent_params(r))
        log.warning("took over the claim of run %s (%s), closed %s: %s", r.info.run_id,
                    r.info.run_name, status, message)
    first = min(live, key=_claim_order)
    if first.info.run_id == run_id:
        return Claim(True)
    return Claim(False, first.info.run_id, "RUNNING", _describe(first))


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


# --------------------------------------------------------------------------- one run
class Journal:
    """Metric points a task logs while it runs (training curves), appended to the job
    directory's ``metrics.jsonl`` — what :mod:`rankexp.sync` replays when the store was
    unreachable.  Same ``log_metrics`` as :class:`RunLogger`, so a task cannot tell them apart."""

    def __init__(self, path: Path | None):
        self.path = path

    def log_metrics(self, scalars: dict[str, float], series: dict[str, tuple[Any, Any]] | None = None) -> int:
        points = _points(scalars, series)
        if self.path is not None and points:
            with open(self.path, "a") as fh:
                fh.write(json.dumps({"t": int(time.time() * 1000), "points": points}) + "\n")
        return len(points)


#: what MLflow allows in a metric or tag name (mlflow.utils.validation): word characters
#: (unicode letters and digits, ``_``), ``-``, ``.``, `` ``, ``:`` and ``/``
_ILLEGAL_KEY_CHARS = re.compile(r"[^\w\-. :/]")
MAX_KEY_LENGTH = 250  # MLflow's limit on metric and tag names


@functools.lru_cache(maxsize=4096)
def metric_key(name: str) -> str:
    """The MLflow metric name rankexp logs for the quantity ``name`` — the one mapping, used
    by every writer (live runs, the journal, :mod:`rankexp.sync`) and by readers that build a
    name from a value (the analysis: ``metric_key(f"train_loss_lr{lr:g}")``).

    Names MLflow accepts are returned unchanged (every name a study config produces).
    Otherwise: an exponent's ``+`` is dropped (``train_loss_lr1e+06`` → ``train_loss_lr1e06``,
    still read as 1e06), any other character MLflow refuses becomes ``_``, and a name that
    would resolve to another path (``a//b``, a leading ``/`` or ``..``) has its ``/`` and
    leading dots replaced by ``_``; at most 250 characters.
    """
    key = re.sub(r"(\d)[eE]\+(\d)", r"\1e\2", name)
    key = _ILLEGAL_KEY_CHARS.sub("_", key) or "_"
    norm = posixpath.normpath(key)
    if norm != key or norm == "." or norm.startswith(("..", "/")):
        key = re.sub(r"^\.+", lambda m: "_" * len(m[0]), key.replace("/", "_"))
    return key[:MAX_KEY_LENGTH]


def _points(scalars: dict[str, float], series: dict[str, tuple[Any, Any]] | None) -> list[list]:
    points = [[metric_key(k), 0, float(v)] for k, v in scalars.items()]
    for name, (steps, values) in (series or {}).items():
        key = metric_key(name)
        points += [[key, int(s), float(v)] for s, v in zip(steps, values, strict=True)]
    return points


def split_seed_std(scalars: dict[str, float]) -> tuple[dict[str, float], dict[str, str]]:
    """``(metrics, tags)``: a scalar's seed spread ``<m>_std`` (beside its mean ``<m>``) goes to
    the tag ``seed_std.<m>`` rather than a metric of its own, so the MLflow UI draws one chart
    per quantity, not two (the per-seed values are in ``arrays.npz``; series keep their
    ``<m>_std`` band partner).  :func:`analysis.runs.load_runs` reads the tags back as
    ``<m>_std`` columns."""
    spread = {k for k in scalars if k.endswith("_std") and k[: -len("_std")] in scalars}
    return ({k: v for k, v in scalars.items() if k not in spread},
            {metric_key(f"{SEED_STD_PREFIX}{k[: -len('_std')]}"): repr(float(scalars[k]))
             for k in sorted(spread)})


def read_journal(path: Path) -> list[tuple[int, list[list]]]:
    """``[(timestamp_ms, [[key, step, value], …]), …]`` from a :class:`Journal` file."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line cut short by a kill
            doc = json.loads(line)
            out.append((int(doc["t"]), doc["points"]))
    return out


class TrackingLost(TrackingError):
    """The store stopped answering while the job ran (its result is in the job directory)."""


class StoreRefused(TrackingError):
    """The store answered but refused a request — permission, a full disk, a read-only
    database, a name or value it does not accept (its result is in the job directory; its
    run is ended FAILED with ``rankexp.end_reason=store_error``)."""


class RunLogger(Journal):
    """One job's MLflow run, written in as few requests as MLflow allows: ``create_run`` with
    every tag (owner and parent included), then ``log_batch`` calls that each carry whatever
    is pending — the params ride on the first one (a training task's first live report, or a
    measurement's result), the metrics, the end tags — one ``log_artifacts`` of the result
    folder and ``set_terminated``: four requests for a measurement.

    Live points are also journalled (:class:`Journal`).  When a request fails (bounded by
    :func:`configure_http`), the logger stops sending points — later ones only go to the
    journal — and :meth:`finish` raises: :class:`TrackingLost` when the store could not be
    reached (``lost``), :class:`StoreRefused` when it answered with a refusal (``refused``),
    after which :meth:`end` still closes the run.
    """

    def __init__(self, uri: str, experiment_id: str, run_name: str, params: dict[str, Any],
                 tags: dict[str, str], journal: Path | None = None):
        super().__init__(journal)
        self.uri, self.experiment_id, self.run_name = uri, experiment_id, run_name
        self.params, self.tags = params, dict(tags)
        self.client = _client(uri)
        self.run_id: str | None = None
        self.lost: str | None = None  # why the store cannot be reached
        self.refused: str | None = None  # why the store refused a request
        self._pending_params = sorted(self.params.items())

    def __enter__(self) -> RunLogger:
        """``with RunLogger(...) as run:`` — started on entry; on exit FINISHED (pending params
        sent), or FAILED (KILLED for an interrupt) with the exception as its reason."""
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.finish({}, {}, None)
        else:
            killed = issubclass(exc_type, KeyboardInterrupt)
            self.end("KILLED" if killed else "FAILED", exc_type.__name__, str(exc))
        return False

    def start(self, start_time: int | None = None) -> str:
        """Create the run, every tag at once; returns the run id."""
        run = self.client.create_run(self.experiment_id, run_name=self.run_name, tags=self.tags,
                                     start_time=start_time)
        self.run_id = run.info.run_id
        return self.run_id

    def log_metrics(
        self, scalars: dict[str, float], series: dict[str, tuple[Any, Any]] | None = None
    ) -> int:
        """Log scalars (step 0) and series (``step`` = layer / order / train step) in batches.

        Returns the number of metric points sent.
        """
        n = super().log_metrics(scalars, series)
        if self.lost is None and self.refused is None:
            try:
                self._send(_points(scalars, series), {})
            except Exception as e:
                what = self._failure(e)
                log.error("tracking store %s %s (%s); the job goes on, its points go to %s",
                          self.uri, what, self.lost or self.refused, self.path)
        return n

    def _failure(self, e: BaseException) -> str:
        """Record why a request failed (``lost`` or ``refused``); returns it in words."""
        if is_outage(e):
            self.lost = _first_line(e)
            return "stopped answering"
        self.refused = f"{type(e).__name__}: {_first_line(e)}"
        return "refused a request"

    def _send(self, points: list[list], tags: dict[str, str], timestamp: int | None = None) -> None:
        """``points``, ``tags`` and any params not yet sent, in as few ``log_batch`` as fit."""
        from mlflow.entities import Metric, Param, RunTag

        now = timestamp or int(time.time() * 1000)
        metrics = [Metric(k, v, now, s) for k, s, v in points]
        tag_list = [RunTag(k, str(v)) for k, v in tags.items()]
        params = [Param(k, _param_value(v)) for k, v in self._pending_params]
        self._pending_params = []
        while metrics or params or tag_list:
            p, params = params[:MAX_PARAMS], params[MAX_PARAMS:]
            t, tag_list = tag_list[:MAX_TAGS], tag_list[MAX_TAGS:]
            room = min(MAX_METRICS, MAX_ENTITIES - len(p) - len(t))
            m, metrics = metrics[:room], metrics[room:]
            self.client.log_batch(self.run_id, metrics=m, params=p, tags=t)

    def finish(self, scalars: dict[str, float], series: dict[str, tuple[Any, Any]],
               artifact_dir: Path | None, tags: dict[str, str] | None = None,
               end_time: int | None = None) -> None:
        """Log the final metrics (+ ``tags``) and the artifact folder, then end FINISHED.

        Raises:
            TrackingLost: the store did not answer (now, or earlier in the job).
        """
        if self.lost is None and self.refused is None:
            try:
                scalars, spread = split_seed_std(scalars)
                self._send(_points(scalars, series), {**spread, **(tags or {})})
                if artifact_dir is not None:
                    self.client.log_artifacts(self.run_id, str(artifact_dir))
                self.client.set_terminated(self.run_id, "FINISHED", end_time=end_time)
                return
            except Exception as e:
                self._failure(e)
        if self.refused is not None:
            raise StoreRefused(f"tracking store {redact(self.uri)} refused a request "
                               f"({self.refused})")
        raise TrackingLost(f"tracking store {redact(self.uri)} stopped answering during the job "
                           f"({self.lost})")

    def end(self, status: str, reason: str, message: str = "") -> bool:
        """End the run as ``status`` with its reason; best effort (False if the store is gone)."""
        from mlflow.entities import RunTag

        if self.run_id is None or self.lost is not None:
            return False
        tags = {TAG_REASON: reason, **({"error": message[:5000]} if message else {})}
        try:  # the params go too, if no batch took them yet: every ended run has its config
            self._send([], tags)
        except Exception:  # a refused param or tag: the end tags alone, then the status
            with contextlib.suppress(Exception):
                self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        try:
            self.client.set_terminated(self.run_id, status)
        except Exception as e:
            self._failure(e)
            log.error("could not close run %s as %s (%s)", self.run_id, status, _first_line(e))
            return False
        return True


# --------------------------------------------------------------------------- job directories
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


@contextlib.contextmanager
def quick_bounds() -> Iterator[None]:
    """MLflow's clients bounded to one attempt of one second while inside: for asking a store
    already known to be down whether it is back, and for closing up a sweep whose store is
    down (the usual bounds cost tens of seconds per request)."""
    keys = ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT",
            "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "PGCONNECT_TIMEOUT")
    saved = {k: os.environ.get(k) for k in keys}
    retries = int(saved["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] or 2)
    configure_http(0, 1, 0)
    os.environ["PGCONNECT_TIMEOUT"] = "2"
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        with contextlib.suppress(ImportError, AttributeError):
            from mlflow.store.db import utils as db_utils

            db_utils.MAX_RETRY_COUNT = retries + 1


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


class SweepRun:
    """The parent run of one multirun: opened after the whole sweep is valid, closed with the
    true outcome of every job — after closing the children whose owners are gone."""

    def __init__(self, uri: str, experiment: str, sweep_dir: Path, job_dirs: list[Path],
                 overrides: str, heartbeat_s: float, stale_after_s: float,
                 name: str | None = None, note: str = ""):
        self.uri, self.experiment, self.sweep_dir = uri, experiment, Path(sweep_dir).resolve()
        self.name, self.note = name or f"sweep·{self.sweep_dir.name}", note
        self.job_dirs, self.overrides = job_dirs, overrides
        self.heartbeat_s, self.stale_after_s = heartbeat_s, stale_after_s
        self.client = _client(uri)
        self.experiment_id = self.run_id = None
        self._heartbeat: Heartbeat | None = None
        self.t0 = time.time()

    def open(self, config_hashes: Iterable[str], resume: bool) -> None:
        """Prepare the experiment, close stale runs in it, snapshot its FINISHED configs (jobs
        skip them without asking the store) and create the parent run."""
        self.experiment_id = prepare_experiment(self.uri, self.experiment)
        reconcile(self.uri, self.experiment_id, self.stale_after_s)
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        if resume:
            wanted = set(config_hashes)
            done = {h: r for h, r in finished_configs(self.uri, self.experiment_id).items() if h in wanted}
            write_json(self.sweep_dir / FINISHED_FILE, done)
        tags = {"sweep_id": str(self.sweep_dir), TAG_ROLE: "sweep", "overrides": self.overrides,
                "git_commit": git_commit(), "jobs_total": str(len(self.job_dirs)), **owner_tags(),
                **system_tags(), **({TAG_NOTE: self.note} if self.note else {})}
        run = self.client.create_run(self.experiment_id, run_name=self.name, tags=tags)
        self.run_id = run.info.run_id
        write_json(self.sweep_dir / PARENT_FILE, {
            "uri": self.uri, "experiment": self.experiment, "experiment_id": self.experiment_id,
            "run_id": self.run_id, "sweep_id": str(self.sweep_dir)})
        self._heartbeat = Heartbeat(self.uri, self.run_id, self.heartbeat_s).__enter__()
        log.info("MLflow: %s, experiment %r (id %s), sweep run %s", self.uri, self.experiment,
                 self.experiment_id, self.run_id)

    def close(self, interrupted: str | None = None, grace_s: float = 10.0) -> tuple[str, Counter]:
        """Close the children whose jobs ended or whose owners are gone (waiting up to
        ``grace_s`` for live ones of an interrupted sweep), count the jobs, log the counts and
        end the parent — only once every child is closed, so a parent never ends over a
        RUNNING child: KILLED if interrupted, FAILED if a job failed, was killed or did not
        run, else FINISHED.  A store a job found unreachable is asked with one-second bounds."""
        if self._heartbeat is not None:
            self._heartbeat.__exit__()
        down = store_known_down(self.sweep_dir, self.uri)
        with quick_bounds() if down else contextlib.nullcontext():
            closed, problem = self._close_children(interrupted, grace_s)
            counts = count_jobs(self.job_dirs, {r: s for r, (s, _) in closed.items()})
            status = "KILLED" if interrupted else (
                "FAILED" if counts["failed"] or counts["killed"] or counts["not_run"] else "FINISHED")
            log.info("sweep %s: %s%s", self.sweep_dir, summary(counts),
                     f"; interrupted by {interrupted}: rerun the same command to resume "
                     "(FINISHED configs are skipped)" if interrupted else "")
            try:
                if problem:
                    raise TrackingError(problem)
                _log_counts(self.client, self.run_id, counts, time.time() - self.t0)
                if status == "FINISHED":
                    self.client.set_terminated(self.run_id, "FINISHED")
                else:
                    message = (f"interrupted by {interrupted}: {summary(counts)}; rerun the same "
                               "command to resume" if interrupted else summary(counts))
                    close_run(self.client, self.run_id, status, interrupted or "jobs_failed", message)
            except Exception as e:
                log.error("could not close the sweep run %s in %s (%s); `python -m rankexp.sync %s` "
                          "closes it once the store answers", self.run_id, redact(self.uri),
                          _first_line(e), self.sweep_dir)
        return status, counts

    def _close_children(self, interrupted: str | None, grace_s: float
                        ) -> tuple[dict[str, tuple[str, str]], str | None]:
        """Reconcile the sweep's children; returns the runs closed and, if a child may still be
        RUNNING (the store refused to close it, or could not be asked), why."""
        closed: dict[str, tuple[str, str]] = {}
        end = time.monotonic() + (grace_s if interrupted else 0)
        try:
            while True:
                closed.update(reconcile(self.uri, self.experiment_id, self.stale_after_s,
                                        parent_id=self.run_id))
                running = self._running_children()
                if time.monotonic() >= end or not running:
                    break
                time.sleep(0.5)
            closed.update(correct_timeouts(self.uri, self.experiment_id, self.run_id))
        except Exception as e:
            log.error("could not check the sweep's runs in %s (%s)", redact(self.uri), _first_line(e))
            return closed, f"its job runs could not be checked: {_first_line(e)}"
        if running and not interrupted:
            return closed, ("a job run of the sweep is still RUNNING in the store (it refused to "
                            "close it), so the sweep run is left open")
        return closed, None

    def _running_children(self) -> bool:
        return bool(self.client.search_runs(
            [self.experiment_id], max_results=1,
            filter_string=f"tags.mlflow.parentRunId = '{self.run_id}' and attributes.status = 'RUNNING'"))


# --------------------------------------------------------------------------- reading back
def runs_table(
    experiments: list[str], uri: str | None = None, filter_string: str = "", finished_only: bool = True
):
    """All job runs of ``experiments`` as a pandas table (MLflow's ``search_runs`` layout).

    Columns ``run_id``, ``experiment_id``, ``status``, ``artifact_uri``, ``start_time``,
    ``end_time`` (UTC datetimes), ``params.<key>``, ``metrics.<key>`` (last value of each
    metric), ``tags.<key>``; newest first.  Sweep parent runs are left out.

    On a database store without ``filter_string`` the table is read with four SQL queries
    (runs, params, tags, latest metrics; MLflow's own table models), several times faster
    than ``mlflow.search_runs``, which builds an object per run, param and tag; with a
    filter, or on a tracking server, ``mlflow.search_runs`` reads it.

    Raises:
        TrackingError: none of the experiments exists in the store.
    """
    import mlflow
    import pandas as pd

    uri = resolve_uri(uri)
    client = _client(uri)
    ids = [e.experiment_id for n in experiments if (e := client.get_experiment_by_name(n))]
    if not ids:
        known = [e.name for e in client.search_experiments()]
        raise TrackingError(f"no experiment named {experiments} in {uri}; it has: {known}")
    store = client._tracking_client.store
    if not filter_string and hasattr(store, "engine"):
        df = _sql_runs_table(store.engine, ids, finished_only)
    else:
        clauses = [c for c in (filter_string, "attributes.status = 'FINISHED'" if finished_only
                               else "") if c]
        mlflow.set_tracking_uri(uri)
        df = mlflow.search_runs(experiment_ids=ids, filter_string=" and ".join(clauses),
                                output_format="pandas", max_results=100_000)
    if df.empty:
        return pd.DataFrame()
    if "tags.rankexp.role" in df:
        df = df[df["tags.rankexp.role"] != "sweep"]
    return df.reset_index(drop=True)


def _sql_runs_table(engine, experiment_ids: list[str], finished_only: bool):
    """``runs_table`` of active runs straight from the store's tables (see there)."""
    import pandas as pd
    from mlflow.store.tracking.dbmodels.models import SqlLatestMetric, SqlParam, SqlRun, SqlTag
    from sqlalchemy import select

    r = SqlRun
    query = select(r.run_uuid, r.experiment_id, r.status, r.artifact_uri, r.start_time,
                   r.end_time).where(r.experiment_id.in_([int(e) for e in experiment_ids]),
                                     r.lifecycle_stage == "active")
    if finished_only:
        query = query.where(r.status == "FINISHED")
    with engine.connect() as conn:
        # (plain tuples: pandas probes each SQLAlchemy Row for ``_fields``, ~20 µs a row)
        runs = pd.DataFrame(list(map(tuple, conn.execute(query))), columns=[
            "run_id", "experiment_id", "status", "artifact_uri", "start_time", "end_time"])
        if runs.empty:
            return pd.DataFrame()

        def long(model, *cols) -> list:
            rows = []
            for chunk in _chunks(list(runs["run_id"]), _BULK_RUNS_SQL):
                rows += map(tuple, conn.execute(select(model.run_uuid, *cols).where(
                    model.run_uuid.in_(chunk))))
            return rows

        m = SqlLatestMetric
        metrics = pd.DataFrame(long(m, m.key, m.value, m.is_nan),
                               columns=["run_id", "key", "value", "is_nan"])
        params = pd.DataFrame(long(SqlParam, SqlParam.key, SqlParam.value),
                              columns=["run_id", "key", "value"])
        tags = pd.DataFrame(long(SqlTag, SqlTag.key, SqlTag.value), columns=["run_id", "key", "value"])
    metrics["value"] = metrics["value"].astype("float64").where(~metrics["is_nan"].astype(bool))
    runs["experiment_id"] = runs["experiment_id"].astype(str)
    for col in ("start_time", "end_time"):
        runs[col] = pd.to_datetime(runs[col], unit="ms", utc=True)
    wide = [runs.set_index("run_id")]
    for prefix, long_table in (("metrics.", metrics), ("params.", params), ("tags.", tags)):
        if not long_table.empty:
            w = long_table.pivot(index="run_id", columns="key", values="value")
            wide.append(w.add_prefix(prefix))
    df = pd.concat(wide, axis=1).reindex(runs["run_id"])
    df = df.rename_axis("run_id").reset_index()
    return df.sort_values(["start_time", "run_id"], ascending=[False, True], kind="stable")


def experiment_names(uri: str | None = None) -> list[str]:
    """Names of the store's experiments that hold at least one run, oldest first.

    Raises:
        TrackingError: the store cannot be read.
    """
    from mlflow.exceptions import MlflowException

    client = _client(resolve_uri(uri))
    try:
        exps = client.search_experiments()
        return [
            e.name
            for e in sorted(exps, key=lambda e: int(e.experiment_id))
            if client.search_runs([e.experiment_id], max_results=1)
        ]
    except MlflowException as e:
        raise TrackingError(f"cannot list the experiments of {resolve_uri(uri)}: {e}") from None


def metric_history(uri: str | None, run_id: str, key: str):
    """``(steps, values)`` of one metric series of one run, sorted by step."""
    import numpy as np

    hist = sorted(_client(resolve_uri(uri)).get_metric_history(run_id, key), key=lambda m: m.step)
    return np.array([m.step for m in hist]), np.array([m.value for m in hist])


#: runs per bulk request: well under SQLite's bound-variable limit; the server's REST limit
_BULK_RUNS_SQL, _BULK_RUNS_REST, _BULK_REST_MAX_POINTS = 500, 100, 25_000


def metric_histories(uri: str | None, run_ids: list[str], keys: list[str]):
    """``{(run_id, key): (steps, values)}`` for every run and key that logged points, in bulk.

    On a database store one SQL query per 500 runs reads every key at once (MLflow's own
    ``metrics`` table model, SQLAlchemy Core rows: no ORM object per point); on a tracking
    server one request per key and 100 runs (its ``get-history-bulk`` endpoint, which the
    MLflow UI's charts use); one ``get_metric_history`` per run and key only on stores with
    neither. Each series is sorted by step (then time) like :func:`metric_history`; a
    (run, key) that logged nothing is absent.
    """
    import numpy as np

    client = _client(resolve_uri(uri))
    store = client._tracking_client.store  # the store behind the client (SQL or REST)
    run_ids, keys = list(dict.fromkeys(run_ids)), list(dict.fromkeys(keys))
    points: dict[tuple[str, str], list[tuple[int, int, float]]] = {}
    if hasattr(store, "engine"):
        points = _sql_history_bulk(store.engine, run_ids, keys)
    elif hasattr(store, "get_host_creds"):
        for key in keys:
            for chunk in _chunks(run_ids, _BULK_RUNS_REST):
                for run_id, pts in _rest_history_bulk(store, client, chunk, key).items():
                    points[(run_id, key)] = pts
    else:
        for run_id in run_ids:
            for key in keys:
                pts = [(m.step, m.timestamp, m.value) for m in client.get_metric_history(run_id, key)]
                if pts:
                    points[(run_id, key)] = pts
    out = {}
    for k, pts in points.items():
        pts.sort(key=lambda p: (p[0], p[1]))
        out[k] = (np.array([p[0] for p in pts], dtype=np.int64),
                  np.array([p[2] for p in pts], dtype=np.float64))
    return out


def _sql_history_bulk(engine, run_ids: list[str], keys: list[str]) -> dict[tuple[str, str], list]:
    from mlflow.store.tracking.dbmodels.models import SqlMetric
    from sqlalchemy import select

    m = SqlMetric
    points: dict[tuple[str, str], list] = {}
    with engine.connect() as conn:
        for chunk in _chunks(run_ids, _BULK_RUNS_SQL):
            query = select(m.run_uuid, m.key, m.step, m.timestamp, m.value, m.is_nan).where(
                m.key.in_(keys), m.run_uuid.in_(chunk))
            for run_id, key, step, ts, value, is_nan in conn.execute(query):
                points.setdefault((run_id, key), []).append(
                    (int(step), int(ts), float("nan") if is_nan else float(value)))
    return points


def _rest_history_bulk(store, client, run_ids: list[str], key: str) -> dict[str, list]:
    """One ``get-history-bulk`` request; a chunk whose answer may be cut at the server's
    point limit is read run by run instead."""
    from mlflow.utils.rest_utils import http_request

    resp = http_request(store.get_host_creds(), "/ajax-api/2.0/mlflow/metrics/get-history-bulk",
                        "GET", params={"run_id": run_ids, "metric_key": key,
                                       "max_results": _BULK_REST_MAX_POINTS})
    if resp.status_code != 200:
        raise TrackingError(f"{store.get_host_creds().host}: get-history-bulk answered "
                            f"{resp.status_code}: {resp.text[:300]}")
    metrics = resp.json().get("metrics", [])
    out: dict[str, list] = {}
    if len(metrics) >= _BULK_REST_MAX_POINTS:  # possibly truncated
        for run_id in run_ids:
            pts = [(m.step, m.timestamp, m.value) for m in client.get_metric_history(run_id, key)]
            if pts:
                out[run_id] = pts
        return out
    for m in metrics:
        out.setdefault(m["run_id"], []).append(
            (int(m.get("step", 0)), int(m.get("timestamp", 0)), float(m["value"])))
    return out


def download_artifact(uri: str | None, run_id: str, path: str, dst: str | None = None) -> Path:
    """Local path of the artifact ``path`` (e.g. ``arrays.npz``) of run ``run_id``.

    Downloaded into the existing folder ``dst`` (default: a new temporary folder).

    Raises:
        TrackingError: the run has no such artifact (e.g. logged with ``tracking.log_arrays=false``).
    """
    from mlflow.exceptions import MlflowException

    try:
        local = Path(_client(resolve_uri(uri)).download_artifacts(run_id, path, dst))
    except (MlflowException, OSError) as e:
        raise TrackingError(f"run {run_id} has no artifact {path!r} ({e})") from None
    if not local.exists():
        raise TrackingError(f"run {run_id} has no artifact {path!r}")
    return local


# --------------------------------------------------------------------------- sweeps in rounds
def extend_sweep(run: SweepRun, job_dirs: list[Path], names: list[str],
                 config_hashes: Iterable[str], resume: bool) -> None:
    """A sweep that learns its jobs round by round (``hydra/sweeper=contour``) tells its parent
    and its jobs about every job so far: the plan (:data:`NAMES_FILE`: names and job dirs, so
    counts and run names cover every round), the FINISHED configs among them
    (:data:`FINISHED_FILE`, when resuming: a job of a rerun skips what the store holds) and the
    parent's ``jobs_total`` tag."""
    record = read_json(run.sweep_dir / NAMES_FILE) or {}
    write_json(run.sweep_dir / NAMES_FILE, {
        "started": record.get("started", time.time()), "names": list(names),
        "job_dirs": [str(Path(d).resolve()) for d in job_dirs]})
    run.job_dirs = list(job_dirs)
    if resume:
        wanted = set(config_hashes)
        done = {h: r for h, r in finished_configs(run.uri, run.experiment_id).items() if h in wanted}
        write_json(run.sweep_dir / FINISHED_FILE, done)
    run.client.set_tag(run.run_id, "jobs_total", str(len(job_dirs)))


def log_tables(run: SweepRun, tables: dict[str, Any], scalars: dict[str, float],
               folder: str = "contour") -> None:
    """Log pandas tables as artifacts ``<folder>/<name>.csv`` and ``.json`` (records) of the
    sweep's parent run, and ``scalars`` as its metrics."""
    import tempfile

    from mlflow.entities import Metric

    with tempfile.TemporaryDirectory() as tmp:
        for name, df in tables.items():
            df.to_csv(Path(tmp) / f"{name}.csv", index=False)
            df.to_json(Path(tmp) / f"{name}.json", orient="records", indent=1)
        run.client.log_artifacts(run.run_id, tmp, folder)
    now = int(time.time() * 1000)
    if scalars:
        run.client.log_batch(run.run_id, metrics=[Metric(metric_key(k), float(v), now, 0)
                                                  for k, v in scalars.items()])
