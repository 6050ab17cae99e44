"""Table 3: rank of a product of rank-one projections along a random walk on the sphere.

Post-Norm's ``J_R = (√d/‖s‖)(I − ŝŝᵀ)`` (Table 2) removes ŝ_l at every block. The probe
measures ``erank(Q_L)/d`` of ``Q_L = Π (I − x_l x_lᵀ)`` with ``x_0`` uniform and walk
``gaussian`` (``x_l ∝ x_{l−1} + ε g_l/√d``, our reading of Table 3's step ε) or ``angle``
(a turn of exactly ε per step).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from ..result import Measurement
from ..seeding import seeded_generator
from ..spectra import erank_from_sv
from .base import ProbeContext

#: random stream of the walk (:func:`rankexp.seeding.seeded_generator`; 0–3 and 16 are taken)
STREAM_WALK = 17
WALKS = ("gaussian", "angle")


def sphere_walk(seeds: Sequence[int], width: int, steps: int, step: float, walk: str = "gaussian",
                *, dtype=torch.float64, device="cpu") -> Tensor:
    """Unit vectors ``(E, steps+1, d)`` of a walk on the sphere, member e from ``seeds[e]``'s :data:`STREAM_WALK`.

    Raises:
        ValueError: an unknown ``walk``.
    """
    if walk not in WALKS:
        raise ValueError(f"task.options.projection_walk.walk={walk!r}: allowed {', '.join(WALKS)}")
    walks = []
    for s in seeds:
        g = torch.randn(steps + 1, width, generator=seeded_generator(s, STREAM_WALK), dtype=torch.float64)
        x = [g[0] / g[0].norm()]
        for l in range(1, steps + 1):
            if walk == "gaussian":
                y = x[-1] + step * g[l] / np.sqrt(width)
                x.append(y / y.norm())
            else:
                v = g[l] - (g[l] @ x[-1]) * x[-1]
                x.append(np.cos(step) * x[-1] + np.sin(step) * v / v.norm())
        walks.append(torch.stack(x))
    return torch.stack(walks).to(device=device, dtype=dtype)


def projection_product_eranks(x: Tensor, depths: Sequence[int]) -> Tensor:
    """erank(Q_L)/d ``(E, len(depths))`` of ``Π_{l≤L}(I − x_l x_lᵀ)`` for each L of ``depths``, by
    rank-one updates.
    """
    e, _, d = x.shape
    q = torch.eye(d, dtype=x.dtype, device=x.device).expand(e, d, d).clone()
    want, out = sorted(set(int(L) for L in depths)), {}
    for l in range(1, want[-1] + 1):
        u = x[:, l, :, None]
        q -= u @ (u.mT @ q)
        if l in want:
            out[l] = erank_from_sv(torch.linalg.svdvals(q)) / d
    return torch.stack([out[int(L)] for L in depths], 1)


def probe_projection_walk(ctx: ProbeContext) -> Measurement:
    """Table 3: erank/d of the random-walk projection product at the configured L's.

    Options ``step_angle`` ε, ``walk``, ``depths``; d = ``width``; the task's network is not used.

    Raises:
        ValueError: an L < 1, ε outside (0, π/2], or an unknown walk.
    """
    opt = ctx.probe_options("projection_walk")
    eps, depths = float(opt["step_angle"]), [int(L) for L in opt["depths"]]
    if not depths or min(depths) < 1:
        raise ValueError(f"task.options.projection_walk.depths={depths}: need lengths L ≥ 1")
    if not 0 < eps <= np.pi / 2:
        raise ValueError(f"task.options.projection_walk.step_angle={eps}: need 0 < ε ≤ π/2")
    x = sphere_walk(ctx.model.seeds, ctx.width, max(depths), eps, str(opt["walk"]),
                    dtype=ctx.h0.dtype, device=ctx.h0.device)
    er = projection_product_eranks(x, depths)
    m = Measurement()
    m.add_seed_series("walk_erank", er, depths)
    for k, L in enumerate(depths):
        m.add_seed_stat(f"walk_erank_L{L}", er[:, k])
    m.add_seed_stat("walk_erank_final", er[:, int(np.argmax(depths))])
    cos = (x[:, 1:] * x[:, :-1]).sum(-1).clamp(-1, 1)
    m.add_seed_stat("walk_step_angle", torch.arccos(cos).mean(1))
    m.add_seed_stat("walk_span_angle", torch.arccos((x[:, 0] * x[:, -1]).sum(-1).clamp(-1, 1)))
    return m
