"""Figure helpers shared by the analysis commands: saving (PNG + PDF + CSV) in the house
style (:mod:`analysis.style`), and a way for tests and the report to see what was drawn."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

from . import style
from .style import plt

log = logging.getLogger("analysis")
logging.getLogger("fontTools").setLevel(logging.WARNING)  # PDF font subsetting chatter
style.use()

#: while :func:`recording` is active, every figure :func:`save` writes is appended here
_recorders: list[list] = []


@contextlib.contextmanager
def recording() -> Iterator[list]:
    """Collect the Figure objects that :func:`save` writes inside the block (they stay open
    until the block ends, so tests can inspect their axes, labels and caption)."""
    figs: list = []
    _recorders.append(figs)
    try:
        yield figs
    finally:
        _recorders.remove(figs)
        for fig in figs:
            plt.close(fig)


def save(fig, out_dir: Path, stem: str, table=None) -> list[Path]:
    """Save ``fig`` as PNG and PDF (and ``table`` as CSV) under ``out_dir``; return the paths.

    A figure without a :func:`analysis.style.caption` line is saved but logged as a warning.
    """
    if not style.captions(fig):
        log.warning("figure %s has no caption line (analysis.style.caption)", stem)
    style.finish(fig)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.png", out_dir / f"{stem}.pdf"]
    fig.savefig(paths[0])
    fig.savefig(paths[1])
    if _recorders:
        fig.set_label(stem)
        _recorders[-1].append(fig)
    else:
        plt.close(fig)
    if table is not None:
        paths.append(out_dir / f"{stem}.csv")
        table.to_csv(paths[-1])
    for p in paths:
        log.info("wrote %s", p)
    return paths
