"""The only package that talks to MLflow: :mod:`.core` (store, runs, claims, sweeps) and
:mod:`.read` (the analysis' read path), re-exported here with :mod:`rankexp.jobdir`.

A run is one Hydra job, identified by its ``config_hash`` tag: a config with a FINISHED run
is skipped; the earliest live claim (``rankexp.claim_time``) computes it; a RUNNING run whose
owner is gone (process or heartbeat) is closed KILLED by the next job, sweep or sync.
"""

from ..jobdir import *  # noqa: F403 — the job directory's files, for the same callers
from ..jobdir import __all__ as _jobdir
from .core import *  # noqa: F403
from .core import __all__ as _core
from .read import *  # noqa: F403
from .read import __all__ as _read

__all__ = [*_jobdir, *_core, *_read]
