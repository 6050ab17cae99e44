"""The only package that talks to MLflow: :mod:`.core` (the store, names, provenance, the job
directory, a job's run, claims, the sweep's parent, the user's active run) and :mod:`.read`
(the analysis' read path); every public name is re-exported here.

A run is one Hydra job, identified by its ``config_hash`` tag: a config with a FINISHED run
is skipped; the earliest live claim (``rankexp.claim_time``) computes it; a RUNNING run whose
process is gone from this host, or whose ``rankexp.heartbeat`` is older than
``tracking.stale_after_s``, is closed KILLED by the next job, sweep or sync that meets it.
"""

from ..jobdir import *  # noqa: F403 — the job directory's files, for the same callers
from ..jobdir import __all__ as _jobdir
from .core import *  # noqa: F403
from .core import __all__ as _core
from .read import *  # noqa: F403
from .read import __all__ as _read

__all__ = [*_jobdir, *_core, *_read]
