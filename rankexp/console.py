"""Progress bars that share the console with log lines: drawn only on a terminal, and while
one is live every console log handler writes through ``tqdm.write`` (a row of its own); and
a sweep's bar of jobs done."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from .jobdir import count_jobs


def _console_loggers() -> list[logging.Logger]:
    def console(logger: logging.Logger) -> bool:
        return any(isinstance(h, logging.StreamHandler) and h.stream in (sys.stdout, sys.stderr)
                   for h in logger.handlers)

    named = [v for v in logging.Logger.manager.loggerDict.values() if isinstance(v, logging.Logger)]
    return [lg for lg in (logging.root, *named) if console(lg)]


@contextlib.contextmanager
def progress_bar(total: int | None = None, *, enabled: bool = True, **kwargs: Any
                 ) -> Iterator[tqdm]:
    """``with progress_bar(total, desc=…) as bar:`` — a tqdm bar (``kwargs`` are tqdm's),
    drawn if ``enabled`` and its stream is a terminal; closed on exit."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    bar = tqdm(total=total, disable=None if enabled else True, **kwargs)
    try:
        loggers = [] if bar.disable else _console_loggers()
        with logging_redirect_tqdm(loggers=loggers) if loggers else contextlib.nullcontext():
            yield bar
    finally:
        bar.close()


@contextlib.contextmanager
def sweep_bar(job_dirs: Sequence[Path], *, enabled: bool = True) -> Iterator[None]:
    """A bar of the sweep's jobs that have ended (their ``status.json``), redrawn each second
    while the launcher runs them, when stdout is a terminal; meanwhile whatever this process
    writes to stdout (its jobs' log lines, however Hydra configures their logging) goes above
    the bar."""
    from tqdm.contrib import DummyTqdmFile

    with progress_bar(len(job_dirs), enabled=enabled, file=sys.stdout, desc="sweep", unit="job",
                      smoothing=0) as bar:
        if bar.disable:
            yield
            return
        stop = threading.Event()

        def tick() -> None:  # a job still RUNNING counts as killed: not yet ended
            c = count_jobs(job_dirs)
            bar.update(len(job_dirs) - c["not_run"] - c["killed"] - bar.n)

        def poll() -> None:
            while not stop.wait(1.0):
                tick()

        thread = threading.Thread(target=poll, name="sweep-bar", daemon=True)
        thread.start()
        try:
            with contextlib.redirect_stdout(DummyTqdmFile(sys.stdout)):
                yield
        finally:
            stop.set()
            thread.join()
            tick()
