"""Interruption requests (SIGTERM, SIGINT, SIGHUP, submitit's USR2) as one contract: outside
:func:`deferred` a signal raises :class:`JobInterrupted` at once; inside (the training loop) it
only records the request, which the loop polls with :func:`requested` once per step, then
checkpoints and raises :class:`JobInterrupted` itself.  The job ends its run KILLED."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

#: the signals that stop a job or a sweep: kill/Ctrl-C/hang-up, and submitit's time-limit warning
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2)


class JobInterrupted(BaseException):  # noqa: N818 — a BaseException like KeyboardInterrupt
    """The job was asked to stop by ``signal_name`` (e.g. ``SIGTERM``); a ``BaseException`` so
    ``except Exception`` blocks cannot swallow it."""

    def __init__(self, signal_name: str):
        super().__init__(signal_name)
        self.signal_name = signal_name


class _State:
    requested: str | None = None
    defer_depth: int = 0


def request(signal_name: str) -> None:
    """Record a stop request; raise :class:`JobInterrupted` now unless inside :func:`deferred`."""
    _State.requested = signal_name
    if _State.defer_depth == 0:
        raise JobInterrupted(signal_name)


def requested() -> str | None:
    """The pending request's signal name, or ``None``."""
    return _State.requested


def clear() -> None:
    """Forget a pending request."""
    _State.requested = None


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Within this block signals only set :func:`requested`; the caller stops at a safe point."""
    _State.defer_depth += 1
    try:
        yield
    finally:
        _State.defer_depth -= 1


def handler(signum: int, _frame) -> None:
    """A ``signal.signal`` handler that turns ``signum`` into :func:`request`."""
    request(signal.Signals(signum).name)


@contextlib.contextmanager
def installed(
    handlers: dict[int, Callable[[int, Any], None]] | None = None,
) -> Iterator[dict[int, Any]]:
    """Within this block every signal of :data:`SIGNALS` goes to :func:`handler` (or to
    ``handlers[signum]``); yields the handlers they replace (e.g. submitit's USR2 handler) and
    restores them at exit.  Outside the main thread this installs nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield {}
        return
    chosen = {sig: (handlers or {}).get(sig, handler) for sig in SIGNALS}
    previous = {sig: signal.signal(sig, fn) for sig, fn in chosen.items()}
    try:
        yield previous
    finally:
        for sig, fn in previous.items():
            signal.signal(sig, fn if fn is not None else signal.SIG_DFL)
