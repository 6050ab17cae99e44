"""Figure 11: Pre-Norm stream growth: the claims and the registry entry."""

from __future__ import annotations

from ..core.claims import Claim, Measured, NotRun, Runs, near, seed_std
from ..core.registry import Experiment
from ..core.select import need
from ..study import mean_of
from ..study.fig5 import RMS_384, RMS_THEORY


def _fig11_kappa(runs: Runs) -> Measured:
    df = runs("fig11")
    need(df, "stream_kappa", "nominal_ratio")
    df = df[df["nominal_ratio"] ** 2 * df["depth"] >= 2]  # the fit needs a stream that grows
    if df.empty:
        raise NotRun("no run with (βα^M)² L ≥ 2")
    return Measured(float(df["stream_kappa"].mean()), seed_std(df, "stream_kappa"),
                    f"{len(df)} runs, α ∈ {sorted(df['alpha'].unique().tolist())}")


FIG11 = (
    Claim("fig11.kappa_slope", "rms(h_l)² − 1 vs (βα^M)² l is one line of slope "
          "κ ≈ 0.51 for every α", "the study, fig11(b)", "0.51", near(0.51, 0.05), _fig11_kappa),
    Claim("fig11.rms_L384", "At L = 384, α = β = 1 the Pre-Norm stream reaches rms "
          "≈ 14.5", "the study, fig11", RMS_384, near(RMS_THEORY, 0.3),
          mean_of("fig11", "rms_final", depth=384, nominal_ratio=1.0), size="cpu",
          printed=14.5))

EXPERIMENTS = (Experiment("fig11", "Figure 11: Pre-Norm stream growth", "the study, fig11",
                          analyses=("stream --experiment fig11",), claims=FIG11),)
