"""The store and its names, provenance, a job's run (:class:`RunLogger`), claims and expiry,
the sweep's parent run (:class:`SweepRun`) and the caller's active run."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import getpass
import json
import logging
import os
import posixpath
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

from .. import jobdir
from ..jobdir import redact
from ..locations import user_cache_dir
from ..naming import experiment_name_problem, member_name

log = logging.getLogger(__name__)
__all__ = ["TAG_ROLE", "ROLE_MEMBER", "TAG_LR",
           "FIGURES_DIR", "SEED_STD_PREFIX", "TAG_NOTE", "TAG_KIND", "ML_KIND", "ui_link",
           "TAG_HOST", "TAG_PID", "TAG_PID_START",
           "TAG_SLURM", "TAG_HEARTBEAT", "TAG_DIRTY", "TAG_CLAIM", "TAG_REASON", "RUN_TAGS",
           "RESERVED_TAG_PREFIXES", "TrackingError", "TrackingLost", "_first_line",
           "configure_http", "quiet_store_logs", "resolve_uri", "_client", "check_store",
           "prepare_experiment", "metric_key", "user_tag_problem",
           "split_seed_std", "git_commit", "command_line", "slurm_job_id", "system_tags",
           "owner_tags", "Sink", "RunLogger", "Journal", "read_journal", "read_member_journal",
           "finished_runs", "find_finished", "expired", "close_run", "reconcile", "supersede",
           "supersede_finished", "Claim", "CLAIM_PENDING_S", "claim", "stand_down", "Heartbeat",
           "log_counts", "SweepRun",
           "attach_files", "active_run_sink", "log_active_text"]


TAG_ROLE, ROLE_MEMBER, TAG_LR = "rankexp.role", "member", "rankexp.lr"
FIGURES_DIR = "figures"  # a sweep parent's artifact folder of the analysis' figures
SEED_STD_PREFIX = "seed_std."  # tag seed_std.<m>: the seed spread of scalar metric <m>
TAG_NOTE = "mlflow.note.content"  # a run's (or an experiment's) description in the MLflow UI
#: MLflow 3's experiment type: classic ML ("custom_model_development"), not GenAI
TAG_KIND, ML_KIND = "mlflow.experimentKind", "custom_model_development"
TAG_HOST, TAG_PID, TAG_PID_START = "rankexp.host", "rankexp.pid", "rankexp.pid_start"
TAG_SLURM, TAG_HEARTBEAT, TAG_DIRTY = "rankexp.slurm_job_id", "rankexp.heartbeat", "rankexp.git_dirty"
TAG_CLAIM, TAG_REASON = "rankexp.claim_time", "rankexp.end_reason"
TAG_LEGACY_HASH = "rankexp.legacy_hash"  # a run's config_hash before find_finished re-tagged it
#: the plain tags rankexp writes; with these prefixes, no ``tracking.tags`` key may take them
RUN_TAGS = ("config_hash", "git_commit", "overrides", "device", "task", "torch_threads", "job_dir",
            "sweep_id", "jobs_total", "error")
RESERVED_TAG_PREFIXES = ("mlflow.", "rankexp.", SEED_STD_PREFIX)


class TrackingError(RuntimeError):
    """The tracking store cannot be used as configured (the message says why and what to do)."""


class TrackingLost(TrackingError):
    """The store failed a request once the job had begun (``python -m rankexp.sync`` logs it)."""


def _first_line(e: BaseException) -> str:
    """The gist of a store error in one line, credentials masked."""
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    text = str(e).strip() or type(e).__name__
    cause = re.search(r"\(Caused by \w+\(['\"]?(?:<[^>]*>(?:: |, '))?(.*?)['\"]?\)\)", text)
    text = cause[1] if cause else text  # urllib3's last try, not the wrapping of each layer
    if status := re.fullmatch(r"too many (\d+) error responses", text):
        code = int(status[1])  # MLflow answers 503 while its database does not answer
        return (f"server unavailable: HTTP {code} {HTTPStatus(code).phrase} on every try"
                + ("; its database does not answer" if code == 503 else ""))
    for gist in ("Connection refused", "Read timed out", "Name or service not known",
                 "database or disk is full", "attempt to write a readonly database"):
        if gist in text:
            return gist.lower()
    if "unsupported URI" in text:
        return "MLflow knows no store for this URI scheme"
    return redact(next((ln.strip() for ln in text.splitlines() if ln.strip()), text)[:300])


def configure_http(retries: int, timeout_s: int, backoff: int) -> None:
    """Bound MLflow's HTTP retries and timeouts (its defaults spend minutes on a dead server)
    and, for a database URI, its connection attempts (``PGCONNECT_TIMEOUT`` each)."""
    for key, value in (("MAX_RETRIES", retries), ("TIMEOUT", timeout_s), ("BACKOFF_FACTOR", backoff)):
        os.environ[f"MLFLOW_HTTP_REQUEST_{key}"] = str(value)
    os.environ.setdefault("PGCONNECT_TIMEOUT", str(max(2, timeout_s)))
    with contextlib.suppress(ImportError, AttributeError):
        from mlflow.store.db import utils as db_utils
        db_utils.MAX_RETRY_COUNT = retries + 1
    quiet_store_logs()


def quiet_store_logs() -> None:
    """Our one message per store problem, not a warning per retry and MLflow's tracebacks."""
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)


def resolve_uri(uri: str | None, base_dir: str | os.PathLike | None = None) -> str:
    """``uri`` → ``$MLFLOW_TRACKING_URI`` → ``sqlite:///<base_dir or cwd>/mlflow.db``;
    TrackingError for MLflow's file store (``file:`` or a bare path), deprecated in MLflow 3."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or None
    if uri is None:
        return f"sqlite:///{Path(base_dir or os.getcwd()).resolve() / 'mlflow.db'}"
    scheme = uri.split(":", 1)[0].lower() if ":" in uri else ""
    if scheme in ("", "file") or (len(scheme) == 1 and uri[1:3] in (":\\", ":/")):
        raise TrackingError(
            f"tracking URI {uri!r} is MLflow's file store, which MLflow 3 has deprecated. Use an "
            "SQLite file (tracking.uri=sqlite:////abs/path/mlflow.db, the default is ./mlflow.db) "
            "or a server (tracking.uri=http://127.0.0.1:5000, see launchers/README.md).")
    return uri


def _sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def _client(uri: str):
    from mlflow.tracking import MlflowClient
    return MlflowClient(tracking_uri=uri)


def check_store(uri: str) -> None:
    """Make sure the store answers before any run exists; an SQLite file on a local disk is
    switched to the write-ahead log (readers never block).  TrackingError: one line naming the
    store (password masked), what is wrong, what to do."""
    db = _sqlite_path(uri)
    if uri.lower().startswith("sqlite:") and db is None:
        raise TrackingError(f"tracking URI {uri!r}: an SQLite store is sqlite:////absolute/path.db")
    if db is not None and not db.parent.is_dir():
        raise TrackingError(f"tracking store {uri}: the folder {db.parent} does not exist "
                            "(create it, or point tracking.uri elsewhere)")
    if db is not None and db.is_file() and db.stat().st_size:
        with open(db, "rb") as fh:
            if fh.read(16) != b"SQLite format 3\x00":
                raise TrackingError(f"tracking store {uri}: {db} is not an SQLite database; move "
                                    "it aside to start a new store, or point tracking.uri elsewhere")
    try:  # a new SQLite store is made under a lock: MLflow's migrations cannot race each other
        with open(f"{db}.lock", "a") if db else contextlib.nullcontext() as lock:
            if lock is not None:
                fcntl.flock(lock, fcntl.LOCK_EX)
            _client(uri).search_experiments(max_results=1)
    except Exception as e:
        if db is not None:
            raise TrackingError(f"tracking store {uri}: {db} cannot be used as an MLflow store "
                                f"({_first_line(e)}); move it aside, or point tracking.uri at "
                                "another store") from None
        raise TrackingError(f"tracking store {redact(uri)} does not answer ({_first_line(e)}); "
                            "start it, fix tracking.uri / $MLFLOW_TRACKING_URI, or use tracking=off"
                            ) from None
    if db is not None and _filesystem(db) not in ("nfs", "nfs4", "cifs", "smb3", "lustre", "gpfs",
                                                  "beegfs", "fuse.sshfs"):
        import sqlite3  # WAL needs shared memory on one host: not on a network file system
        with contextlib.suppress(sqlite3.Error), contextlib.closing(sqlite3.connect(db, timeout=20)) as c:
            c.execute("PRAGMA journal_mode=WAL")


def _filesystem(path: Path) -> str:
    """The type of the file system holding ``path`` ('' if unknown)."""
    target, best, kind = str(path.resolve()), "", ""
    with contextlib.suppress(OSError):
        for fields in (ln.split() for ln in Path("/proc/mounts").read_text().splitlines()):
            mount = fields[1].replace("\\040", " ")
            if (target + "/").startswith(mount.rstrip("/") + "/") and len(mount) >= len(best):
                best, kind = mount, fields[2]
    return kind


def prepare_experiment(uri: str, name: str, description: str | None = None) -> str:
    """The id of experiment ``name`` (created, or restored if deleted), ``description`` its
    note.  TrackingError: no experiment name, or its artifacts would leave the artifact root."""
    from mlflow.exceptions import MlflowException
    problem = experiment_name_problem(name)
    if problem:
        raise TrackingError(f"experiment name {name!r} {problem}")
    client = _client(uri)
    exp = client.get_experiment_by_name(name)
    if exp is None:
        db, location = _sqlite_path(uri), None
        if db is None and not uri.lower().startswith(("http:", "https:")):
            # a direct database URI: the user's cache dir, not the creating process's ./mlruns
            location = (user_cache_dir() / "mlartifacts" / name).as_uri()
        if db is not None:
            root = (db.parent / "mlartifacts").resolve()
            if (root / name).resolve().parent != root:
                raise TrackingError(f"experiment name {name!r}: its artifacts would go to "
                                    f"{(root / name).resolve()}, outside the store's artifact root {root}")
            location = (root / name).as_uri()
        try:
            exp = client.get_experiment(client.create_experiment(  # the kind with it: no race
                name, artifact_location=location, tags={TAG_KIND: ML_KIND}))
        except MlflowException:
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
    if exp.lifecycle_stage == "deleted":
        client.restore_experiment(exp.experiment_id)
    if description and exp.tags.get(TAG_NOTE) != description:
        with contextlib.suppress(MlflowException):  # two sweeps at once: the store's upsert races
            client.set_experiment_tag(exp.experiment_id, TAG_NOTE, description)
    return exp.experiment_id


def ui_link(uri: str, experiment_id: str) -> str:
    """Where the MLflow UI shows the experiment's run table: MLflow 3.x's UI opens an
    experiment on its GenAI pages unless the address (or its sidebar switch) asks for ML."""
    path = f"/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
    if uri.lower().startswith(("http:", "https:")):
        return redact(uri).rstrip("/") + path
    return f"http://127.0.0.1:5000{path} (make ui)"


_ILLEGAL_KEY_CHARS = re.compile(r"[^\w\-. :/]")  # what MLflow allows in metric and tag names


@functools.lru_cache(maxsize=4096)
def metric_key(name: str) -> str:
    """The MLflow metric name of quantity ``name`` (for writers and readers): an exponent's ``+``
    dropped (``lr1e+06`` → ``lr1e06``), refused characters → ``_``, ``/`` and leading dots →
    ``_`` where the name would resolve to another path; at most 250 characters."""
    key = re.sub(r"(\d)[eE]\+(\d)", r"\1e\2", name)
    key = _ILLEGAL_KEY_CHARS.sub("_", key) or "_"
    norm = posixpath.normpath(key)
    if norm != key or norm == "." or norm.startswith(("..", "/")):
        key = re.sub(r"^\.+", lambda m: "_" * len(m[0]), key.replace("/", "_"))
    return key[:250]


def user_tag_problem(key: str) -> str | None:
    """Why ``key`` cannot be a ``tracking.tags`` key (MLflow must accept it unchanged and
    rankexp not write it itself), or ``None``."""
    if not key or metric_key(key) != key:
        return (f"is not a tag name MLflow accepts (letters, digits, '_-.:/ ', at most "
                f"250 characters; e.g. {metric_key(key or '_')!r})")
    if key in RUN_TAGS or key.startswith(RESERVED_TAG_PREFIXES):
        return ("is a tag rankexp writes itself (config_hash, sweep_id, mlflow.*, rankexp.*, …): "
                "choose another name")
    return None


def split_seed_std(scalars: dict[str, float]) -> tuple[dict[str, float], dict[str, str]]:
    """``(metrics, tags)``: the seed spread ``<m>_std`` of a scalar ``<m>`` becomes the tag
    ``seed_std.<m>`` (one UI chart per quantity)."""
    spread = {k for k in scalars if k.endswith("_std") and k[:-4] in scalars}
    return ({k: v for k, v in scalars.items() if k not in spread},
            {metric_key(f"{SEED_STD_PREFIX}{k[:-4]}"): repr(float(scalars[k])) for k in sorted(spread)})


@functools.lru_cache(maxsize=1)
def _git_state() -> tuple[str, str]:
    """``(HEAD, "true"/"false" dirty)`` of rankexp's checkout (without git's lock)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "--no-optional-locks", "-C", str(Path(__file__).parents[2]),
                               *args], capture_output=True, text=True, timeout=5).stdout.strip()

    try:
        sha = git("rev-parse", "HEAD")
        return (sha, "true" if git("status", "--porcelain", "--untracked-files=no") else "false") \
            if sha else ("", "")
    except (OSError, subprocess.SubprocessError):
        return "", ""


def git_commit() -> str:
    """``HEAD`` of the checkout (``+dirty`` if modified), or ``unknown``."""
    sha, dirty = _git_state()
    return (sha + ("+dirty" if dirty == "true" else "")) if sha else "unknown"


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as typed (``rankexp …`` or ``python -m rankexp …``), passwords masked."""
    argv = list(sys.argv if argv is None else argv)
    prog = "rankexp" if Path(argv[0]).name == "rankexp" else "python -m rankexp"
    return redact(" ".join([prog, *(shlex.quote(a) for a in argv[1:])]))


def slurm_job_id() -> str | None:
    """This process's Slurm job as ``sacct`` names it (``A_T`` for an array task), or None."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID")


def _pid_start(pid: int) -> str | None:
    """Start time of process ``pid`` (``/proc/PID/stat`` field 22), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def system_tags() -> dict[str, str]:
    """MLflow's own tags (the UI's Source, Created by, commit) and ``rankexp.git_dirty``."""
    sha, dirty = _git_state()
    tags = {"mlflow.source.name": "rankexp", "mlflow.user": getpass.getuser(),
            "mlflow.source.type": "JOB" if slurm_job_id() else "LOCAL"}
    return {**tags, "mlflow.source.git.commit": sha, TAG_DIRTY: dirty} if sha else tags


def owner_tags() -> dict[str, str]:
    """Who owns a run this process creates (host, pid, its start time, Slurm job) and a first
    heartbeat: what tells a later job whether the owner is gone."""
    tags = {TAG_HOST: socket.gethostname(), TAG_PID: str(os.getpid()),
            TAG_PID_START: _pid_start(os.getpid()) or "", TAG_HEARTBEAT: str(int(time.time()))}
    return {**tags, TAG_SLURM: slurm_job_id()} if slurm_job_id() else tags


#: ``log(metrics, step)``: where a checkpoint's numbers go (:func:`active_run_sink`)
Sink = Callable[[Mapping[str, float], int], None]
#: tags of a training run its member runs do not inherit (a member is no job, no claimant)
_JOB_ONLY_TAGS = ("config_hash", "job_dir", TAG_HOST, TAG_PID, TAG_PID_START, TAG_HEARTBEAT,
                  TAG_SLURM, TAG_CLAIM, "mlflow.parentRunId")


def _param(v: Any) -> str:
    return (json.dumps(v) if isinstance(v, (list, dict)) else str(v))[:6000]


def _points(scalars: Mapping[str, float], series: Mapping[str, tuple] | None = None) -> list[list]:
    points = [[metric_key(k), 0, float(v)] for k, v in scalars.items()]
    for name, (steps, values) in (series or {}).items():
        points += [[metric_key(name), int(s), float(v)] for s, v in zip(steps, values, strict=True)]
    return points


def _member_points(steps: Any, metrics: Mapping[str, Any], members: int) -> list[list[list]]:
    """Member ``i``'s points of ``metrics`` (values ``(members,)`` at one step or
    ``(k, members)`` at ``k`` steps)."""
    import numpy as np
    if not members:
        raise ValueError("log_member_series before open_members: no members to log to")
    one = np.ndim(steps) == 0
    at = np.atleast_1d(np.asarray(steps)).astype(np.int64)
    out: list[list[list]] = [[] for _ in range(members)]
    for name, values in metrics.items():
        v = np.asarray(values, dtype=np.float64)
        v = v[None] if one else v
        if v.shape != (at.size, members):
            raise ValueError(f"{name}: values of shape {np.shape(values)} for {at.size} step(s) of "
                             f"{members} members (want {'(members,)' if one else '(steps, members)'})")
        for i in range(members):
            out[i] += [[metric_key(name), int(s), float(x)] for s, x in zip(at, v[:, i], strict=True)]
    return out


class RunLogger:
    """One job's run: each point appended to the job's journal (``metrics.jsonl``, what
    :mod:`rankexp.sync` replays), then sent in few requests.  After a failed request nothing
    more is sent (``lost`` says why) and :meth:`finish` raises :class:`TrackingLost`.  A
    training run's learning rates are member runs nested under it."""

    def __init__(self, uri: str | None, experiment_id: str | None, run_name: str,
                 params: dict[str, Any], tags: dict[str, str], journal: Path | None = None):
        self.uri, self.experiment_id, self.run_name, self.path = uri, experiment_id, run_name, journal
        self.params, self.tags, self.client = params, dict(tags), _client(uri) if uri else None
        self.run_id: str | None = None
        self.lost: str | None = None
        self._pending = sorted(params.items())
        self.member_lrs: list[float] = []
        self.members: list[RunLogger] = []

    def __enter__(self) -> RunLogger:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finish({}, {}, None)
        else:
            self.end("KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED",
                     exc_type.__name__, str(exc))

    def start(self, start_time: int | None = None) -> str:
        run = self.client.create_run(self.experiment_id, run_name=self.run_name, tags=self.tags,
                                     start_time=start_time)
        self.run_id = run.info.run_id
        return self.run_id

    def _write(self, doc: dict[str, Any]) -> None:
        if self.path is not None:
            with open(self.path, "a") as fh:
                fh.write(json.dumps({"t": int(time.time() * 1000), **doc}) + "\n")

    def _guard(self, what: str, send: Callable[[], Any]) -> bool:
        """``send()`` unless there is no run or the store failed before; whether it was sent."""
        if self.lost is not None or self.run_id is None:
            return False
        try:
            send()
            return True
        except Exception as e:
            self.lost = _first_line(e)
            log.error("tracking store %s failed %s (%s); the job goes on, its result goes to its "
                      "job directory", redact(self.uri), what, self.lost)
            return False

    def log_metrics(self, scalars: dict[str, float], series: dict[str, tuple] | None = None) -> int:
        """Scalars (step 0) and series ``{name: (steps, values)}``; returns the points."""
        points = _points(scalars, series)
        if points:
            self._write({"points": points})
            self._guard("a request", lambda: self._send(points, {}))
        return len(points)

    def open_members(self, lrs: Sequence[float]) -> None:
        """One member run per learning rate (``<run name>·lr1e-3``, this run's params + ``lr``)."""
        self.member_lrs = [float(lr) for lr in lrs]
        self._write({"members": self.member_lrs})

        def create() -> None:
            for lr in self.member_lrs:
                tags = {**{k: v for k, v in self.tags.items() if k not in _JOB_ONLY_TAGS},
                        "mlflow.parentRunId": self.run_id, TAG_ROLE: ROLE_MEMBER, TAG_LR: f"{lr:g}"}
                member = RunLogger(self.uri, self.experiment_id, member_name(self.run_name, lr),
                                   {**self.params, "lr": lr}, tags)
                member.client = self.client
                member.start()
                self.members.append(member)
        self._guard("creating the learning-rate runs", create)

    def log_member_series(self, steps: int | Sequence[int], metrics: Mapping[str, Any]) -> int:
        """Per-member values under plain names (``train_loss``): one step with values
        ``(members,)``, or ``k`` steps with ``(k, members)``; ValueError for other shapes."""
        per_member = _member_points(steps, metrics, len(self.member_lrs))
        for i, points in enumerate(per_member):
            if points:
                self._write({"member": i, "points": points})
        self._send_members(per_member)
        return sum(map(len, per_member))

    def _send_members(self, per_member: list[list[list]], timestamp: int | None = None) -> None:
        if len(self.members) == len(per_member):
            self._guard("a request", lambda: [m._send(p, {}, timestamp) for m, p in
                                              zip(self.members, per_member, strict=True) if p])

    def log_dataset(self, name: str, sha256: str, source: str, profile: dict, context: str = "train") -> bool:
        """A data set the job reads as the run's dataset input (digest: ``sha256[:32]``, the
        whole in the profile); whether the store took it."""
        from mlflow.entities import Dataset, DatasetInput, InputTag
        dataset = Dataset(name=name, digest=sha256[:32], source_type="local", source=json.dumps(
            {"uri": str(source)}), profile=json.dumps({**profile, "sha256": sha256}))
        return self._guard("the dataset input", lambda: self.client.log_inputs(self.run_id, [
            DatasetInput(dataset, tags=[InputTag("mlflow.data.context", context)])]))

    @contextlib.contextmanager
    def system_metrics(self, every_s: float | None = None) -> Iterator[None]:
        """MLflow's system metrics (``system/…``: CPU, memory, GPU) every ``every_s`` s (10)."""
        monitor = None
        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
        if self.run_id is not None and self.lost is None:
            try:
                from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
                monitor = SystemMetricsMonitor(self.run_id, sampling_interval=every_s or 10.0,
                                               tracking_uri=self.uri)
                monitor.start()
            except Exception as e:  # psutil missing, an outage: the job goes on without them
                log.warning("no system metrics for run %s (%s)", self.run_id, _first_line(e))
        try:
            yield
        finally:
            if monitor is not None:
                monitor.finish()

    def _send(self, points: list[list], tags: dict[str, str], timestamp: int | None = None) -> None:
        """``points``, ``tags`` and the params not sent yet (MLflow splits what exceeds a batch)."""
        from mlflow.entities import Metric, Param, RunTag
        now = timestamp or int(time.time() * 1000)
        params, self._pending = [Param(k, _param(v)) for k, v in self._pending], []
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, s) for k, s, v in points],
                              params=params, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def finish(self, scalars: dict[str, float], series: dict[str, tuple], artifact_dir: Path | None,
               tags: dict[str, str] | None = None, end_time: int | None = None) -> None:
        """The final metrics (seed spreads as tags), the artifacts, then FINISHED (the members
        first); TrackingLost if the store failed a request (now or earlier)."""
        def send() -> None:
            metrics, spread = split_seed_std(scalars)
            self._send(_points(metrics, series), {**spread, **(tags or {})})
            if artifact_dir is not None:
                self.client.log_artifacts(self.run_id, str(artifact_dir))
            for member in self.members:
                member._send([], {})
                self.client.set_terminated(member.run_id, "FINISHED", end_time=end_time)
            self.client.set_terminated(self.run_id, "FINISHED", end_time=end_time)
        if not self._guard("the run's result", send):
            raise TrackingLost(f"tracking store {redact(self.uri)} failed a request ({self.lost})")

    def end(self, status: str, reason: str, message: str = "") -> bool:
        """End the run and its members as ``status`` (with ``rankexp.end_reason``, ``error``);
        False if it could not."""
        if self.run_id is None:
            return False
        for member in self.members:
            member.end(status, reason, message)
        tags = {TAG_REASON: reason, **({"error": message[:5000]} if message else {})}
        try:
            try:
                self._send([], tags)
            except Exception:  # a refused param (sent no more): the end tags alone
                with contextlib.suppress(Exception):
                    self._send([], tags)
            self.client.set_terminated(self.run_id, status)
        except Exception as e:
            log.error("could not close run %s as %s (%s)", self.run_id, status, _first_line(e))
            return False
        return True


def Journal(path: Path | None) -> RunLogger:  # noqa: N802 — a run object, like RunLogger
    """The run object of a job without a store: its journal only."""
    return RunLogger(None, None, "", {}, {}, path)


def _journal_lines(path: Path) -> Iterator[dict[str, Any]]:
    if Path(path).exists():
        for line in Path(path).read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):  # a line cut short by a kill
                yield json.loads(line)


def read_journal(path: Path) -> list[tuple[int, list[list]]]:
    """``[(ms, points), …]``: the run's own points of a journal file."""
    return [(int(d["t"]), d["points"]) for d in _journal_lines(path) if "points" in d and "member" not in d]


def read_member_journal(path: Path) -> tuple[list[float], list[tuple[int, int, list[list]]]]:
    """``(lrs, [(ms, member index, points), …])`` of a journal file."""
    lrs, points = [], []
    for d in _journal_lines(path):
        if "members" in d:
            lrs = [float(x) for x in d["members"]]
        elif "member" in d and int(d["member"]) < len(lrs):
            points.append((int(d["t"]), int(d["member"]), d["points"]))
    return lrs, points


def finished_runs(uri: str, experiment_id: str, hashes: Iterable[str]) -> dict[str, Any]:
    """``{config hash: its newest FINISHED run}`` of the ``hashes`` that have one in the
    experiment: one indexed query per hash (MLflow's filter has no IN or OR on tags), never a
    read of the whole experiment."""
    client, out = _client(uri), {}
    for h in dict.fromkeys(hashes):
        runs = client.search_runs([experiment_id], max_results=1, filter_string=(
            f"tags.config_hash = '{h}' and attributes.status = 'FINISHED'"))
        out.update({h: runs[0]} if runs else {})
    return out


def find_finished(uri: str, experiment_id: str, config_hash: str, legacy: str = "") -> str | None:
    """Id of a FINISHED run of ``config_hash`` in the experiment, or ``None``.  A run logged
    under the config's ``legacy`` hash (:func:`rankexp.config.config_hash`) counts: it is
    re-tagged ``config_hash`` (the old value kept as ``rankexp.legacy_hash``)."""
    from mlflow.entities import RunTag
    for h in dict.fromkeys(h for h in (config_hash, legacy) if h):
        run = finished_runs(uri, experiment_id, [h]).get(h)
        if run:
            if h != config_hash:
                _client(uri).log_batch(run.info.run_id, tags=[
                    RunTag("config_hash", config_hash), RunTag(TAG_LEGACY_HASH, h)])
            return run.info.run_id
    return None


def expired(run, stale_after_s: float) -> tuple[str, str] | None:
    """``(reason, message)`` when the owner of RUNNING ``run`` is gone — its process no longer
    runs on this host, or its heartbeat is older than ``stale_after_s`` — else ``None``."""
    t = run.data.tags
    host, pid = t.get(TAG_HOST), t.get(TAG_PID, "")
    if host == socket.gethostname() and pid.isdigit():
        started = _pid_start(int(pid))
        if started is not None and started == (t.get(TAG_PID_START) or started):
            return None
        return "owner_gone", f"process {pid} on {host} ended without closing the run"
    age = time.time() - float(t.get(TAG_HEARTBEAT) or run.info.start_time / 1000)
    if age > stale_after_s:
        return "heartbeat_lost", f"no heartbeat from {host}:{pid} for {age:.0f} s"
    return None


def close_run(client, run_id: str, status: str, reason: str, message: str = "",
              params: dict[str, Any] | None = None, members: bool = True) -> bool:
    """End a run that will not finish (``rankexp.end_reason``, ``error``, the ``params`` its
    owner never sent), with its member runs; False if its owner hid it meanwhile (a claimant
    that stood down, a superseded attempt: the store refuses to touch a deleted run)."""
    from mlflow.entities import Param, RunTag
    tags = [RunTag(TAG_REASON, reason)] + ([RunTag("error", message[:5000])] if message else [])
    try:
        client.log_batch(run_id, tags=tags, params=[Param(k, _param(v)) for k, v in sorted(
            (params or {}).items())])
        client.set_terminated(run_id, status)
    except Exception:
        if client.get_run(run_id).info.lifecycle_stage == "deleted":
            return False
        raise
    if members:
        exp = client.get_run(run_id).info.experiment_id
        for m in client.search_runs([exp], max_results=10_000, filter_string=(
                f"tags.mlflow.parentRunId = '{run_id}' and tags.`{TAG_ROLE}` = '{ROLE_MEMBER}' "
                "and attributes.status = 'RUNNING'")):
            close_run(client, m.info.run_id, status, reason, message, members=False)
    return True


def reconcile(uri: str, experiment_id: str, stale_after_s: float,
              parent_id: str | None = None) -> dict[str, tuple[str, str]]:
    """Close KILLED the RUNNING runs of the experiment (or sweep ``parent_id``) whose owner is
    gone (:func:`expired`), and members whose training run has ended; a sweep parent gets its
    job counts.  Returns ``{run_id: (status, reason)}``."""
    client = _client(uri)
    filt = "attributes.status = 'RUNNING'" + (f" and tags.mlflow.parentRunId = '{parent_id}'"
                                              if parent_id else "")
    closed: dict[str, tuple[str, str]] = {}
    runs = client.search_runs([experiment_id], filter_string=filt, max_results=10_000)
    for r in sorted(runs, key=lambda r: r.data.tags.get(TAG_ROLE) == ROLE_MEMBER):  # members last
        tags, status = r.data.tags, "KILLED"
        if tags.get(TAG_ROLE) == ROLE_MEMBER:
            if tags.get("mlflow.parentRunId") in closed:
                continue  # closed with its training run
            owner = client.get_run(tags["mlflow.parentRunId"])
            if owner.info.status == "RUNNING":
                continue
            status = owner.info.status if owner.info.status in ("FAILED", "KILLED") else "KILLED"
            verdict = (owner.data.tags.get(TAG_REASON) or "orphaned",
                       f"its training run ended {owner.info.status}")
        elif (verdict := expired(r, stale_after_s)) is None:
            continue
        if tags.get(TAG_ROLE) == "sweep":
            log_counts(client, r.info.run_id, jobdir.count_jobs(jobdir.planned_job_dirs(tags.get("sweep_id"))))
        params = {} if r.data.params or not tags.get("job_dir") else (
            jobdir.read_json(Path(tags["job_dir"]) / jobdir.RUN_FILE) or {}).get("params")
        if not close_run(client, r.info.run_id, status, *verdict, params=params):
            continue
        closed[r.info.run_id] = (status, verdict[0])
        log.warning("closed stale run %s (%s) as %s: %s", r.info.run_id, r.info.run_name, status,
                    verdict[1])
    return closed


def supersede(uri: str, old_run_id: str, new_run_id: str, finished: bool = False) -> None:
    """``new_run_id`` is a later attempt of ``old_run_id``'s job (a requeue) or, ``finished``,
    its forced rerun, FINISHED: the old run (FINISHED only if ``finished``) is closed KILLED
    ``superseded`` if RUNNING, tagged ``rankexp.superseded_by`` and soft-deleted with its
    members (resume and the analysis read live runs only)."""
    client = _client(uri)
    old = client.get_run(old_run_id)
    if old.info.status == "FINISHED" and not finished or old.info.lifecycle_stage == "deleted":
        return
    if old.info.status == "RUNNING":
        close_run(client, old_run_id, "KILLED", "superseded", f"superseded by run {new_run_id}")
    client.set_tag(old_run_id, "rankexp.superseded_by", new_run_id)
    for m in client.search_runs([old.info.experiment_id], max_results=10_000,
                                filter_string=f"tags.mlflow.parentRunId = '{old_run_id}'"):
        client.delete_run(m.info.run_id)
    client.delete_run(old_run_id)


def supersede_finished(uri: str, experiment_id: str, config_hash: str, run_id: str) -> list[str]:
    """The forced rerun ``run_id`` has FINISHED: the config's other FINISHED runs are
    superseded (:func:`supersede`); returns their ids."""
    old = [r.info.run_id for r in _client(uri).search_runs([experiment_id], max_results=1000,
           filter_string=f"tags.config_hash = '{config_hash}' and attributes.status = 'FINISHED'")
           if r.info.run_id != run_id]
    for old_run_id in old:
        supersede(uri, old_run_id, run_id, finished=True)
    return old


@dataclass
class Claim:
    """:func:`claim`'s verdict: ``won``, or the ``holder`` run, its ``status``, ``where``."""

    won: bool
    holder: str | None = None
    status: str | None = None
    where: str = ""


#: how long a claimant waits for a rival run that exists but has not stamped its claim yet
CLAIM_PENDING_S = 30.0


def claim(uri: str, experiment_id: str, config_hash: str, run_id: str, stale_after_s: float,
          finished_counts: bool = True, ignore: Iterable[str] = ()) -> Claim:
    """Claim ``config_hash`` for the just-created run ``run_id``: stamp ``rankexp.claim_time``
    (Unix ms, once the run is visible), then query the config's runs.  A FINISHED one holds it
    (if ``finished_counts``); else the earliest stamp among live RUNNING runs wins (ties: the
    smaller id).  A rival whose owner is gone is closed KILLED; one not stamped yet is waited
    for (≤ :data:`CLAIM_PENDING_S`); one not seen at all stamps later.  ``ignore``: no rivals
    (the earlier attempt of this very job)."""
    client = _client(uri)
    stamp = client.get_run(run_id).data.tags.get(TAG_CLAIM)
    if stamp is None:
        stamp = str(time.time_ns() // 1_000_000)
        client.set_tag(run_id, TAG_CLAIM, stamp)
    mine, skip = (int(stamp), run_id), {run_id, *ignore}
    deadline = time.monotonic() + CLAIM_PENDING_S
    while True:
        runs = [r for r in client.search_runs([experiment_id], max_results=1000, filter_string=(
            f"tags.config_hash = '{config_hash}'")) if r.info.run_id not in skip]
        done = [r for r in runs if r.info.status == "FINISHED"]
        if finished_counts and done:
            return Claim(False, done[0].info.run_id, "FINISHED", _describe(done[0]))
        live = []
        for r in (r for r in runs if r.info.status == "RUNNING"):
            verdict = expired(r, stale_after_s)
            if verdict is None:
                live.append(r)
            elif close_run(client, r.info.run_id, "KILLED", *verdict):
                log.warning("took over the claim of run %s, closed KILLED: %s", r.info.run_id, verdict[1])
        if any(TAG_CLAIM not in r.data.tags for r in live) and time.monotonic() < deadline:
            time.sleep(0.1)
            continue
        first = min(live, key=_claim_order, default=None)
        if first is None or mine <= _claim_order(first):
            return Claim(True)
        return Claim(False, first.info.run_id, "RUNNING", _describe(first))


def _claim_order(r) -> tuple[int, str]:
    tag = r.data.tags.get(TAG_CLAIM, "")
    return (int(tag) if tag.isdigit() else int(r.info.start_time or 0)), r.info.run_id


def _describe(r) -> str:
    t = r.data.tags
    owner = f"{t.get(TAG_HOST, '?')}:{t.get(TAG_PID, '?')}" + (
        f", Slurm job {t[TAG_SLURM]}" if t.get(TAG_SLURM) else "")
    return f"run {r.info.run_id} ({r.info.run_name}) of {t.get('sweep_id') or 'no sweep'}, owner {owner}"


def stand_down(uri: str, run_id: str, held: Claim) -> None:
    """The run of a claimant that lost: KILLED ``stood_down`` and soft-deleted."""
    from mlflow.entities import RunTag
    client = _client(uri)
    client.log_batch(run_id, tags=[RunTag("rankexp.stood_down_for", held.holder or ""),
                                   RunTag(TAG_REASON, "stood_down"),
                                   RunTag("error", f"config held by {held.where} ({held.status})")])
    client.set_terminated(run_id, "KILLED")
    client.delete_run(run_id)


@contextlib.contextmanager
def Heartbeat(uri: str, run_id: str, every_s: float) -> Iterator[None]:  # noqa: N802 — a context
    """While inside, a thread refreshes the run's ``rankexp.heartbeat`` every ``every_s`` s."""
    stop = threading.Event()

    def beat() -> None:
        client = _client(uri)
        while not stop.wait(every_s):
            with contextlib.suppress(Exception):
                client.set_tag(run_id, TAG_HEARTBEAT, str(int(time.time())))
    threading.Thread(target=beat, daemon=True, name="rankexp-heartbeat").start()
    try:
        yield
    finally:
        stop.set()


def log_counts(client, run_id: str, counts: Counter, seconds: float | None = None) -> None:
    """A sweep parent's ``jobs_<outcome>``, ``jobs_total`` (and ``sweep_seconds``) metrics."""
    from mlflow.entities import Metric
    metrics = {f"jobs_{k}": v for k, v in counts.items()} | {"jobs_total": sum(counts.values())}
    metrics |= {"sweep_seconds": seconds} if seconds is not None else {}
    client.log_batch(run_id, metrics=[Metric(k, v, int(time.time() * 1000), 0) for k, v in metrics.items()])


class SweepRun:
    """The parent run of one multirun (``rankexp.role=sweep``), closed with every job's outcome."""

    def __init__(self, uri: str, experiment: str, sweep_dir: Path, job_dirs: list[Path],
                 overrides: str, heartbeat_s: float, stale_after_s: float, name: str | None = None,
                 note: str = "", tags: dict[str, str] | None = None, description: str | None = None):
        self.uri, self.experiment, self.sweep_dir = uri, experiment, Path(sweep_dir).resolve()
        self.name, self.note, self.user_tags = name or f"sweep·{self.sweep_dir.name}", note, dict(tags or {})
        self.description, self.job_dirs, self.overrides = description, list(job_dirs), overrides
        self.heartbeat_s, self.stale_after_s = heartbeat_s, stale_after_s
        self.client, self.experiment_id, self.run_id = _client(uri), None, None
        self._heartbeat = contextlib.ExitStack()
        self.t0 = time.time()

    def open(self) -> None:
        """Prepare the experiment, close its dead runs, create the parent run and record it in
        the sweep directory (:data:`~rankexp.jobdir.PARENT_FILE`) for the jobs."""
        self.experiment_id = prepare_experiment(self.uri, self.experiment, self.description)
        reconcile(self.uri, self.experiment_id, self.stale_after_s)
        tags = {**self.user_tags, "sweep_id": str(self.sweep_dir), TAG_ROLE: "sweep",
                "overrides": redact(self.overrides), "git_commit": git_commit(),
                "jobs_total": str(len(self.job_dirs)), **owner_tags(), **system_tags(),
                **({TAG_NOTE: redact(self.note)} if self.note else {})}
        self.run_id = self.client.create_run(self.experiment_id, run_name=self.name, tags=tags).info.run_id
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        jobdir.write_json(self.sweep_dir / jobdir.PARENT_FILE, {
            "uri": redact(self.uri), "experiment": self.experiment, "experiment_id": self.experiment_id,
            "run_id": self.run_id, "sweep_id": str(self.sweep_dir)})
        self._heartbeat.enter_context(Heartbeat(self.uri, self.run_id, self.heartbeat_s))
        log.info("MLflow: %s, experiment %r (id %s), sweep run %s; runs: %s", redact(self.uri),
                 self.experiment, self.experiment_id, self.run_id,
                 ui_link(self.uri, self.experiment_id))

    def close(self, interrupted: str | None = None, grace_s: float = 10.0) -> tuple[str, Counter]:
        """Close the dead children (an interrupted sweep waits ``grace_s`` for live ones), count
        the jobs and end the parent: KILLED if interrupted, FAILED if a job failed, was killed or
        did not run, else FINISHED."""
        self._heartbeat.close()
        closed: dict[str, tuple[str, str]] = {}
        end = time.monotonic() + (grace_s if interrupted else 0)
        try:
            while True:
                closed |= reconcile(self.uri, self.experiment_id, self.stale_after_s, self.run_id)
                running = self.client.search_runs([self.experiment_id], max_results=1, filter_string=(
                    f"tags.mlflow.parentRunId = '{self.run_id}' and attributes.status = 'RUNNING'"))
                if not running or time.monotonic() >= end:
                    break
                time.sleep(0.5)
        except Exception as e:
            log.error("could not check the sweep's runs in %s (%s)", redact(self.uri), _first_line(e))
        counts = jobdir.count_jobs(self.job_dirs, {r: s for r, (s, _) in closed.items()})
        status = "KILLED" if interrupted else (
            "FAILED" if counts["failed"] or counts["killed"] or counts["not_run"] else "FINISHED")
        message = jobdir.summary(counts) + (f"; interrupted by {interrupted}: rerun the same command "
                                            "to resume (FINISHED configs are skipped)" if interrupted else "")
        log.info("sweep %s: %s", self.sweep_dir, message)
        try:
            log_counts(self.client, self.run_id, counts, time.time() - self.t0)
            if status == "FINISHED":
                self.client.set_terminated(self.run_id, "FINISHED")
            else:
                close_run(self.client, self.run_id, status, interrupted or "jobs_failed", message, members=False)
        except Exception as e:
            log.error("could not close the sweep run %s in %s (%s); `python -m rankexp.sync %s` "
                      "closes it once the store answers", self.run_id, redact(self.uri),
                      _first_line(e), self.sweep_dir)
        return status, counts


def attach_files(uri: str, run_ids: Sequence[str], paths: Sequence[Path], folder: str = FIGURES_DIR) -> int:
    """Log ``paths`` as artifacts of each run of ``run_ids`` under ``folder``; returns how many."""
    client = _client(uri)
    for run_id in dict.fromkeys(run_ids):
        for p in paths:
            client.log_artifact(run_id, str(p), folder)
    return len(dict.fromkeys(run_ids)) * len(paths)


def active_run_sink(required: bool, who: str = "rankexp") -> Sink | None:
    """``log(metrics, step)`` into the active MLflow run; without one ``None`` (RuntimeError
    naming ``who`` when ``required``)."""
    import mlflow
    if mlflow.active_run() is None:
        if required:
            raise RuntimeError(f"{who}: no active MLflow run (wrap training in `with mlflow.start_run():`)")
        return None

    return lambda metrics, step: mlflow.log_metrics(dict(metrics), step=step)


def log_active_text(text: str, artifact_file: str) -> None:
    """``text`` as the artifact ``artifact_file`` of the active MLflow run."""
    import mlflow
    mlflow.log_text(text, artifact_file)
