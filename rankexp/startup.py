"""A process's start-up without Python's cyclic garbage collector (issue 18, item 1).

A job's start-up is imports — torch, Hydra, MLflow with SQLAlchemy, pandas and FastAPI — and
importing creates hundreds of thousands of long-lived objects; the collector walks them again
and again while they are being created (generation 2 grows with them), for almost nothing:
after those imports one full collection frees ~10,000 of ~440,000 objects.  Measured on this
machine (1 thread, ``python -c "import torch, hydra, sqlalchemy, mlflow.tracking, …"``):
3.2–3.7 s CPU with the collector on, 2.6–2.8 s with it off; a tiny job
(``depth=4 width=16 seeds=1``, SQLite store) 3.2–3.4 s CPU → 2.3–2.6 s.

:func:`begin` (the process's entry: ``python -m rankexp``, :func:`rankexp.cli.cli`, a Slurm
array task) switches the collector off; :func:`end` (the job is about to compute, a sweep
about to launch, or the command is over) freezes what start-up made — moved to the
permanent generation (:func:`gc.freeze`, the pattern Python's ``gc`` documentation gives for
start-up state), so later collections no longer walk it — and switches the collector on
again.  What start-up left as cyclic garbage (a few thousand objects, ~MB) stays until exit.
A process whose collector was already off (the user's choice) is left as it was.
"""

from __future__ import annotations

import gc


class _State:
    off = False  # begin() switched the collector off, end() has not switched it on yet


def begin() -> None:
    """Switch the cyclic garbage collector off for the start-up (no-op if it is off already)."""
    if gc.isenabled():
        gc.disable()
        _State.off = True


def end() -> None:
    """Start-up is over: freeze what it made and switch the collector on again, if
    :func:`begin` switched it off (no-op otherwise, and on every later call)."""
    if _State.off:
        _State.off = False
        gc.freeze()
        gc.enable()
