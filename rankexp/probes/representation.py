"""Residual representations of many probe inputs and their mean spike (Figure 7/14/15, Table 6),
and the backward analogue on per-input gradients (Appendix C). Branch means aligned across
layers (one-matrix branches, Table 1's c) sum ∝ l and collapse ``Z_l``; random ones sum ∝ √l.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from ..models.mlp import Block, ResidualMLP
from ..result import Measurement
from ..seeding import seeded_generator
from ..spectra import erank_from_sv, gram_eigenvalues
from ..theory import activation_constants
from .base import ProbeContext

#: random stream of the backward probe's δ_L, head and labels (0–3 are the model's)
STREAM_BACKWARD = 16


def stack_spectrum(z: Tensor) -> tuple[Tensor, Tensor]:
    """``(erank(Z)/d, s_1²/Σ s_k²)`` of uncentered stacks ``Z`` ``(E, n, d)`` → two ``(E,)``, from the smaller Gram matrix."""
    d = z.shape[-1]
    ev = gram_eigenvalues(z).flip(-1)
    er = erank_from_sv(ev.sqrt()) / d
    return er, ev[..., 0] / ev.sum(-1)


def _tiny(x: Tensor) -> float:
    return torch.finfo(x.dtype).tiny


def _cos(a: Tensor, b: Tensor) -> Tensor:
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1)).clamp(min=_tiny(a))


def _loglog_slope(y: Tensor) -> Tensor:
    """Least-squares slope of ``ln y_l`` vs ``ln l``, l = 1…n, for ``y`` ``(E, n)`` → ``(E,)``."""
    x = torch.log(torch.arange(1, y.shape[1] + 1, dtype=y.dtype, device=y.device))
    x = x - x.mean()
    ly = torch.log(y.clamp(min=_tiny(y)))
    return ((ly - ly.mean(1, keepdim=True)) * x).sum(1) / x.square().sum()


def _run_block(model: ResidualMLP, l: int, block: Block, states: dict[int, Tensor]
) -> tuple[Tensor, Tensor]:
    """Block l on the stored states: ``(β B(f(P(h_{l−1}))), h_l)``."""
    x = states[l - 1]
    b = block.branch(x)
    s = b + states[model.skip_source(l)] if block.has_skip else b
    return b, block.res_norm(s)


def representation(model: ResidualMLP, h0: Tensor) -> dict[str, Tensor]:
    """Stream the probe inputs ``h0`` ``(E, n, d)`` through the network once (memory
    ``O(E·n·(d + m) + E·L·d)``): ``erank``/``top_energy`` of ``Z_l`` ``(E, L+1)``, ``branch_means``
    ``(E, L, d)`` and their ``noise_floor``, per-input cosines of branch outputs across layers
    (``input_cos_prev``, ``input_cos_cross``), and ``preact_var`` (Table 1's q) ``(E,)``.
    """
    (e, n, _), L, keep = h0.shape, model.depth, max(model.skip_every, 1)
    states, spectra = {0: h0}, [stack_spectrum(h0)]
    means, floor, cos_prev, q = [], [], [], []
    unit_sum = torch.zeros_like(h0)
    with torch.no_grad():
        for l, block in enumerate(model.blocks, start=1):
            # E_W[(w·x)²] = α² rms(x)² for w ~ N(0, α²/d): no extra matmul needed
            q.append(model.alpha**2 * block.pre_norm(states[l - 1]).square().mean((-2, -1)))
            b, states[l] = _run_block(model, l, block, states)
            states.pop(l - keep, None)
            spectra.append(stack_spectrum(states[l]))
            means.append(b.mean(1))
            floor.append((b.square().sum(-1).mean(1) / n).sqrt())
            unit = b / b.norm(dim=-1, keepdim=True).clamp(min=_tiny(b))
            if l == 1:
                cos_prev.append(torch.full((e,), math.nan, dtype=h0.dtype, device=h0.device))
            else:
                cos_prev.append((unit * unit_sum).sum(-1).mean(1) / (l - 1))
            unit_sum += unit
    cross = ((unit_sum.square().sum(-1) - L) / (L * (L - 1)) if L > 1
             else torch.full((e, n), math.nan, dtype=h0.dtype))
    er, top = zip(*spectra, strict=True)
    return {"erank": torch.stack(er, 1), "top_energy": torch.stack(top, 1),
            "branch_means": torch.stack(means, 1), "noise_floor": torch.stack(floor, 1),
            "input_cos_prev": torch.stack(cos_prev, 1), "input_cos_cross": cross.mean(1),
            "preact_var": torch.stack(q, 1).mean(1)}


def output_gradient(model: ResidualMLP, h_last: Tensor, kind: str = "random", classes: int = 10
) -> Tensor:
    """Per-input output cotangent ``δ_L`` ``(E, n, d)`` (Appendix C) from each seed's :data:`STREAM_BACKWARD`:
    ``random`` ``N(0, I_d)``, or ``cross_entropy`` of a random head with random labels.

    Raises:
        ValueError: unknown ``kind`` or ``classes < 2``.
    """
    e, n, d = h_last.shape
    dt, dev = h_last.dtype, h_last.device
    if kind == "random":
        rows = [torch.randn(n, d, generator=seeded_generator(s, STREAM_BACKWARD),
                            dtype=torch.float64) for s in model.seeds]
        return torch.stack(rows).to(dtype=dt, device=dev)
    if kind == "cross_entropy":
        if classes < 2:
            raise ValueError(f"classes={classes} must be ≥ 2")
        out = []
        for i, s in enumerate(model.seeds):
            g = seeded_generator(s, STREAM_BACKWARD)
            w = (torch.randn(classes, d, generator=g, dtype=torch.float64) / math.sqrt(d)).to(
                dtype=dt, device=dev)
            y = torch.randint(classes, (n,), generator=g).to(dev)
            p = torch.softmax(h_last[i] @ w.T, dim=-1)
            p[torch.arange(n, device=dev), y] -= 1.0
            out.append(p @ w)
        return torch.stack(out)
    raise ValueError(f"delta={kind!r} is not one of random, cross_entropy")


def backward_representation(model: ResidualMLP, h0: Tensor, *, delta: str = "random",
                            classes: int = 10) -> dict[str, Tensor]:
    """Backpropagate ``δ_L`` (states recomputed every ``⌈√L⌉`` blocks) and measure every ``δ_l``
    ``(E, n, d)`` (Appendix C), each ``(E, L+1)``: ``erank`` (erank(Δ_l)/d), ``top_energy``,
    ``log_rms`` (ln rms(δ_l)), ``mean_snr`` (‖mean δ_l‖/sqrt(E‖δ_l‖²/n)), ``mean_cos_ones``.
    """
    L, keep = model.depth, max(model.skip_every, 1)
    seg = max(1, math.isqrt(L - 1) + 1)
    # forward pass keeping a window of `keep` states at every segment start
    ckpt: dict[int, dict[int, Tensor]] = {}
    states = {0: h0}
    with torch.no_grad():
        for l, block in enumerate(model.blocks, start=1):
            if (l - 1) % seg == 0:
                ckpt[l - 1] = {j: states[j] for j in range(max(0, l - keep), l)}
            states[l] = _run_block(model, l, block, states)[1]
            states.pop(l - keep, None)
    deltas = {L: output_gradient(model, states.pop(L), delta, classes)}
    del states
    stats: dict[int, tuple] = {}

    def measure(j: int) -> None:
        g = deltas[j]
        mean, floor = g.mean(1), (g.square().sum(-1).mean(1) / g.shape[1]).sqrt()
        stats[j] = (*stack_spectrum(g), g.square().mean((-2, -1)).sqrt().log(),
                    mean.norm(dim=-1) / floor, _cos(mean, torch.ones_like(mean)))

    measure(L)
    for start in sorted(ckpt, reverse=True):
        stop = min(start + seg, L)
        seg_states = dict(ckpt[start])
        with torch.no_grad():
            for l in range(start + 1, stop + 1):
                seg_states[l] = _run_block(model, l, model.blocks[l - 1], seg_states)[1]
        for l in range(stop, start, -1):
            block = model.blocks[l - 1]
            with torch.enable_grad():
                x = seg_states[l - 1].detach().requires_grad_(True)
                skip_from = model.skip_source(l) if block.has_skip else None
                if skip_from is not None:
                    src = (seg_states[skip_from] if skip_from in seg_states  # else a window
                           else next(w[skip_from] for w in ckpt.values() if skip_from in w))
                    s = src.detach().requires_grad_(True)
                    out = block(x, s)
                    gx, gs = torch.autograd.grad(out, (x, s), deltas[l])
                    deltas[skip_from] = deltas[skip_from] + gs if skip_from in deltas else gs
                else:
                    out = block(x)
                    (gx,) = torch.autograd.grad(out, (x,), deltas[l])
            deltas[l - 1] = deltas[l - 1] + gx if (l - 1) in deltas else gx
            del deltas[l]
            measure(l - 1)
    return {k: torch.stack([stats[j][i] for j in range(L + 1)], 1) for i, k in enumerate(
        ("erank", "top_energy", "log_rms", "mean_snr", "mean_cos_ones"))}


def probe_representation(ctx: ProbeContext) -> Measurement:
    """Residual representation ``Z_l`` and the branch-mean spike (Figure 7/14/15, Table 6).

    Option ``n`` (probe inputs). ``branch_input_cos_cross``: Table 1 predicts c for M = 1, 0 for
    M = 2; ``branch_mean_sum_exponent``: 1 for aligned means, ½ for random ones.
    """
    opt = ctx.probe_options("representation")
    rep = representation(ctx.model, ctx.probe_inputs(int(opt["n"])))
    L, layers, means = ctx.model.depth, ctx.layers, rep["branch_means"]
    mean_norm, mean_sum_norm = means.norm(dim=-1), means.cumsum(1).norm(dim=-1)
    cos_ones = _cos(means, torch.ones_like(means))
    m = Measurement()
    m.add_seed_series("rep_erank", rep["erank"], np.arange(0, L + 1))
    m.add_seed_series("rep_top_energy", rep["top_energy"], np.arange(0, L + 1))
    m.add_seed_stat("rep_erank_final", rep["erank"][:, -1])
    m.add_seed_stat("rep_erank_min", rep["erank"].amin(1))
    m.add_seed_stat("rep_top_energy_final", rep["top_energy"][:, -1])
    m.add_seed_series("branch_mean_norm", mean_norm, layers)
    m.add_seed_series("branch_mean_noise_floor", rep["noise_floor"], layers)
    m.add_seed_series("branch_mean_sum_norm", mean_sum_norm, layers)
    m.add_seed_series("branch_mean_cos_ones", cos_ones, layers)
    m.add_seed_stat("branch_mean_cos_ones_mean", cos_ones.mean(1))
    m.add_seed_stat("branch_mean_sum_exponent", _loglog_slope(mean_sum_norm))
    m.add_seed_stat("branch_mean_snr", (mean_norm / rep["noise_floor"]).mean(1))
    if L > 1:
        cos_next = _cos(means[:, :-1], means[:, 1:])
        m.add_seed_series("branch_mean_cos_next", cos_next, layers[:-1])
        m.add_seed_stat("branch_mean_cos_consecutive", cos_next.mean(1))
        m.add_seed_series("branch_input_cos_prev", rep["input_cos_prev"][:, 1:], layers[1:])
        m.add_seed_stat("branch_input_cos_cross", rep["input_cos_cross"])
        u = means / means.norm(dim=-1, keepdim=True).clamp(min=_tiny(means))
        cm = u @ u.mT  # pairwise cos(m_l, m_k)
        off = (cm.sum((1, 2)) - cm.diagonal(dim1=1, dim2=2).sum(1)) / (L * (L - 1))
        m.add_seed_stat("branch_mean_cos_cross", off)
        m.add_seed_array("branch_mean_cos_matrix", cm)
    m.add_seed_array("preact_var", rep["preact_var"])
    return m


def reduce_representation(m: Measurement, ctx: ProbeContext) -> None:
    """Pooled over seeds: ``coherence_theory`` = c at the seeds' mean preactivation variance."""
    q = float(m.arrays["preact_var"].mean())
    m.scalars["coherence_theory"] = activation_constants(ctx.model.activation, q).coherence


def probe_backward_representation(ctx: ProbeContext) -> Measurement:
    """Per-input gradients ``δ_l = ∂ℓ/∂h_l`` as an n×d stack (Appendix C).

    Options ``n``, ``delta`` (``random`` | ``cross_entropy``), ``classes``.
    """
    opt = ctx.probe_options("backward_representation")
    br = backward_representation(ctx.model, ctx.probe_inputs(int(opt["n"])),
                                 delta=str(opt["delta"]), classes=int(opt["classes"]))
    m = Measurement()
    for key, v in br.items():
        m.add_seed_series(f"grad_{key}", v, np.arange(0, ctx.model.depth + 1))
    m.add_seed_stat("grad_erank_input", br["erank"][:, 0])
    m.add_seed_stat("grad_erank_min", br["erank"].amin(1))
    m.add_seed_stat("grad_top_energy_input", br["top_energy"][:, 0])
    m.add_seed_stat("grad_log_gain", br["log_rms"][:, 0] - br["log_rms"][:, -1])
    return m
