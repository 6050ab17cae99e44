"""Tasks: :data:`TASKS` maps ``task.name`` to ``fn(settings, device, job_dir, run_or_None,
config_hash) -> Measurement``, importing the task's module when it runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from ..result import Measurement


def _lazy(module: str, attr: str) -> Callable[..., Measurement]:
    def task(*args) -> Measurement:
        return getattr(importlib.import_module(f"{__name__}.{module}"), attr)(*args)

    return task


TASKS: dict[str, Callable[..., Measurement]] = {
    "measure": _lazy("measure", "task_measure"), "train": _lazy("train", "task_train")}
