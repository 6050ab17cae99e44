"""Progress bars that share the console with log lines (issue 19 item 6).

A bar is drawn only when its stream is a terminal (tqdm's ``disable=None``): output
redirected to a file (Slurm, ``nohup``, a pipe) gets the log lines alone, never a ``\\r``
frame.  While a bar is live, every console log handler (a ``StreamHandler`` on stdout or
stderr, e.g. Hydra's) writes through ``tqdm.write`` (tqdm's own
:func:`tqdm.contrib.logging.logging_redirect_tqdm`), so a log line gets a row of its own and
the bar is redrawn below it instead of being overwritten mid-row.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import Any

from tqdm import tqdm


def _console_loggers() -> list[logging.Logger]:
    """The loggers that hold a console handler (the root first), the ones to redirect."""
    def console(logger: logging.Logger) -> bool:
        return any(isinstance(h, logging.StreamHandler) and h.stream in (sys.stdout, sys.stderr)
                   for h in logger.handlers)

    named = [v for v in logging.Logger.manager.loggerDict.values() if isinstance(v, logging.Logger)]
    return [lg for lg in (logging.root, *named) if console(lg)]


@contextlib.contextmanager
def progress_bar(total: int | None = None, *, enabled: bool = True, **kwargs: Any
                 ) -> Iterator[tqdm]:
    """``with progress_bar(total, desc=…, unit=…) as bar:`` — a tqdm bar (``kwargs`` are
    tqdm's), disabled unless ``enabled`` and its stream is a terminal; while it is drawn,
    console log lines go through ``tqdm.write``.  Closed on exit."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    bar = tqdm(total=total, disable=None if enabled else True, **kwargs)
    try:
        loggers = [] if bar.disable else _console_loggers()
        with logging_redirect_tqdm(loggers=loggers) if loggers else contextlib.nullcontext():
            yield bar
    finally:
        bar.close()
