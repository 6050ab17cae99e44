"""Figure 13 (trainability): branch-output norm trained on CIFAR-10: the claims and the registry
entry."""

from __future__ import annotations

import math

from ..core.claims import Claim, Measured, Runs, at_least
from ..core.registry import Experiment, Needs
from ..core.select import need


def _fig13_accuracy(runs: Runs) -> Measured:
    df = runs("fig13_train")
    need(df, "best_test_accuracy", "alpha", "depth")
    cells = df.groupby(["alpha", "depth"])["best_test_accuracy"].mean()
    (a, L) = cells.idxmin()
    return Measured(float(cells.min()), math.nan, f"lowest cell: α = {a:g}, L = {int(L)} "
                    f"(of {len(cells)}); mean over cells {cells.mean():.3f}")


FIG13_TRAIN = (
    Claim("fig13.cifar_55", "Output norm: best CIFAR-10 accuracy ≈ 55 % at every "
          "α and L (5000 steps)", "the study, fig13", "≈ 0.55", at_least(0.5), _fig13_accuracy),)

EXPERIMENTS = (
    Experiment(
        "fig13_train", "Figure 13 (trainability): branch-output norm trained on CIFAR-10",
        "the study, fig13",
        analyses=("fig6 --rank-experiment fig13 --train-experiment fig13_train",),
        claims=FIG13_TRAIN, needs=Needs(cifar10=True, train=True, gpu_full=True), reads=('fig13',)),
)
