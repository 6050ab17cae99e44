"""Figure helpers shared by the analysis commands."""

from __future__ import annotations

import logging
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

log = logging.getLogger("analysis")


def save(fig, out_dir: Path, stem: str, table=None) -> list[Path]:
    """Save ``fig`` as PNG and PDF (and ``table`` as CSV) under ``out_dir``; return the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.png", out_dir / f"{stem}.pdf"]
    fig.savefig(paths[0], dpi=150, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")
    plt.close(fig)
    if table is not None:
        paths.append(out_dir / f"{stem}.csv")
        table.to_csv(paths[-1])
    for p in paths:
        log.info("wrote %s", p)
    return paths
