"""Tasks: :data:`TASKS` maps ``task.name`` to ``fn(settings, device, job_dir, run_or_None,
config_hash) -> Measurement``, importing the task's module on first look-up.
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


TASKS: Mapping[str, Callable[..., Measurement]] = _Tasks()
