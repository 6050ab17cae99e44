"""The store: which URI, whether it can be used (:func:`check_store`), its HTTP and database
bounds, the experiment's creation under a file lock, and error messages naming the store."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path

from .schema import TAG_NOTE, TrackingError

log = logging.getLogger(__name__)


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
            if db is not None and not db.exists():
                new_store(db)
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


def _revision(db: Path) -> str | None:
    """The schema revision an SQLite store records (its alembic ``version_num``), or None."""
    import sqlite3

    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:
            row = c.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error:
        return None
    return row[0] if row else None


def store_template() -> Path | None:
    """This MLflow's empty SQLite store: MLflow's whole schema (its tables, then every alembic
    migration: ``mlflow.store.db.utils._initialize_tables``, what MLflow runs on a new store)
    and no experiment — MLflow adds its Default experiment, with its artifact root, when it
    first opens a copy.  Made once per MLflow version and schema revision into
    :func:`rankexp.locations.user_cache` ``mlflow-stores/mlflow-<version>-<revision>.db``
    (written beside it, then renamed: a reader sees the whole file or none; two processes
    making it at once both succeed).  The migrations take 1.1 s on this machine (68 alembic
    scripts), a copy milliseconds.

    Returns:
        The template's path, or None if it cannot be made (no writable cache folder, an
        MLflow that fails to build it): the store is then created by MLflow itself.
    """
    from mlflow.store.db import utils as db_utils
    from mlflow.version import VERSION

    from ..locations import atomic_path, user_cache

    head = db_utils._get_latest_schema_revision()
    path = user_cache("mlflow-stores", f"mlflow-{VERSION}-{head}.db")
    if path.is_file() and _revision(path) == head:
        return path
    try:
        with atomic_path(path) as tmp:
            _create_schema(tmp, db_utils)
            if _revision(Path(tmp)) != head:
                raise TrackingError(f"the new schema records revision {_revision(Path(tmp))}, not {head}")
    except Exception as e:  # no cache folder, a full disk, an MLflow that cannot build it
        log.debug("no MLflow store template in %s (%s): MLflow creates the store", path.parent, e)
        return None
    return path


def _create_schema(db: str, db_utils) -> None:
    import sqlalchemy

    engine = sqlalchemy.create_engine(f"sqlite:///{db}")
    try:
        db_utils._initialize_tables(engine)
        db_utils._verify_schema(engine)
    finally:
        engine.dispose()


def new_store(db: Path) -> bool:
    """Create the SQLite store ``db`` (which does not exist) as a copy of
    :func:`store_template`, instead of MLflow running its migrations in this process: copied
    beside ``db``, then hard-linked to its name, so the store appears whole and never replaces
    one that appeared meanwhile.  Called under the store lock (:func:`check_store`).

    Returns:
        Whether ``db`` exists now; False (nothing created) if there is no template or the
        folder refuses the copy or the link — MLflow then creates the store as before.
    """
    import secrets
    import shutil

    template = store_template()
    if template is None:
        return False
    tmp = db.with_name(f".{db.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(template, "rb") as src, open(tmp, "xb") as dst:  # mode 0666 & ~umask, as MLflow's
            shutil.copyfileobj(src, dst)
        with contextlib.suppress(FileExistsError):  # a store another program made meanwhile stays
            os.link(tmp, db)
    except OSError as e:  # a file system without hard links, a full disk: MLflow creates it
        log.debug("store %s not created from the template (%s): MLflow creates it", db, e)
        return False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return True


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


def describe_experiment(uri: str, experiment_id: str, text: str) -> None:
    """Make ``text`` the experiment's description (its ``mlflow.note.content`` tag, which the
    MLflow UI shows above the experiment's runs, as Markdown), unless it already reads so."""
    client = _client(uri)
    if client.get_experiment(experiment_id).tags.get(TAG_NOTE) != text:
        client.set_experiment_tag(experiment_id, TAG_NOTE, text)
