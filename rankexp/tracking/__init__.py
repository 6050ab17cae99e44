"""The only package that talks to MLflow: :mod:`.core` (the store, names, provenance, the job
directory, a job's run, claims, the sweep's parent, the user's active run) and :mod:`.read`
(the analysis' read path); every public name is re-exported here.

One run is one Hydra job, in experiment ``tracking.experiment``:

* params: the resolved config flattened with dots, plus what the model family derives; tags:
  ``config_hash`` (its identity: a job skips a config with a FINISHED run), ``git_commit``,
  ``overrides``, ``sweep_id``, ``device``, ``task``, ``job_dir``, ``seed_std.<m>``, MLflow's
  system tags, ``tracking.tags`` and ``tracking.note`` (``mlflow.note.content``);
  ``mlflow.parentRunId`` is the sweep's parent run (``rankexp.role=sweep``, with the job
  counts ``jobs_<outcome>`` at its end);
* the owner: ``rankexp.host``, ``.pid``, ``.pid_start``, ``.slurm_job_id``, ``.heartbeat``
  (refreshed every ``tracking.heartbeat_s``) and the claim ``rankexp.claim_time`` — the
  earliest live claim of a config computes it; a RUNNING run whose process is gone from this
  host, or whose heartbeat is older than ``tracking.stale_after_s``, is closed KILLED by the
  next job, sweep or sync that meets it (``rankexp.end_reason`` says why, ``error`` the rest);
* metrics: scalars at step 0, series at ``step`` = layer / train step, names through
  :func:`metric_key`; artifacts: the job's ``result/`` folder;
* a training run's learning rates: member runs nested under it (``rankexp.role=member``,
  ``rankexp.lr``) holding the per-rate series under plain names (``train_loss``, …).
"""

from .core import *  # noqa: F403
from .core import __all__ as _core
from .read import *  # noqa: F403
from .read import __all__ as _read

__all__ = [*_core, *_read]
