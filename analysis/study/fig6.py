"""Figure 6 (ranks): the α × L grid: the claims and the registry entry."""

from __future__ import annotations

from ..core.registry import Experiment

EXPERIMENTS = (Experiment("fig6", "Figure 6 (ranks): the α × L grid", "the study, fig6",
                          analyses=("heatmap --experiment fig6",)),)
