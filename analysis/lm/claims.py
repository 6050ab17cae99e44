"""The study's Figure 12 claims (science.md §4 fig12), listed by fig12's registry entry.

At initialization "every assumption holds exactly": the FFN Jacobians of different blocks are
orthogonal up to the ``1/d`` scale of independent matrices and add as uncorrelated terms.
Trained GPT-2 (``model.pretrained``) aligns them; those claims read ``not run`` until a sweep
with the checkpoints (``python -m rankexp experiment=fig12 model.pretrained=gpt2,gpt2-medium
seeds=1 -m``) is in the store.  Tolerances are stated a priori.
"""

from __future__ import annotations

import math

import pandas as pd

from ..core.claims import Claim, Measured, NotRun, Runs, at_most, near, seed_std
from ..core.select import need
from .ffn import trained, with_pretrained

#: what the trained half needs: checkpoints no grid of this checkout makes (offline)
PRETRAINED = ("pretrained GPT-2 checkpoints: python -m rankexp experiment=fig12 "
              "model.pretrained=gpt2,gpt2-medium seeds=1 -m (a hub or local copies)")
#: GPT-2 Small and Medium widths (the study's two networks)
SMALL, MEDIUM = 768, 1024


def _runs(runs: Runs, pretrained: bool, width: int | None = None) -> pd.DataFrame:
    df = with_pretrained(runs("fig12"))
    need(df, "ffn_accumulated_ratio", "ffn_cos_offdiag_rms", "width")
    df = df[trained(df) == pretrained]
    if width is not None:
        df = df[df["width"] == width]
    if df.empty:
        what = "pretrained" if pretrained else "random-init"
        raise NotRun(f"no {what} fig12 run" + (f" with d = {width}" if width else ""))
    return df


def _cos_init(runs: Runs) -> Measured:
    df = _runs(runs, False)
    worst = df.loc[(df["ffn_cos_offdiag_rms"] * df["width"]).idxmax()]
    return Measured(float(worst["ffn_cos_offdiag_rms"] * worst["width"]), math.nan,
                    f"largest over {len(df)} random-init run(s) of rms(off-diagonal cos) × d "
                    f"(d = {int(worst['width'])})")


def _accumulated_init(runs: Runs) -> Measured:
    df = _runs(runs, False)
    return Measured(float(df["ffn_accumulated_ratio"].mean()),
                    seed_std(df, "ffn_accumulated_ratio"),
                    f"‖Σ J_l‖_F / (Σ‖J_l‖²)^½ at k = L, mean over {len(df)} random-init run(s)")


def _trained(metric: str, width: int):
    def measure(runs: Runs) -> Measured:
        df = _runs(runs, True, width)
        return Measured(float(df[metric].mean()), math.nan,
                        f"pretrained {', '.join(sorted(df['model.pretrained'].astype(str).unique()))}")
    return measure


FIG12 = (
    Claim("fig12.cos_init", "At initialization the pairwise cosines of the FFN Jacobians are ≈ 1/d",
          "science.md §4 fig12a", "≈ 1/d (rms × d ≈ 1)", at_most(3.0), _cos_init),
    Claim("fig12.accumulated_init", "At initialization accumulated / uncorrelated = 1.00 at k = L",
          "science.md §4 fig12b", "1.00×", near(1.0, 0.05), _accumulated_init),
)
FIG12_TRAINED = tuple(
    claim
    for width, name, cos, acc, coherent in ((SMALL, "small", 0.18, 1.78, 3.26),
                                            (MEDIUM, "medium", 0.15, 2.23, 4.59))
    for claim in (
        Claim(f"fig12.cos_trained_{name}",
              f"Trained GPT-2 {name.title()}: off-diagonal mean cosine of the FFN Jacobians",
              "science.md §4 fig12a", f"{cos:g}", near(cos, 0.05),
              _trained("ffn_cos_offdiag_mean", width), needs=PRETRAINED),
        Claim(f"fig12.accumulated_trained_{name}",
              f"Trained GPT-2 {name.title()}: accumulated / uncorrelated at k = L "
              f"(fully coherent: {coherent:g}×)",
              "science.md §4 fig12b", f"{acc:g}×", near(acc, 0.25),
              _trained("ffn_accumulated_ratio", width), needs=PRETRAINED),
    )
)
