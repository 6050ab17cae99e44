"""Progress bars that share the console with log lines: drawn only on a terminal, and while
one is live every console log handler writes through ``tqdm.write`` (a row of its own)."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import Any

from tqdm import tqdm


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
