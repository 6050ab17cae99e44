"""Probes that read the one forward sweep (:func:`rankexp.probes.jacobian.forward_sweep`), and
the forward-only ``stream`` probe.
"""

from __future__ import annotations

import numpy as np
import torch

from ..result import Measurement
from .base import ProbeContext
from .jacobian import state_rms


def probe_io_jacobian(ctx: ProbeContext) -> Measurement:
    """Normalized effective rank (Eq. 3) and stable rank of ``∂h_L/∂h_0`` (Eq. 2/10).

    ``erank_io`` (erank/d), ``stable_rank_io``, ``log_gain_io`` (ln ‖·‖_F), ``io_singular_values``
    (E, d) at unit-Frobenius scale."""
    sw, m = ctx.sweep, Measurement()
    m.add_seed_stat("erank_io", sw.erank[:, -1] / ctx.width)
    m.add_seed_stat("stable_rank_io", sw.stable_rank[:, -1])
    m.add_seed_stat("log_gain_io", sw.log_gain[:, -1])
    m.add_seed_array("io_singular_values", sw.io_singular_values)
    return m


def probe_profile(ctx: ProbeContext) -> Measurement:
    """Per-layer profile ``erank(∂h_l/∂h_0)/d`` and stable rank for l = 1…L (Figure 1)."""
    sw, m = ctx.sweep, Measurement()
    m.add_seed_series("erank_profile", sw.erank / ctx.width, ctx.layers)
    m.add_seed_series("stable_rank_profile", sw.stable_rank, ctx.layers)
    m.add_seed_series("log_gain_profile", sw.log_gain, ctx.layers)
    m.add_seed_stat("erank_min", (sw.erank / ctx.width).amin(1))
    return m


def probe_stream(ctx: ProbeContext) -> Measurement:
    """Stream scale ``rms(h_l)`` for l = 0…L (Figure 11), forward only.

    Option ``inputs`` (default 1: the seed's ``h_0``; n: root mean rms² over n Gaussian inputs).
    ``stream_kappa``: least-squares slope of ``rms(h_l)² − rms(h_0)²`` against ``(βα^M)² l``
    (Pre-Norm: ``rms(h_l)² = 1 + κ(βα^M)² l``).
    """
    n = int(ctx.probe_options("stream")["inputs"])
    h0 = ctx.h0 if n == 1 else ctx.probe_inputs(n)
    with torch.no_grad():
        rms = torch.stack([state_rms(h0)] + [state_rms(h) for _, h in ctx.model.states(h0)], 1)
    m = Measurement()
    m.add_seed_series("rms", rms, np.arange(0, ctx.model.depth + 1))
    m.add_seed_stat("rms_final", rms[:, -1])
    x = torch.as_tensor(ctx.model.nominal_ratio**2 * np.arange(0, ctx.model.depth + 1), dtype=rms.dtype)
    y = rms.square() - rms[:, :1].square()
    m.add_seed_stat("stream_kappa", (y * x).sum(1) / x.square().sum())
    return m


def probe_branch_ratio(ctx: ProbeContext) -> Measurement:
    """Branch-to-skip ratio ``r_l = ‖β J_l‖_F / ‖I‖_F`` per layer (Eq. 4), step = l."""
    sw, m = ctx.sweep, Measurement()
    m.add_seed_series("branch_ratio", sw.branch_ratio, ctx.layers)
    m.add_seed_stat("branch_ratio_first", sw.branch_ratio[:, 0])
    m.add_seed_stat("branch_ratio_last", sw.branch_ratio[:, -1])
    return m


def probe_accumulated_branch(ctx: ProbeContext) -> Measurement:
    """Accumulated branch norm ``‖Σ_{l≤k} β J_l‖_F / ‖I‖_F`` against the uncorrelated
    prediction ``(Σ_{l≤k} ‖β J_l‖_F²)^{1/2} / ‖I‖_F`` (Figure 5b/12).

    ``accumulated_branch_excess`` is their ratio at L (1: uncorrelated, > 1: coherent).
    """
    sw, m = ctx.sweep, Measurement()
    uncorrelated = sw.branch_ratio.square().cumsum(1).sqrt()
    m.add_seed_series("accumulated_branch", sw.accumulated_branch, ctx.layers)
    m.add_seed_series("accumulated_branch_uncorrelated", uncorrelated, ctx.layers)
    m.add_seed_stat("accumulated_branch_final", sw.accumulated_branch[:, -1])
    m.add_seed_stat("accumulated_branch_excess", sw.accumulated_branch[:, -1] / uncorrelated[:, -1])
    return m
