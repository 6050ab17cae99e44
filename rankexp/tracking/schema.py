"""What rankexp writes to MLflow and to a job directory: file names, tag names, the store's
batch limits, and the one error type of the tracking package."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

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
#: ``rankexp.role`` of one learning-rate member of a batched training run (its own run, nested
#: under the training run) and its tag holding that learning rate (``f"{lr:g}"``)
ROLE_MEMBER, TAG_LR = "member", "rankexp.lr"
#: the artifact folder of a sweep's parent run holding the analysis' figures of its runs
FIGURES_DIR = "figures"
TAG_HOST, TAG_PID, TAG_PID_START = "rankexp.host", "rankexp.pid", "rankexp.pid_start"
TAG_SLURM, TAG_ATTEMPT, TAG_HEARTBEAT = "rankexp.slurm_job_id", "rankexp.attempt", "rankexp.heartbeat"
TAG_REASON, TAG_SUPERSEDED = "rankexp.end_reason", "rankexp.superseded_by"
#: a job run's claim on its config: when it was made (Unix ms; the claim order), and the run
#: a stood-down claimant gave way to
TAG_CLAIM, TAG_STOOD_DOWN = "rankexp.claim_time", "rankexp.stood_down_for"
TAG_DIRTY = "rankexp.git_dirty"
SEED_STD_PREFIX = "seed_std."  # tag seed_std.<m>: the seed spread of scalar metric <m>
TAG_NOTE = "mlflow.note.content"  # the run's description in the MLflow UI
#: the plain (unprefixed) tags rankexp writes on its runs; with ``mlflow.*``, ``rankexp.*`` and
#: ``seed_std.*`` they are not the user's to set (``tracking.tags``)
RUN_TAGS = ("config_hash", "git_commit", "overrides", "device", "task", "torch_threads", "job_dir",
            "sweep_id", "jobs_total", "error")
RESERVED_TAG_PREFIXES = ("mlflow.", "rankexp.", SEED_STD_PREFIX)
#: Slurm states in which a job may still close its own run
SLURM_LIVE = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
              "SUSPENDED", "COMPLETING", "CONFIGURING", "STAGE_OUT", "SIGNALING", "STOPPED"}
#: Slurm end states that mean the job was stopped from outside rather than failed
SLURM_KILLED = {"CANCELLED", "PREEMPTED"}


class TrackingError(RuntimeError):
    """The tracking store cannot be used as configured (message says why and what to do)."""


def _chunks(items: list, n: int) -> Iterator[list]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


def _param_value(v: Any) -> str:
    s = json.dumps(v) if isinstance(v, (list, dict)) else str(v)
    return s[:PARAM_VALUE_LIMIT]
