"""The registry entries of the rest of the study (science.md §4; :mod:`analysis.core.registry`)."""

from __future__ import annotations

from ..core.registry import Experiment, Needs
from . import claims

EXPERIMENTS = (
    Experiment(
        "fig10",
        "Figure 10: the post-residual op without the Pre-RMSNorm control",
        "science.md §4 fig10",
        ("Figure 10: Figure 4b's post-residual op comparison *without* the Pre-RMSNorm control "
         "(science.md §4 fig10), d = 256, m/d = 1, M = 2, ReLU, α = β = 1, 12 seeds, across depth. "
         "(a) P = identity, R ∈ {none, rmsnorm, detached, meansub, layernorm} (general block, Eq. "
         "17): with no op or meansub alone the branch is unnormalized, the branch-to-skip ratio "
         "stays at βα^M and rank collapses at nearly the rescaling rate — the five ops are "
         "indistinguishable; (b) post-RMSNorm and post-LayerNorm with vs without the Pre-RMSNorm "
         "control coincide (the control grid; Figure 4b's other R are in experiment=fig4)."),
        analyses=(
            "post_ops --experiment fig10",
        ),
        claims=claims.FIG10,
    ),
    Experiment(
        "fig11",
        "Figure 11: Pre-Norm stream growth",
        "science.md §4 fig11",
        ("Figure 11: Pre-Norm stream growth (science.md §2.3, §4 fig11), M = 2, m/d = 1, ReLU, β = "
         "1, d = 256, L = 384, several α.  (a) rms(h_l)² against l, measured beside the fit 1 + "
         "κ(βα^M)² l; (b) rms(h_l)² − 1 against (βα^M)² l collapses onto one line of slope κ = "
         "E[σ²] = ½ for every α (the study measures κ ≈ 0.51); at L = 384, α = β = 1, rms ≈ 14.5."),
        analyses=(
            "stream --experiment fig11",
        ),
        claims=claims.FIG11,
    ),
    Experiment(
        "fig13",
        "Figure 13 (ranks): branch-output norm on the fig6 grid",
        "science.md §4 fig13",
        ("Figure 13 (ranks): the branch-output placement (norm=output, h_l = h_{l−1} + β "
         "N(f(h_{l−1}))) on the fig6 grid — α × L, β = 1, two d×d matrices (m/d = 1), ReLU, d = "
         "256.  The study: the rank stays above collapse at every α and L, like Pre-Norm "
         "(science.md §4 fig13). The trainability half is experiment=fig13_train, whose analysis "
         "draws both."),
        analyses=(
            "heatmap --experiment fig13",
        ),
        claims=claims.FIG13,
    ),
    Experiment(
        "fig13_train",
        "Figure 13 (trainability): branch-output norm trained on CIFAR-10",
        "science.md §4 fig13",
        ("Figure 13 (trainability): the rank grid of experiment=fig13 (norm=output) trained on "
         "CIFAR-10 like fig6_train — α × L, β = 1, m/d = 1, d = 256; each run trains every LR of "
         "task.lrs (Adam, 3e-5 … 1e-2, 5000 steps, batch 256) as one batched model.  The study: "
         "best accuracy ≈ 55 % at every α and L, like Pre-Norm (science.md §4 fig13)."),
        analyses=(
            "fig6 --rank-experiment fig13 --train-experiment fig13_train --figure 13",
        ),
        claims=claims.FIG13_TRAIN,
        needs=Needs(cifar10=True, train=True, gpu_full=True),
        reads=('fig13',),
    ),
    Experiment(
        "fig14",
        "Figure 14: the pairwise cosine field of the branch means",
        "science.md §4 fig14",
        ("Figure 14: the full pairwise matrix cos(m_l, m_l′) of the branch means m_l (mean over n "
         "probe inputs of the branch output, science.md §2.6), Pre-RMSNorm, d = 256, L = 512, n = "
         "4096, 3 seeds, m/d = 4, drawn at every 8th layer.  (a) M = 1 ReLU: a uniform field at "
         "the coherence c = 1/π (the study: off-diagonal mean 0.320), no decay with layer "
         "separation; (b) M = 2 ReLU: mean 0.002; (c) a centred activation (tanh, E[σ] = 0, M = "
         "1): mean −0.000."),
        analyses=(
            "cos_field --experiment fig14",
        ),
        claims=claims.FIG14,
    ),
    Experiment(
        "fig15",
        "Figure 15: centring, not rescaling, keeps M = 1 rank",
        "science.md §4 fig15",
        ("Figure 15: representation rank erank(Z_l)/d of one-matrix ReLU branches (M = 1, σ(W x)), "
         "d = 256, L = 512, n = 1024 probe inputs, 3 seeds (science.md §4 fig15). (a) pre- "
         "LayerNorm vs pre-RMSNorm: both collapse (the study at l = 512: 0.078 vs 0.009); (b) Pre- "
         "RMSNorm fixed, branch-output op B ∈ {meansub, layernorm, rmsnorm, none} (the general "
         "block, Eq. 17): meansub and layernorm keep 0.745, rmsnorm 0.008, none 0.009 — the "
         "centring matters, the rescaling does not."),
        analyses=(
            "centring --experiment fig15",
        ),
        claims=claims.FIG15,
    ),
    Experiment(
        "fig17",
        "Figure 17: Marchenko–Pastur per activation",
        "science.md §4 fig17",
        ("Figure 17: Gram eigenvalues of the masked up-projection D·W_up of one Pre-Norm block at "
         "a Gaussian input against Marchenko–Pastur at γ = p·m/d (science.md §2.7, §4 fig17), for "
         "relu/gelu/silu/abs × m/d ∈ {2, 4, 8}, d = 512, 40 seeds (depth 1: every seed one draw). "
         "The study: exact for relu and abs, approximate for gelu and silu."),
        analyses=(
            "mp --experiment fig17",
        ),
        claims=claims.FIG17,
    ),
    Experiment(
        "tab2",
        "Table 2: the post-residual ops' Jacobians",
        "science.md §4 tab2",
        ("Table 2: the Jacobians of the post-residual ops at gain 1 (science.md §1 table), each "
         "closed form checked against autograd (torch.func) at Gaussian inputs with a nonzero "
         "mean, d = 256, 8 seeds: rmsnorm removes x̂ (and rescales by √d/‖x‖), detached removes "
         "nothing (pure rescaling), meansub removes 1 (no rescale), layernorm removes both x̂_c "
         "and 1."),
        analyses=(
            "table2 --experiment tab2",
        ),
        claims=claims.TAB2,
    ),
    Experiment(
        "tab3",
        "Table 3: rank-one projections along a random walk",
        "science.md §4 tab3",
        ("Table 3: erank/d of a product of L rank-one projections Π_l (I − x_l x_lᵀ), x_l a random "
         "walk on the unit sphere with step ε (science.md §4 tab3; x ← (x + ε g/√d)/‖·‖, whose "
         "angle is ≈ arctan ε — walk=angle turns by exactly ε) — the projection part of the Post- "
         "Norm Jacobian when the stream direction moves by ε per block — d = 256, 2 seeds, L ∈ "
         "{48, 96, 192, 384} read off one walk per seed.  The study: no collapse (ε = 0.01, 0.15: "
         "0.996 at every L; ε = 0.30: 0.996/0.996/0.995/0.995; ε = 0.60: 0.994/0.992/0.988/0.980)."),
        analyses=(
            "table3 --experiment tab3",
        ),
        claims=claims.TAB3,
    ),
)
