"""The only package that talks to MLflow (design.md §5).

Its modules, one seam each (every public name is re-exported here, so ``tracking.X`` and
``from rankexp.tracking import X`` are the one way callers reach them):
:mod:`~rankexp.tracking.schema` (file and tag names, limits, :class:`TrackingError`),
:mod:`~rankexp.tracking.store` (store checks), :mod:`~rankexp.tracking.provenance` (git, command
line, source tags), :mod:`~rankexp.tracking.ownership` (owners, reconcile, claims),
:mod:`~rankexp.tracking.write` (the write path: :class:`RunLogger`, the journal),
:mod:`~rankexp.tracking.jobdir` (job-directory records and counts),
:mod:`~rankexp.tracking.sweep` (the sweep's parent run), :mod:`~rankexp.tracking.read` (the
read path for the analysis) and :mod:`~rankexp.tracking.active` (a user's own active run, for
:class:`rankexp.SpectralMonitor`).

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
  uploaded in one ``log_artifacts``;
* the user's: ``tracking.run_name`` (a single run's name, or a sweep parent's),
  ``tracking.tags`` (on every run), ``tracking.note`` (``mlflow.note.content``: the runs'
  description, above the command line on a sweep's parent) and ``tracking.description`` (the
  experiment's ``mlflow.note.content`` tag);
* a training run's learning rates: one *member* run each, nested under it
  (``mlflow.parentRunId`` = the training run), named ``<run name>·lr1e-3``, tagged
  ``rankexp.role=member`` and ``rankexp.lr`` (``f"{lr:g}"``, the ``<k>`` of the training run's
  ``…_lr<k>`` names), with the config's params plus ``lr`` and no ``config_hash`` (no claimant,
  no job); its series under plain names (``train_loss``, ``train_error``, ``test_acc``,
  ``test_error``, and any other per-member quantity: :meth:`RunLogger.log_member_series`, the
  one path) and its finals (``final_test_acc``, …; step 0).  The training run keeps the
  config's summary and its per-LR finals ``final_test_acc_lr<k>``, …; its members end with it
  (:meth:`RunLogger.finish` / :meth:`RunLogger.end`, :func:`close_run`, :func:`reconcile` for
  an orphan, :func:`supersede` deletes them with it); :func:`runs_table` leaves them out and
  lists them in ``attrs[MEMBERS_ATTR]``;
* a sweep's parent run also holds, under ``figures/``, every figure and table the analysis
  drew from its runs (:func:`attach_files`);
* a training run's inputs and resources: the dataset input ``CIFAR-10`` (digest: the decoded
  cache's SHA-256, :meth:`RunLogger.log_dataset`) and MLflow's system metrics ``system/…``
  (:meth:`RunLogger.system_metrics`).

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

from .active import Sink, active_run_sink, log_active_text  # noqa: F401
from .jobdir import (  # noqa: F401
    JOB_STATES,
    OWN_RUN_STATES,
    _log_counts,
    clear_store_down,
    count_jobs,
    mark_store_down,
    planned_job_dirs,
    read_json,
    read_parent,
    store_known_down,
    summary,
    write_atomic,
    write_json,
    write_status,
)
from .ownership import (  # noqa: F401
    CLAIM_PENDING_S,
    Claim,
    Heartbeat,
    _claim_order,
    _close_orphans,
    _describe,
    _live_rivals,
    _pid_start,
    _unsent_params,
    claim,
    claim_tags,
    close_members,
    close_run,
    correct_timeouts,
    find_finished,
    finished_configs,
    job_ended,
    owner_gone,
    owner_tags,
    reconcile,
    slurm_states,
    stand_down,
    supersede,
)
from .provenance import (  # noqa: F401
    _GIT,
    _git_state,
    command_line,
    git_commit,
    slurm_job_id,
    system_tags,
)
from .read import (  # noqa: F401
    _BULK_REST_MAX_POINTS,
    _BULK_RUNS_REST,
    _BULK_RUNS_SQL,
    MEMBERS_ATTR,
    _rest_history_bulk,
    _sql_history_bulk,
    _sql_members,
    _sql_runs_table,
    download_artifact,
    experiment_names,
    member_runs,
    metric_histories,
    metric_history,
    runs_table,
)
from .schema import (  # noqa: F401
    FIGURES_DIR,
    FINISHED_FILE,
    JOURNAL_FILE,
    MAX_ENTITIES,
    MAX_METRICS,
    MAX_PARAMS,
    MAX_TAGS,
    NAMES_FILE,
    PARAM_VALUE_LIMIT,
    PARENT_FILE,
    RESERVED_TAG_PREFIXES,
    RESULT_DIR,
    ROLE_MEMBER,
    RUN_FILE,
    RUN_TAGS,
    SEED_STD_PREFIX,
    SLURM_KILLED,
    SLURM_LIVE,
    STATUS_FILE,
    STORE_DOWN_FILE,
    TAG_ATTEMPT,
    TAG_CLAIM,
    TAG_DIRTY,
    TAG_HEARTBEAT,
    TAG_HOST,
    TAG_LR,
    TAG_NOTE,
    TAG_PID,
    TAG_PID_START,
    TAG_REASON,
    TAG_ROLE,
    TAG_SLURM,
    TAG_STOOD_DOWN,
    TAG_SUPERSEDED,
    TrackingError,
    _chunks,
    _param_value,
)
from .store import (  # noqa: F401
    _OUTAGE,
    LOCAL_FILESYSTEMS,
    _client,
    _create_schema,
    _filesystem,
    _first_line,
    _is_http,
    _revision,
    _sqlite_path,
    _store_lock,
    _use_wal,
    check_store,
    configure_http,
    describe_experiment,
    experiment_name_problem,
    is_outage,
    new_store,
    prepare_experiment,
    quick_bounds,
    quiet_store_logs,
    redact,
    resolve_uri,
    store_template,
    unreachable,
)
from .sweep import (  # noqa: F401
    SweepRun,
    extend_sweep,
    log_tables,
)
from .write import (  # noqa: F401
    _ILLEGAL_KEY_CHARS,
    _JOB_ONLY_TAGS,
    DATASET_DIGEST_CHARS,
    MAX_KEY_LENGTH,
    SYSTEM_METRICS_S,
    Journal,
    RunLogger,
    StoreRefused,
    TrackingLost,
    _journal_lines,
    _member_points,
    _points,
    attach_files,
    log_now,
    member_tags,
    metric_key,
    read_journal,
    read_member_journal,
    split_seed_std,
    user_tag_problem,
)
