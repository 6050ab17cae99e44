"""The registry entries of the mean-field chapter (science.md §5; :mod:`analysis.core.registry`)."""

from __future__ import annotations

from ..core.registry import Experiment, Needs
from . import claims

EXPERIMENTS = (
    Experiment(
        "mf_phase",
        "Phase diagram: χ₁ and ξ_c over (σ_w², σ_b²)",
        "science.md §5 (215.1–215.4)",
        ("The chapter's phase diagram (science.md §5, 215.1–215.4): plain tanh networks over a "
         "(σ_w², σ_b²) grid — alpha = σ_w ∈ {1.0 … 2.0} (σ_w² 1 … 4), bias = σ_b ∈ {0 … 0.5} (σ_b² "
         "0 … 0.25); L = 64, n = 1000, 8 seeds.  The probe `correlation` propagates two inputs "
         "(c_0 = 0.5) and measures χ₁ (mean squared singular value of the layer Jacobian), χ_c and "
         "ξ_c = −1/ln χ_c, and fits ξ_c to the decay of c_l; the theory beside them is iterated "
         "maps. Heatmaps of measured χ₁ and ξ_c with the critical line χ₁ = 1 and theory ξ_c "
         "contours."),
        analyses=(
            "mf_phase -e mf_phase",
        ),
        claims=claims.MF_PHASE,
        needs=Needs(gpu_full=True),
    ),
    Experiment(
        "mf_relu_collapse",
        "Critical ReLU: polynomial correlation collapse",
        "science.md §5 (critical ReLU)",
        ("Critical ReLU (science.md §5): plain ReLU networks at σ_w² = 2 (alpha = √2), σ_b = 0, L "
         "= 200, n = 1000, 4 seeds (6.4 GB of float64 weights), two inputs at c_0 ∈ {0, 0.5, 0.9}; "
         "the correlation approaches 1 only polynomially: 1 − c_l against the exact map f(c) = "
         "(√(1−c²) + (π − arccos c) c)/π iterated from c_0 and its asymptote 9π²/(2 l²) (log-log), "
         "with the ratio to the asymptote."),
        analyses=(
            "mf_relu_collapse -e mf_relu_collapse",
        ),
        claims=claims.MF_RELU_COLLAPSE,
    ),
    Experiment(
        "mf_spectrum",
        "Jacobian spectrum: Var(λ) = L(v_W + v_D)",
        "science.md §5 (215.7)",
        ("The Jacobian spectrum table (science.md §5, 215.7): squared singular values λ of "
         "∂h_L/∂h_0 normalized to mean 1, Var(λ) beside L (v_W + v_D), for linear / relu / tanh × "
         "gaussian / orthogonal × L ∈ {8, 32} at width 400, 4 networks, each at its critical "
         "point: linear σ_w = 1; relu σ_w² = 2; tanh on the critical line at q* = 1/64 (σ_w², "
         "σ_b²) = (1.0305575107996, 4.6513332664e-6) from "
         "rankexp.theory.tanh_critical_point(1/64)."),
        analyses=(
            "mf_spectrum -e mf_spectrum",
        ),
        claims=claims.MF_SPECTRUM,
    ),
    Experiment(
        "mf_bn",
        "Batch normalization at initialization",
        "science.md §5 (BN paradox, shattered gradients)",
        ("Batch normalization at initialization (science.md §5): plain ReLU networks (σ_w² = 2), "
         "width 200, 8 seeds, L ∈ {4 … 64}; plain vs residual (skip_every 0/1, β = 1) × no norm vs "
         "batchnorm before φ (norm=pre, statistics over the batch), and residual with β = 1/√L. "
         "gradient_norms: per-layer weight-gradient norms for a random readout on a batch of 256 — "
         "geometric growth toward the input for plain BN nets (Yang et al. 2019: √(π/(π−1)) per "
         "layer for ReLU), O(1) with skips; shattered: lag-1 autocorrelation of the input gradient "
         "on 256 points in [−2, 2] (the grid is the batch) vs depth."),
        analyses=(
            "mf_bn -e mf_bn",
        ),
        claims=claims.MF_BN,
    ),
    Experiment(
        "mf_residual",
        "Residual ReLU networks: variance and correlation",
        "science.md §5 (residual networks)",
        ("Residual ReLU networks (science.md §5): h_l = h_{l−1} + β W relu(h_{l−1}), σ_w² = 2, σ_b "
         "= 0, branch gain β = 1 (beta_scaling=const) or β = 1/√L (inv_sqrt_depth), L ∈ {16, 64, "
         "256}, n = 500, 8 seeds, two inputs at c_0 = 0.5 (probe correlation). Stream variance q_l "
         "against (1 + β²)^l (→ e at β = 1/√L) and the correlation c_l against the exact residual "
         "map and its continuous-depth ODE dc/dt = β²L (f(c) − c), vs l/L."),
        analyses=(
            "mf_residual -e mf_residual",
        ),
        claims=claims.MF_RESIDUAL,
    ),
    Experiment(
        "mf_trainability",
        "Trainability vs the correlation depth scale (L ≈ 6ξ_c)",
        "science.md §5 (Schoenholz et al. 2017)",
        ("The Schoenholz et al. (2017) trainability test on CIFAR-10 (science.md §5): plain tanh "
         "networks (width 256) at σ_b² = 0.05 (bias = √0.05) over σ_w² ∈ {1 … 4} (alpha = σ_w) × L "
         "∈ {10 … 300}, trained with the train task (Adam, the LRs of task.lrs batched, batch "
         "256); best test accuracy as a heatmap over (σ_w², L) with L = 6 ξ_c(σ_w², σ_b²) overlaid "
         "(theory of the correlation depth scale; networks train where L ≲ 6 ξ_c).  Full size "
         "wants a GPU (hydra/launcher=slurm_gpu); size=cpu is a reduced grid."),
        analyses=(
            "mf_trainability -e mf_trainability",
        ),
        claims=claims.MF_TRAINABILITY,
        needs=Needs(cifar10=True, train=True, gpu_full=True),
    ),
    Experiment(
        "deep_linear",
        "The deep-linear plateau T(N, a₀)",
        "science.md §5 (215.8/215.9)",
        ("The deep-linear plateau (science.md §5, 215.8/215.9): learning time T(N, a₀, s) of N "
         "scalar layers from a_i(0) = a₀ to half the target s, by quadrature, for N = 1…24 and a₀ "
         "∈ {0.5, 0.7, 0.9} and the identity start a₀ = 1, beside the asymptote "
         "a₀^{−(N−2)}/(s(N−2)); targets s = 1 (the identity start is already past halfway: T = 0) "
         "and s = 4.  A few points are checked by gradient flow on real deep linear chains "
         "(orthogonal layers, autograd, DOP853).  Pure theory, logged like every run."),
        analyses=(
            "deep_linear -e deep_linear",
        ),
        claims=claims.DEEP_LINEAR,
    ),
)
