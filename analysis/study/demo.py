"""Demo: Pre- vs Post-Norm erank across α and depth: the claims and the registry entry."""

from __future__ import annotations

from ..core.registry import Experiment

EXPERIMENTS = (Experiment("demo", "Demo: Pre- vs Post-Norm erank across α and depth",
                          "the study, fig6 (a CPU-sized taste: Pre- vs Post-Norm)",
                          analyses=("heatmap --experiment demo",), reproduce=False),)
