"""The registry entries of the study's core figures (science.md §3; :mod:`analysis.core.registry`)."""

from __future__ import annotations

from ..core.registry import Experiment, Needs
from . import claims

EXPERIMENTS = (
    Experiment(
        "fig1",
        "Figure 1: the per-layer rank profile with and without skips",
        "science.md §3 fig1",
        ("Figure 1: the per-layer profile erank(∂h_l/∂h_0)/d, l = 1…L, of a Pre-RMSNorm ReLU stack "
         "(M = 2, α = 1, L = 48, d = 256, 12 seeds) with an identity skip every block "
         "(skip_every=1), every 4th block (4: the sawtooth) or never (0: plain MLP), at β = 1 and "
         "β = 1/√L, for m/d ∈ {1, 2, 4, 8}.  The study: without skips the profile collapses with "
         "depth, spaced skips give a sawtooth, β = 1/√L keeps it flat, and wider branches raise "
         "the troughs."),
        analyses=(
            "profiles --experiment fig1",
        ),
        claims=claims.FIG1,
        needs=Needs(gpu_full=True),
    ),
    Experiment(
        "fig2",
        "Figure 2: rank over α × β collapses onto βα^M",
        "science.md §3 fig2",
        ("Figure 2: erank(∂h_L/∂h_0)/d over an α × β grid, Pre- and Post-RMSNorm, ReLU, M = 2, L = "
         "48, d = 256, m/d = 1.  βα^M takes the same value on several cells (e.g. α=1, β=1 and "
         "α=2, β=1/4): for a positively homogeneous σ such as ReLU the whole network — and so the "
         "erank — depends on (α, β) only through βα^M, exactly (not just approximately)."),
        analyses=(
            "heatmap --experiment fig2 --x alpha --y beta --log-color",
            "collapse --experiment fig2",
        ),
        claims=claims.FIG2,
        needs=Needs(gpu_full=True),
    ),
    Experiment(
        "fig3",
        "Figure 3: path-order decomposition of the Jacobian",
        "science.md §3 fig3",
        ("Figure 3: path-order decomposition ∂h_L/∂h_0 = Σ_k β^k S_k (Eq. 5/11/12) at L = 48, Pre- "
         "Norm, ReLU, M = 2, d = 256, m/d = 4.  β ∈ {1, 1/√L, 1/L} × α grid: the normalized "
         "profile μ_k = ‖β^k S_k‖_F peaks at order 3 for β = 1 (α = 1), and the mean path order "
         "⟨k⟩ is a single curve in βα^M, on the uncorrelated (Poisson-)binomial prediction."),
        analyses=(
            "paths --experiment fig3",
        ),
        claims=claims.FIG3,
        needs=Needs(gpu_full=True),
    ),
    Experiment(
        "fig4",
        "Figure 4: where the norm sits and what it does",
        "science.md §3 fig4, §4",
        ("Figure 4: where the norm sits and what it does (science.md §3 fig4, §4), d = 256, m/d = "
         "1, β = 1, ReLU, M = 2, 12 seeds.  Three panels, two grids: (a) placements pre / output / "
         "post / none with rmsnorm at α = 1, L = 48 — pre and output keep a floor, post collapses "
         "at the rate of no norm; (c) the projection split of Post-Norm (probe projection_split), "
         "α ∈ {0.5, 1, 2}, every op — the projection removes ≤ 0.4 % of full rank (the placements "
         "grid holds (a) and (c); norm=none ignores the op); (b) every config with a Pre-RMSNorm "
         "(P = rmsnorm), the post-residual op R of the general block (Eq. 17) ∈ {none, rmsnorm, "
         "detached, meansub, layernorm}, across depth at α = 1 — detached ≈ rmsnorm (collapse, ≤ "
         "0.4 % of width apart), meansub and none keep a floor (the control grid)."),
        analyses=(
            "placements --experiment fig4",
        ),
        claims=claims.FIG4 + claims.FIG4B,
        needs=Needs(gpu_full=True),
    ),
    Experiment(
        "fig5",
        "Figure 5 / Table 4: depth against init scale",
        "science.md §3 fig5, §4 tab4",
        ("Figure 5 (and Figures 11, 12, Table 4): depth against init scale.  α on a log grid (√2 "
         "steps) × L ∈ {12 … 384}, Pre- vs Post-RMSNorm, m/d ∈ {1, 4}, β = 1, ReLU, M = 2, d = "
         "256. The study: the Pre-Norm stream grows as rms(h_l)² = 1 + κ(βα^M)² l (κ = ½ for ReLU, "
         "Figure 11); the accumulated branch grows ∝ √L for Post-Norm and stays flat for Pre-Norm "
         "(Figure 5b/12); iso-rank contours over (α, L) have slope ≈ −0.50 for Post-Norm (Table 4; "
         "in βα^M — in α itself that is −0.50/M); Post-Norm rank collapses onto one curve of "
         "βα^M√L."),
        analyses=(
            "stream --experiment fig5",
            "accumulated --experiment fig5",
            "profiles --experiment fig5 --metric branch_ratio --rows norm.placement --cols expansion --hue alpha",
            "isorank --experiment fig5",
            "collapse --experiment fig5 --x depth_factor --color depth --panel norm.placement expansion --match-rtol 0.01",
        ),
        claims=claims.FIG5_ISORANK + claims.FIG5_STREAM,
        needs=Needs(gpu_full=True),
    ),
    Experiment(
        "tab4_contour",
        "Table 4 by root finding: iso-rank contours traced by hydra/sweeper=contour",
        "science.md §4 tab4, §6 tab4_contour",
        ("Table 4 by root finding: the crossing α*(L) of erank(∂h_L/∂h_0)/d = r*, r* ∈ {0.4, 0.5, "
         "0.6}, found per (placement, m/d, L) by bracketing α ∈ [0.25, 4] and narrowing the "
         "bracket to ±1 % (a safeguarded secant on log α, hydra/sweeper=contour) instead of "
         "fig5's α grid; Pre- vs Post-RMSNorm, m/d ∈ {1, 4}, β = 1, ReLU, M = 2, d = 256.  The "
         "exponent s of βα*^M ∝ L^s (least squares on log L, with its 95 % interval) is the "
         "study's Table 4: ≈ −0.50 for Post-Norm; the sweep's parent run holds the contour and "
         "the exponents as tables (contour/contour.csv, contour/exponents.csv)."),
        analyses=(
            "isorank --experiment tab4_contour --levels 0.4,0.5,0.6",
        ),
        claims=claims.TAB4_CONTOUR,
        needs=Needs(gpu_full=True),
    ),
    Experiment(
        "fig6",
        "Figure 6 (ranks): the α × L grid",
        "science.md §3 fig6",
        ("Figure 6 (ranks): the α × L grid, Pre- vs Post-Norm, β = 1, two d×d matrices, d = 256."),
        analyses=(
            "heatmap --experiment fig6",
        ),
    ),
    Experiment(
        "fig6_train",
        "Figure 6 (trainability) / Table 5: the rank grid trained on CIFAR-10",
        "science.md §3 fig6, §4 tab5",
        ("Figure 6 (trainability) / Table 5: the rank grid of experiment=fig6 trained on CIFAR-10. "
         "Same α × L grid, Pre- vs Post-Norm, β = 1, two d×d matrices (expansion 1), d = 256; each "
         "run trains every LR of task.lrs (Adam, 3e-5 … 1e-2, 5000 steps, batch 256) as one "
         "batched model and logs best_test_accuracy, best_lr, max_stable_lr (final acc ≥ 0.4)."),
        analyses=(
            "fig6",
            "table5",
        ),
        claims=claims.FIG6_TRAIN,
        needs=Needs(cifar10=True, train=True, gpu_full=True),
        reads=('fig6',),
    ),
    Experiment(
        "tab5_boundary",
        "Table 5 by root finding: the max stable learning rate traced by hydra/sweeper=contour",
        "science.md §4 tab5",
        ("Table 5 by root finding: the max stable learning rate of each (placement, α, L) cell of "
         "fig6's grid (Pre- vs Post-Norm, α ∈ {0.5 … 4}, L ∈ {12 … 192}, β = 1, two d×d matrices, "
         "d = 256; Adam, 5000 steps, batch 256), found by bisecting log lr ∈ [3e-5, 1e-2] "
         "(hydra/sweeper=contour, a boolean target: the run diverged or ended below "
         "task.stable_accuracy = 0.4) to half a decade, each job one rate (lr=…), each depth "
         "started around the boundary its settled neighbours predict, instead of training every "
         "rate of task.lrs; the table holds each cell's boundary (the midpoint in log of its last "
         "stable and first unstable rate, ±0.25 decades)."),
        analyses=(
            "table5 --experiment tab5_boundary",
        ),
        claims=claims.TAB5_BOUNDARY,
        needs=Needs(cifar10=True, train=True, gpu_full=True),
    ),
    Experiment(
        "fig7",
        "Figure 7: the mean spike",
        "science.md §3 fig7",
        ("Figure 7 (mean spike, with Figures 14/15): residual representations Z_l of n probe "
         "inputs through L = 512 Pre-Norm blocks, d = 256, m/d = 4, α = β = 1. M = 1 (σ(W x)): "
         "every branch adds the same mean direction, per-input cross-layer cosine = c (1/π for "
         "ReLU), ‖Σ_k m_k‖ ∝ l and erank(Z_l)/d collapses; M = 2: the means point in random "
         "directions (cosine ≈ 0), ‖Σ_k m_k‖ ∝ √l, the rank survives.  n ∈ {512, 4096, 32768} "
         "shows the probe-size noise floor.  The gated unit needs M = 2: SwiGLU is a grid of its "
         "own."),
        analyses=(
            "spike --experiment fig7",
        ),
        claims=claims.FIG7,
        needs=Needs(gpu_full=True),
    ),
    Experiment(
        "fig8",
        "Figures 8/9: the branch Jacobian and Marchenko–Pastur",
        "science.md §3 fig8/9",
        ("Figures 8, 9 and 17: the branch Jacobian J_f = W_down D W_up (Eq. 9/25) of one Pre-Norm "
         "block at a Gaussian input (depth 1, so every seed is one independent draw), 40 seeds. "
         "erank(J_f)/d against m/d and against γ = p·m/d follows the Gaussian-product reference; "
         "the Gram spectrum of the masked up-projection D W_up is Marchenko–Pastur at γ (exact for "
         "relu/abs, approximate for smooth σ), with full rank from m/d = 1/p."),
        analyses=(
            "mp --experiment fig8",
        ),
        claims=claims.FIG8,
    ),
    Experiment(
        "fig16",
        "Figure 16: how deep a network trains without normalization",
        "science.md §3 fig16",
        ("Figure 16: how deep a network still trains without normalization. No norm vs Pre- "
         "RMSNorm, one vs two branch matrices (M = 1: σ(W x); M = 2: W_down σ(W_up x), expansion "
         "1), α = β = 1, d = 256, depths up to 1000; CIFAR-10, Adam LR sweep of task=train. "
         "Without norm the stream grows like (1 + κα^{2M})^{L/2}: deep runs overflow and stay at "
         "chance (≈ 0.1) — the magnitude channel halves the trainable depth."),
        analyses=(
            "fig16",
        ),
        claims=claims.FIG16,
        needs=Needs(cifar10=True, train=True, gpu_full=True),
    ),
    Experiment(
        "tab1",
        "Table 1: activation constants beside the measured stable rank",
        "science.md §3 tab1",
        ("Table 1: activation constants by quadrature (coherence c = E[σ]²/E[σ²], spike bound 1/c, "
         "survival p = E[σ′²], κ = E[σ²]) beside the measured stable rank of the hidden "
         "activations σ(W h) over n = 2048 Gaussian inputs at the first block (d = 256, m = 1024); "
         "the measured stable rank sits within ~6 % of 1/c (tanh: c = 0, no spike)."),
        analyses=(
            "table1 --experiment tab1",
        ),
        claims=claims.TAB1,
    ),
    Experiment(
        "tab6",
        "Table 6: M = 1 representation collapse at every width",
        "science.md §3 tab6",
        ("Table 6: representation collapse of one-matrix ReLU branches (M = 1, σ(W x)) at every "
         "width. One Pre-Norm run of depth 512 per width d ∈ {128, 256, 512, 1024}, n = 2048 probe "
         "inputs; the table reads erank(Z_l)/d off each run's per-layer series at l ∈ {32, 64, "
         "128, 256, 512}."),
        analyses=(
            "table6 --experiment tab6",
        ),
        claims=claims.TAB6,
        needs=Needs(gpu_full=True),
    ),
    Experiment(
        "demo",
        "Demo: Pre- vs Post-Norm erank across α and depth",
        "science.md §3 fig6 (a CPU-sized taste: Pre- vs Post-Norm)",
        ("A CPU-sized taste of the study: Pre- vs Post-Norm erank across α and depth."),
        analyses=(
            "heatmap --experiment demo",
        ),
        reproduce=False,
    ),
)
