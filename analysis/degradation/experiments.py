"""The registry entry of the degradation replication (:mod:`analysis.core.registry`)."""

from __future__ import annotations

from ..core.registry import Experiment, Needs
from . import claims

EXPERIMENTS = (
    Experiment(
        "degradation",
        "The degradation replication (He et al. 2016)",
        "science.md §5, last item (He et al. 2016 §4.2)",
        ("The degradation replication (science.md §5, last item; He et al. 2016 §4.2): plain vs "
         "residual CIFAR-10 ConvNets of depth 6n+2 ∈ {20, 32, 44, 56, 110} (model=cifar_resnet: "
         "option-A shortcuts, BN after every conv, He fan-out init), trained with He et al.'s "
         "recipe (SGD, momentum 0.9, weight decay 1e-4, batch 128, lr 0.1 ÷10 at 50 % and 75 % of "
         "164 epochs ≈ 64k iterations, warm-up lr 0.01 for 400 iterations at depth 110, pad-crop- "
         "flip on the device), with the chapter's measurements: gradient norms per conv at "
         "initialization, response std per 3×3 layer (trained), single-block lesions. He et al.: "
         "plain nets degrade with depth (plain-56 trains worse than plain-20; plain-110 > 60 % "
         "error), ResNets improve (8.75 → 6.43 % test error); at initialization the plain nets' "
         "gradients explode toward the input. The size picks the task: full and smoke train, cpu "
         "measures at initialization at all five depths and trains n = 1 for 300 steps."),
        analyses=(
            "init-gradients --experiment degradation",
            "responses --experiment degradation",
            "error-curves --experiment degradation",
            "error-table --experiment degradation",
            "lesion --experiment degradation",
        ),
        claims=claims.DEGRADATION,
        needs=Needs(cifar10=True, train=True, gpu_full=True),
    ),
)
