"""Tasks: what one job does with the network its config describes (``task=`` group).

:data:`TASKS` maps ``task.name`` to ``fn(settings, device, job_dir, run_logger_or_None,
config_hash) -> Measurement``; each task's module is imported when a job first looks it up
(a measurement never imports the training loop).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping

from ..result import Measurement

#: task name → ``"module:function"`` of this package
_TASKS = {"measure": "measure:task_measure", "train": "train:task_train"}


class _Tasks(Mapping[str, Callable[..., Measurement]]):
    """Task name → function, imported on first look-up."""

    def __getitem__(self, name: str) -> Callable[..., Measurement]:
        module, _, attr = _TASKS[name].partition(":")
        return getattr(importlib.import_module(f"{__name__}.{module}"), attr)

    def __iter__(self) -> Iterator[str]:
        return iter(_TASKS)

    def __len__(self) -> int:
        return len(_TASKS)


#: task name → ``fn(settings, device, job_dir, run_logger_or_None, config_hash) -> Measurement``
TASKS: Mapping[str, Callable[..., Measurement]] = _Tasks()
