"""Tasks: what one job does with the network its config describes (``task=`` group)."""

from __future__ import annotations

from collections.abc import Callable

from ..result import Measurement
from .measure import task_measure
from .train import task_train

#: task name → ``fn(settings, device, job_dir, run_logger_or_None, config_hash) -> Measurement``
TASKS: dict[str, Callable[..., Measurement]] = {
    "measure": task_measure,
    "train": task_train,
}
