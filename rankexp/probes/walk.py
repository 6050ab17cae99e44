"""Table 3: rank of a product of rank-one projections along a random walk on the sphere.

Post-Norm's Jacobian factor ``J_R = (√d/‖s‖)(I − ŝŝᵀ)`` (Table 2) removes the stream direction
ŝ_l at every block; the rank the *projections* can remove over L blocks is bounded by how far
the directions wander.  The probe ``projection_walk`` measures ``erank(Q_L)/d`` of

    Q_L = Π_{l=1}^{L} (I − x_l x_lᵀ)           (later factors on the left)

with ``x_0`` uniform on the unit sphere and one of two walks (option ``walk``):

* ``gaussian`` (default): ``x_l = (x_{l−1} + ε g_l/√d)/‖·‖``, ``g_l ~ N(0, I_d)`` — the step of
  :func:`rankexp.theory.random_walk_projection_product`, turning by ≈ arctan ε per step.  This
  reproduces the study's Table 3 to its printed digits (d = 256: ε = 0.6 → 0.994/0.992/0.988/
  0.980 at L = 48…384), so it is our reading of the study's "step angle ε";
* ``angle``: ``x_l = cos ε x_{l−1} + sin ε v_l``, v_l a uniform unit vector orthogonal to
  ``x_{l−1}`` — every step turns by exactly ε (slightly more loss at ε = 0.6: 0.972 at 384).

The study (Table 3): no collapse — ε ≤ 0.15 keeps erank/d at (d−1)/d, ε = 0.6 loses ≈ 2 % at
L = 384.
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
from .catalog import WALK_DEFAULTS

#: Random stream (see :func:`rankexp.seeding.seeded_generator`) of the walk, distinct from the
#: model's weight/input/head/data streams 0–3 and the backward probe's 16.
STREAM_WALK = 17
WALKS = ("gaussian", "angle")


def sphere_walk(seeds: Sequence[int], width: int, steps: int, step: float, walk: str = "gaussian",
                *, dtype=torch.float64, device="cpu") -> Tensor:
    """Unit vectors ``x_0 … x_steps`` of a random walk on the sphere: ``(E, steps+1, d)``.

    ``walk="gaussian"``: ``x ← (x + step·g/√d)/‖·‖``; ``walk="angle"``: turn by exactly ``step``
    radians toward a uniform direction orthogonal to x.  Member e draws from seed
    ``seeds[e]``'s :data:`STREAM_WALK` alone, so batching seeds never changes a walk.

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
    """erank(Q_L)/d of ``Q_L = Π_{l≤L}(I − x_l x_lᵀ)`` for each L of ``depths`` from one walk
    ``x`` ``(E, ≥ max(depths)+1, d)`` (``x_1 … x_L``; ``x_0`` is the start) → ``(E, len(depths))``.

    Q is built by rank-one updates ``Q ← Q − x (xᵀQ)`` (O(d²) per factor), singular values only
    at the requested L.
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

    Options (``task.options.projection_walk``): ``step_angle`` ε (default 0.15), ``walk``
    ``gaussian`` (default; step ε g/√d, the study's Table 3) or ``angle`` (turn by exactly ε
    radians), ``depths`` the products' lengths L (default 48, 96, 192, 384); d is the run's ``width``,
    one walk per seed (the network the task built is not used: give it ``depth=1``).

    Series (step = L): ``walk_erank`` erank(Q_L)/d.  Scalars: ``walk_erank_L<L>`` per L,
    ``walk_erank_final`` (the largest L), ``walk_step_angle`` (the measured mean angle between
    consecutive x_l: ε for ``angle``, ≈ arctan ε for ``gaussian``), ``walk_span_angle`` (the angle between x_0 and x_L).

    Raises:
        ValueError: an L < 1, ε outside (0, π/2], or an unknown walk.
    """
    opt = ctx.probe_options("projection_walk", WALK_DEFAULTS)
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


