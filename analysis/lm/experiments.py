"""The registry entry of Figure 12, GPT-2 (:mod:`analysis.core.registry`)."""

from __future__ import annotations

from ..core.registry import Experiment, Needs
from . import claims

EXPERIMENTS = (
    Experiment(
        "fig12",
        "Figure 12: GPT-2's FFN branch along the residual stream",
        "science.md §4 fig12",
        ("Figure 12: GPT-2's FFN branch along the residual stream (science.md §4 fig12).  GPT-2 "
         "Small (d = 768, L = 12) and Medium (d = 1024, L = 24) at random initialization (GPT-2's "
         "own, no download), the FFN-branch Jacobians J_l = ∂ mlp(ln₂(x))/∂x at the last token of "
         "a fixed prompt, block 1 omitted (its small incoming stream inflates ‖J_1‖ through the "
         "norm Jacobian). The study: (a) pairwise cosines ⟨J_i, J_j⟩/‖J_i‖‖J_j‖ ≈ 1/d at init "
         "(trained off-diagonal mean 0.18 Small, 0.15 Medium); (b) accumulated ‖Σ_{l≤k} J_l‖_F / "
         "uncorrelated (Σ‖J_l‖²)^½ = 1.00× at k = L at init (trained 1.78× / 2.23× against 3.26× / "
         "4.59× fully coherent); (c) rms(h_l) grows and r_l = ‖J_l‖_F/√d decays.  The trained half "
         "needs the pretrained checkpoints (model.pretrained=…)."),
        analyses=(
            "ffn --experiment fig12",
        ),
        claims=claims.FIG12 + claims.FIG12_TRAINED,
        needs=Needs(packages=("transformers",)),
    ),
)
