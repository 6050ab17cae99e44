"""The config: its schema (:mod:`.schema`, built from the declarations in :mod:`rankexp.knobs`,
:mod:`rankexp.models.families` and :mod:`rankexp.probes`), its hash (:mod:`.hashing`) and every
check before a run (:mod:`.checks`); the public names are re-exported here.
"""

from __future__ import annotations

from ..knobs import ConfigError
from .checks import (
    CHECKED_JOBS,
    CheckedJob,
    check_fits,
    check_job,
    check_options_used,
    check_override_keys,
    check_slurm_limits,
    check_task,
    checked_job,
    config_groups,
    quote_unicode,
    resolve_device,
    validate,
)
from .hashing import config_hash, flatten, resolved_container
from .schema import (
    MODEL_SCHEMAS,
    RankexpConfig,
    TrainTask,
    choices_with,
    register_configs,
    slurm_signal_delay,
    sweep_stamp,
)

__all__ = [
    "CHECKED_JOBS", "MODEL_SCHEMAS", "CheckedJob", "ConfigError", "RankexpConfig", "TrainTask",
    "check_fits", "check_job", "check_options_used", "check_override_keys", "check_slurm_limits",
    "check_task", "checked_job", "choices_with", "config_groups", "config_hash", "flatten",
    "quote_unicode", "register_configs", "resolve_device", "resolved_container",
    "slurm_signal_delay", "sweep_stamp", "validate",
]
