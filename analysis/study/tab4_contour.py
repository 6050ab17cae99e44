"""Table 4 by root finding: iso-rank contours traced by hydra/sweeper=contour: the claims and the
registry entry."""

from __future__ import annotations

from ..core.claims import Claim, near
from ..core.registry import Experiment, Needs
from .fig5 import TABLE4, TABLE4_LEVELS, iso_slope

#: Table 4 from the contour sweep (hydra/sweeper=contour: crossings by root finding, the study)
TAB4_CONTOUR = tuple(
    Claim(f"tab4_contour.{pl}_md{e}_r{lv:g}",
          f"Table 4 by root finding: iso-rank exponent s, {pl}, m/d = {e}, r* = {lv:g}",
          "the study, tab4, tab4_contour", f"{s:+.2f} (d = 256)", near(s, 0.05),
          iso_slope(pl, e, lv, "tab4_contour"), size="cpu")
    for (pl, e), values in TABLE4.items() for lv, s in zip(TABLE4_LEVELS, values, strict=True))

EXPERIMENTS = (
    Experiment("tab4_contour",
               "Table 4 by root finding: iso-rank contours traced by hydra/sweeper=contour",
               "the study, tab4, tab4_contour",
               analyses=("isorank --experiment tab4_contour --levels 0.4,0.5,0.6",),
               claims=TAB4_CONTOUR, needs=Needs(gpu_full=True)),)
