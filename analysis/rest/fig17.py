"""Figure 17: Marchenko–Pastur per activation: the claims and the registry entry."""

from __future__ import annotations

import math

from ..core.claims import Claim, Measured, NotRun, Runs, at_most
from ..core.registry import Experiment
from ..core.select import need
from ..study.fig8 import mp_ks_ratio


def _fig17_ks(acts: tuple[str, ...]):
    def measure(runs: Runs) -> Measured:
        df = runs("fig17")
        need(df, "mp_ks", "seeds", "activation")
        df = df[df["activation"].isin(acts)]
        if df.empty:
            raise NotRun(f"no fig17 run of {', '.join(acts)}")
        i = df["mp_ks"].idxmax()
        if acts == ("relu", "abs"):
            # the 95 % Kolmogorov value for the N pooled eigenvalues plus the atom at zero
            z = mp_ks_ratio(df)
            return Measured(float(z.max()), math.nan, "max over relu/abs runs of KS / (1.36/√N + E|atom gap|)")
        return Measured(float(df.loc[i, "mp_ks"]), math.nan,
                        f"max KS distance (worst: {df.loc[i, 'activation']}, m/d = {df.loc[i, 'expansion']:g})")

    return measure


FIG17 = (
    Claim("fig17.mp_exact", "Gram spectrum of D·W_up is Marchenko–Pastur, exact for "
          "relu and abs", "the study, fig17", "exact", at_most(1.0), _fig17_ks(("relu", "abs"))),
    Claim("fig17.mp_approximate", "…and approximate for gelu and silu",
          "the study, fig17", "approximate", at_most(0.15), _fig17_ks(("gelu", "silu"))))

EXPERIMENTS = (Experiment("fig17", "Figure 17: Marchenko–Pastur per activation", "the study, fig17",
                          analyses=("mp --experiment fig17",), claims=FIG17),)
