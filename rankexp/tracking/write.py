"""The write path of one job: :class:`RunLogger` (an MLflow run in as few requests as MLflow
allows), the metric-point :class:`Journal` that :mod:`rankexp.sync` replays, and
:func:`metric_key`, the one mapping from a quantity to an MLflow metric name."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import posixpath
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .schema import (
    FIGURES_DIR,
    MAX_ENTITIES,
    MAX_METRICS,
    MAX_PARAMS,
    MAX_TAGS,
    RESERVED_TAG_PREFIXES,
    ROLE_MEMBER,
    RUN_TAGS,
    SEED_STD_PREFIX,
    TAG_ATTEMPT,
    TAG_CLAIM,
    TAG_HEARTBEAT,
    TAG_HOST,
    TAG_LR,
    TAG_PID,
    TAG_PID_START,
    TAG_REASON,
    TAG_ROLE,
    TAG_SLURM,
    TrackingError,
    _param_value,
)
from .store import _client, _first_line, is_outage, redact

log = logging.getLogger(__name__)


class Journal:
    """Metric points a task logs while it runs (training curves), appended to the job
    directory's ``metrics.jsonl`` — what :mod:`rankexp.sync` replays when the store was
    unreachable.  Same ``log_metrics`` and ``log_member_series`` as :class:`RunLogger`, so a
    task cannot tell them apart.

    Lines: ``{"t": ms, "points": [[key, step, value], …]}`` (the run's own points),
    ``{"t": ms, "members": [lr, …]}`` (:meth:`open_members`) and ``{"t": ms, "member": i,
    "points": […]}`` (member ``i``'s points, :meth:`log_member_series`)."""

    def __init__(self, path: Path | None):
        self.path = path
        self.member_lrs: list[float] = []

    def _write(self, doc: dict[str, Any]) -> None:
        if self.path is not None:
            with open(self.path, "a") as fh:
                fh.write(json.dumps({"t": int(time.time() * 1000), **doc}) + "\n")

    def log_metrics(self, scalars: dict[str, float], series: dict[str, tuple[Any, Any]] | None = None) -> int:
        points = _points(scalars, series)
        if points:
            self._write({"points": points})
        return len(points)

    def open_members(self, lrs: Sequence[float]) -> None:
        """The learning-rate members of a batched training run, in the model's member order:
        each gets its own run (:class:`RunLogger`); here, the journal's ``members`` line."""
        self.member_lrs = [float(lr) for lr in lrs]
        self._write({"members": self.member_lrs})

    def log_member_series(self, steps: int | Sequence[int],
                          metrics: Mapping[str, Any]) -> int:
        """Log per-member values under plain names (``train_loss``, ``test_acc``, …) to each
        member's run — the one path of every per-learning-rate quantity a task logs.

        Args:
            steps: one step (train step / epoch; 0 for a final scalar), or ``k`` steps.
            metrics: ``{name: values}``, values of shape ``(members,)`` for one step,
                ``(k, members)`` for ``k`` steps (member order of :meth:`open_members`).

        Returns the number of points (over all members).

        Raises:
            ValueError: no :meth:`open_members` yet, or values of another shape.
        """
        per_member = _member_points(steps, metrics, len(self.member_lrs))
        for i, points in enumerate(per_member):
            if points:
                self._write({"member": i, "points": points})
        return sum(map(len, per_member))

    def system_metrics(self, every_s: float | None = None) -> contextlib.AbstractContextManager:
        """:meth:`RunLogger.system_metrics`; nothing here (no run to log to)."""
        return contextlib.nullcontext()

    def log_dataset(self, name: str, sha256: str, source: str, profile: dict[str, Any],
                    context: str = "train") -> bool:
        """A data set the job reads (:meth:`RunLogger.log_dataset`); not journalled — a run
        logged later by :mod:`rankexp.sync` has no dataset input.  Returns False."""
        return False


#: what MLflow allows in a metric or tag name (mlflow.utils.validation): word characters
#: (unicode letters and digits, ``_``), ``-``, ``.``, `` ``, ``:`` and ``/``
_ILLEGAL_KEY_CHARS = re.compile(r"[^\w\-. :/]")
MAX_KEY_LENGTH = 250  # MLflow's limit on metric and tag names
#: seconds between two samples of a training run's system metrics (:meth:`RunLogger.system_metrics`)
SYSTEM_METRICS_S = 10.0
#: hex digits of a data set's SHA-256 in its MLflow dataset digest (MLflow keeps ≤ 36 characters)
DATASET_DIGEST_CHARS = 32


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


def user_tag_problem(key: str) -> str | None:
    """Why ``key`` cannot be a tag of ``tracking.tags``, or ``None``: it must be a name MLflow
    accepts unchanged (:func:`metric_key`'s rule: letters, digits, ``_ - . : /`` and blanks,
    at most 250 characters) that rankexp does not write itself (:data:`RUN_TAGS`, or a
    ``mlflow.``, ``rankexp.`` or ``seed_std.`` name)."""
    if not key or metric_key(key) != key:
        return (f"is not a tag name MLflow accepts (letters, digits, '_-.:/ ', at most "
                f"{MAX_KEY_LENGTH} characters; e.g. {metric_key(key or '_')!r})")
    if key in RUN_TAGS or key.startswith(RESERVED_TAG_PREFIXES):
        return ("is a tag rankexp writes itself (config_hash, sweep_id, mlflow.*, rankexp.*, …): "
                "choose another name")
    return None


def log_now(client, run_id: str, *, metrics: dict[str, float] | None = None,
            tags: dict[str, str] | None = None) -> None:
    """Log ``metrics`` (at step 0, now) and ``tags`` to run ``run_id`` in one request — for
    writers outside a :class:`RunLogger` (a detached sweep's jobs updating their parent)."""
    from mlflow.entities import Metric, RunTag

    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(metric_key(k), float(v), now, 0)
                                      for k, v in (metrics or {}).items()],
                     tags=[RunTag(k, str(v)) for k, v in (tags or {}).items()])


def _member_points(steps: int | Sequence[int], metrics: Mapping[str, Any],
                   members: int) -> list[list[list]]:
    """``[[[key, step, value], …] of member 0, …]`` (:meth:`Journal.log_member_series`)."""
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
            raise ValueError(f"{name}: values of shape {np.shape(values)} for {at.size} step(s) "
                             f"of {members} members (want {'(members,)' if one else '(steps, members)'})")
        key = metric_key(name)
        for i in range(members):
            out[i] += [[key, int(s), float(x)] for s, x in zip(at, v[:, i], strict=True)]
    return out


#: the tags of a training run its members do not inherit: what identifies the job (its config
#: hash, job directory, owner, claim: a member is no job and no claimant) and its parent
_JOB_ONLY_TAGS = ("config_hash", "job_dir", TAG_HOST, TAG_PID, TAG_PID_START, TAG_HEARTBEAT,
                  TAG_ATTEMPT, TAG_SLURM, TAG_CLAIM, "mlflow.parentRunId")


def member_tags(tags: Mapping[str, str], run_id: str, lr: float) -> dict[str, str]:
    """The tags of the member run at ``lr`` of training run ``run_id`` (whose tags are
    ``tags``): those of :data:`_JOB_ONLY_TAGS` dropped, ``mlflow.parentRunId`` = the training
    run, ``rankexp.role=member``, ``rankexp.lr`` = ``f"{lr:g}"`` (the ``lr<k>`` of the training
    run's ``…_lr<k>`` names)."""
    return {**{k: v for k, v in tags.items() if k not in _JOB_ONLY_TAGS},
            "mlflow.parentRunId": run_id, TAG_ROLE: ROLE_MEMBER, TAG_LR: f"{lr:g}"}


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


def _journal_lines(path: Path) -> Iterator[dict[str, Any]]:
    if path.exists():
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):  # a line cut short by a kill
                yield json.loads(line)


def read_journal(path: Path) -> list[tuple[int, list[list]]]:
    """``[(timestamp_ms, [[key, step, value], …]), …]``: the run's own points of a
    :class:`Journal` file (its members' are :func:`read_member_journal`'s)."""
    return [(int(d["t"]), d["points"]) for d in _journal_lines(path)
            if "points" in d and "member" not in d]


def read_member_journal(path: Path) -> tuple[list[float], list[tuple[int, int, list[list]]]]:
    """``(lrs, [(timestamp_ms, member index, points), …])``: the members a :class:`Journal`
    file declared (the last ``members`` line; ``[]`` for none) and their points."""
    lrs: list[float] = []
    points = []
    for d in _journal_lines(path):
        if "members" in d:
            lrs = [float(x) for x in d["members"]]
        elif "member" in d and int(d["member"]) < len(lrs):
            points.append((int(d["t"]), int(d["member"]), d["points"]))
    return lrs, points


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

    A batched training run's learning-rate members (:meth:`open_members`) are runs of their
    own, nested under this one, sharing its client and failure state: their points go through
    :meth:`log_member_series` (journalled too), and they end with this run — FINISHED in
    :meth:`finish` (just before it), FAILED or KILLED in :meth:`end`.
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
        self.members: list[RunLogger] = []

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

    def open_members(self, lrs: Sequence[float]) -> None:
        """Create one run per learning rate, nested under this one (:func:`member_tags`), named
        ``<run name>·lr1e-3`` (:func:`rankexp.naming.member_name`), with this run's params and
        ``lr`` (sent with each member's first points).  Best effort like :meth:`log_metrics`:
        a failure stops this run's logging (:meth:`finish` raises)."""
        from ..naming import member_name

        super().open_members(lrs)
        if self.run_id is None or self.lost is not None or self.refused is not None:
            return
        try:
            for lr in self.member_lrs:
                member = RunLogger(self.uri, self.experiment_id, member_name(self.run_name, lr),
                                   {**self.params, "lr": lr}, member_tags(self.tags, self.run_id, lr))
                member.client = self.client
                member.start()
                self.members.append(member)
        except Exception as e:
            what = self._failure(e)
            log.error("tracking store %s %s creating the learning-rate runs (%s); the job goes on",
                      redact(self.uri), what, self.lost or self.refused)

    def log_member_series(self, steps: int | Sequence[int], metrics: Mapping[str, Any]) -> int:
        """:meth:`Journal.log_member_series`, journalled and sent to each member's run."""
        n = super().log_member_series(steps, metrics)
        self._send_members(_member_points(steps, metrics, len(self.member_lrs)))
        return n

    def _send_members(self, per_member: list[list[list]], timestamp: int | None = None) -> None:
        """Member ``i``'s points ``per_member[i]`` to its run (one ``log_batch`` per member)."""
        if self.lost is not None or self.refused is not None or len(self.members) != len(per_member):
            return
        try:
            for member, points in zip(self.members, per_member, strict=True):
                if points:
                    member._send(points, {}, timestamp)
        except Exception as e:
            what = self._failure(e)
            log.error("tracking store %s %s (%s); the job goes on, its points go to %s",
                      redact(self.uri), what, self.lost or self.refused, self.path)

    def log_dataset(self, name: str, sha256: str, source: str, profile: dict[str, Any],
                    context: str = "train") -> bool:
        """Log a data set the job reads as the run's MLflow dataset input (the UI's Dataset
        column; ``mlflow.data.context`` = ``context``): ``digest`` = the first
        :data:`DATASET_DIGEST_CHARS` hex digits of its ``sha256`` (MLflow stores at most 36
        characters), the whole SHA-256 in the ``profile`` JSON beside ``profile``'s fields;
        ``source`` (a path or URI) as a local source.  Best effort, like :meth:`log_metrics`:
        returns whether the store took it (a refusal of the input alone does not fail the run)."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        if self.lost is not None or self.refused is not None or self.run_id is None:
            return False
        dataset = Dataset(name=name, digest=sha256[:DATASET_DIGEST_CHARS], source_type="local",
                          source=json.dumps({"uri": str(source)}),
                          profile=json.dumps({**profile, "sha256": sha256}))
        try:
            self.client.log_inputs(self.run_id, [DatasetInput(
                dataset, tags=[InputTag("mlflow.data.context", context)])])
        except Exception as e:  # an outage stops the run's logging; a refusal only this input
            if is_outage(e):
                self._failure(e)
            log.error("tracking store %s did not take the dataset input %s (%s); the job goes on",
                      redact(self.uri), name, _first_line(e))
            return False
        return True

    @contextlib.contextmanager
    def system_metrics(self, every_s: float | None = None) -> Iterator[None]:
        """MLflow's own system metrics for the run while inside (MLflow's
        ``SystemMetricsMonitor``, what ``log_system_metrics=True`` starts): CPU utilisation,
        system memory, disk and network as ``system/…`` metrics every ``every_s`` seconds
        (default :data:`SYSTEM_METRICS_S`; MLflow's ``MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL``
        wins), GPU memory and utilisation too where ``nvidia-ml-py`` is installed.  A sampler
        thread that asks the store once per sample; failures only cost the samples."""
        if self.run_id is None or self.lost is not None or self.refused is not None:
            yield
            return
        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            monitor = SystemMetricsMonitor(self.run_id, sampling_interval=every_s or SYSTEM_METRICS_S,
                                           tracking_uri=self.uri)
            monitor.start()
        except Exception as e:  # psutil missing, an outage: the job goes on without them
            log.warning("no system metrics for run %s (%s)", self.run_id, _first_line(e))
            monitor = None
        try:
            yield
        finally:
            if monitor is not None:
                monitor.finish()

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
                for member in self.members:  # FINISHED before their training run is
                    member._send([], {})
                    self.client.set_terminated(member.run_id, "FINISHED", end_time=end_time)
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
        """End the run (its members first) as ``status`` with its reason; best effort (False if
        the store is gone)."""
        from mlflow.entities import RunTag

        if self.run_id is None or self.lost is not None:
            return False
        for member in self.members:
            member.end(status, reason, message)
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


def attach_files(uri: str, run_ids: Sequence[str], paths: Sequence[Path],
                 folder: str = FIGURES_DIR) -> int:
    """Log the files ``paths`` as artifacts of each run of ``run_ids`` under ``folder`` (a
    figure's PNG, PDF, CSV, markdown: :func:`analysis.core.style.save` attaches them to the
    sweep parents of the runs drawn).  One ``log_artifact`` per file and run; returns how many.

    Raises:
        Exception: whatever the store or artifact repository raised (the caller warns).
    """
    client = _client(uri)
    n = 0
    for run_id in dict.fromkeys(run_ids):
        for p in paths:
            client.log_artifact(run_id, str(p), folder)
            n += 1
    return n
