"""Tables as the commands write them: GitHub Markdown (beside each table's CSV) and text files."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from .runs import attach_to_parents

log = logging.getLogger("analysis")


def to_markdown(table: pd.DataFrame, floatfmt: str = ".4g") -> str:
    """A GitHub-Markdown table of ``table`` (named index levels first; floats as ``floatfmt``,
    NaN and ±∞ — no value — as ``—``; every other cell as ``str``)."""

    def cell(v) -> str:
        if isinstance(v, (float, np.floating)):
            return format(float(v), floatfmt) if np.isfinite(v) else "—"
        return str(v)

    t = table.reset_index() if any(n is not None for n in table.index.names) else table
    lines = ["| " + " | ".join(map(str, t.columns)) + " |", "|" + "---|" * len(t.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in t.itertuples(index=False)]
    return "\n".join(lines)


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` (folders made), log it, return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    log.info("wrote %s", path)
    return path


def write_markdown(path: Path, title: str, table: pd.DataFrame, floatfmt: str = ".4g",
                   runs: pd.DataFrame | None = None) -> Path:
    """``title``, a blank line and :func:`to_markdown` of ``table`` into ``path``; printed too.
    With ``runs`` (the :func:`~analysis.core.runs.load_runs` rows it tabulates) the file is
    also attached to their sweeps' parent runs (:func:`~analysis.core.runs.attach_to_parents`)."""
    text = f"{title}\n\n{to_markdown(table, floatfmt)}\n"
    print(text)
    write_text(path, text)
    attach_to_parents([path], runs)
    return path
