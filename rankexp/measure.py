"""The ``measure`` task: run the chosen probes on a freshly initialized network.

A *probe* is a function ``probe(ctx) -> Measurement`` registered under a name
with :func:`register_probe`; ``task.probes`` in the config lists which run.
Probes share expensive intermediate results through :class:`ProbeContext`
(the forward sweep of :mod:`rankexp.jacobian` is computed once, on first use).
Probes are pure: tensors in, numbers out; logging happens in :mod:`rankexp.tracking`.

Every per-seed quantity is reduced to a mean (``name``) and a standard
deviation over seeds (``name_std``); the raw per-seed arrays are kept for the
artifact file.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch
from torch import Tensor

from .jacobian import ForwardSweep, forward_sweep
from .model import ResidualMLP, gaussian_input

log = logging.getLogger(__name__)


@dataclass
class Measurement:
    """A plain result: what probes return and what tracking logs.

    Attributes:
        scalars: name → float (MLflow metrics at step 0).
        series: name → (steps, values), 1-D arrays of equal length; ``steps`` is the
            layer index l (or path order k) so MLflow draws profiles directly.
        arrays: name → raw array (per seed), saved as ``.npz``.
    """

    scalars: dict[str, float] = field(default_factory=dict)
    series: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def update(self, other: Measurement) -> None:
        for mine, theirs in (
            (self.scalars, other.scalars),
            (self.series, other.series),
            (self.arrays, other.arrays),
        ):
            clash = mine.keys() & theirs.keys()
            if clash:
                raise ValueError(f"two probes produced the same key(s): {sorted(clash)}")
            mine.update(theirs)

    def add_seed_stat(self, name: str, per_seed: Tensor) -> None:
        """Add mean and std over seeds of a per-seed scalar ``(E,)``, and keep the raw values."""
        v = per_seed.detach().double().cpu().numpy()
        self.scalars[name] = float(v.mean())
        self.scalars[f"{name}_std"] = float(v.std(ddof=1)) if v.size > 1 else 0.0
        self.arrays[name] = v

    def add_seed_series(self, name: str, per_seed: Tensor, steps: Sequence[int]) -> None:
        """Add the mean and std over seeds of a per-seed series ``(E, n)``, keep the raw values."""
        v = per_seed.detach().double().cpu().numpy()
        steps = np.asarray(steps)
        self.series[name] = (steps, v.mean(0))
        if v.shape[0] > 1:
            self.series[f"{name}_std"] = (steps, v.std(0, ddof=1))
        self.arrays[name] = v


class ProbeContext:
    """The network under test plus lazily computed shared intermediates.

    Attributes:
        model: the :class:`ResidualMLP` (E members = seeds).
        h0: Gaussian inputs ``(E, 1, d)``, one per seed.
        options: the probe options from ``task.options`` (free-form mapping).
    """

    def __init__(self, model: ResidualMLP, h0: Tensor, options: dict | None = None):
        self.model, self.h0, self.options = model, h0, dict(options or {})

    @cached_property
    def sweep(self) -> ForwardSweep:
        """The one forward sweep over all blocks (:func:`rankexp.jacobian.forward_sweep`)."""
        return forward_sweep(self.model, self.h0, progress=None)

    @property
    def width(self) -> int:
        return self.model.width

    def probe_options(self, name: str, defaults: dict) -> dict:
        """``task.options.<name>`` merged over ``defaults``.

        Raises:
            ValueError: a key the probe does not know (lists the allowed ones).
        """
        given = dict(self.options.get(name) or {})
        unknown = set(given) - set(defaults)
        if unknown:
            raise ValueError(
                f"task.options.{name}: unknown key(s) {sorted(unknown)}; allowed: {sorted(defaults)}"
            )
        return {**defaults, **given}

    def probe_inputs(self, n: int) -> Tensor:
        """n standard Gaussian probe inputs per member ``(E, n, d)`` (stream ``STREAM_INPUT``).

        Raises:
            ValueError: n < 2.
        """
        if n < 2:
            raise ValueError(f"n={n} probe inputs: need at least 2")
        return gaussian_input(self.model.seeds, self.width, batch=int(n), dtype=self.h0.dtype,
                              device=self.h0.device)

    @property
    def layers(self) -> np.ndarray:
        return np.arange(1, self.model.depth + 1)


Probe = Callable[[ProbeContext], Measurement]
PROBES: dict[str, Probe] = {}


def register_probe(name: str) -> Callable[[Probe], Probe]:
    """Register ``fn(ctx) -> Measurement`` as the probe ``name`` (selectable in ``task.probes``)."""

    def deco(fn: Probe) -> Probe:
        if name in PROBES:
            raise ValueError(f"probe {name!r} registered twice")
        PROBES[name] = fn
        return fn

    return deco


# --------------------------------------------------------------------------- first probes
@register_probe("io_jacobian")
def probe_io_jacobian(ctx: ProbeContext) -> Measurement:
    """Normalized effective rank (Eq. 3) and stable rank of ``∂h_L/∂h_0`` (Eq. 2/10).

    Scalars: ``erank_io`` = erank/d ∈ (0, 1], ``stable_rank_io`` ∈ [1, d],
    ``log_gain_io`` = ln ‖∂h_L/∂h_0‖_F.  Arrays: ``io_singular_values`` (E, d), unit-Frobenius scale.
    """
    sw, m = ctx.sweep, Measurement()
    m.add_seed_stat("erank_io", sw.erank[:, -1] / ctx.width)
    m.add_seed_stat("stable_rank_io", sw.stable_rank[:, -1])
    m.add_seed_stat("log_gain_io", sw.log_gain[:, -1])
    m.arrays["io_singular_values"] = sw.io_singular_values.double().cpu().numpy()
    return m


@register_probe("profile")
def probe_profile(ctx: ProbeContext) -> Measurement:
    """Per-layer profile ``erank(∂h_l/∂h_0)/d`` and stable rank for l = 1…L (Figure 1).

    Series (step = l): ``erank_profile``, ``stable_rank_profile``, ``log_gain_profile``.
    Scalar ``erank_min`` = the profile's minimum (its deepest trough).
    """
    sw, m = ctx.sweep, Measurement()
    m.add_seed_series("erank_profile", sw.erank / ctx.width, ctx.layers)
    m.add_seed_series("stable_rank_profile", sw.stable_rank, ctx.layers)
    m.add_seed_series("log_gain_profile", sw.log_gain, ctx.layers)
    m.add_seed_stat("erank_min", (sw.erank / ctx.width).amin(1))
    return m


@register_probe("stream")
def probe_stream(ctx: ProbeContext) -> Measurement:
    """Stream scale ``rms(h_l)`` for l = 0…L (Figure 11).

    Pre-Norm prediction ``rms(h_l)² = 1 + κ(βα^M)² l`` (science.md §2 item 3):
    scalar ``stream_kappa`` is the least-squares slope of ``rms(h_l)² − rms(h_0)²``
    against ``(βα^M)² l`` through the origin (meaningful for Pre-Norm).
    """
    sw, m = ctx.sweep, Measurement()
    rms = sw.rms
    m.add_seed_series("rms", rms, np.arange(0, ctx.model.depth + 1))
    m.add_seed_stat("rms_final", rms[:, -1])
    x = torch.as_tensor(ctx.model.nominal_ratio**2 * np.arange(0, ctx.model.depth + 1), dtype=rms.dtype)
    y = rms.square() - rms[:, :1].square()
    m.add_seed_stat("stream_kappa", (y * x).sum(1) / x.square().sum())
    return m


@register_probe("branch_ratio")
def probe_branch_ratio(ctx: ProbeContext) -> Measurement:
    """Branch-to-skip ratio ``r_l = ‖β J_l‖_F / ‖I‖_F`` per layer (Eq. 4), step = l.

    Scalars ``branch_ratio_first`` (r_1) and ``branch_ratio_last`` (r_L); compare
    with the nominal ``βα^M`` (Eq. 21) and the Pre-Norm decay of Eq. 22.
    """
    sw, m = ctx.sweep, Measurement()
    m.add_seed_series("branch_ratio", sw.branch_ratio, ctx.layers)
    m.add_seed_stat("branch_ratio_first", sw.branch_ratio[:, 0])
    m.add_seed_stat("branch_ratio_last", sw.branch_ratio[:, -1])
    return m


@register_probe("accumulated_branch")
def probe_accumulated_branch(ctx: ProbeContext) -> Measurement:
    """Accumulated branch norm ``‖Σ_{l≤k} β J_l‖_F / ‖I‖_F`` against the uncorrelated
    prediction ``(Σ_{l≤k} ‖β J_l‖_F²)^{1/2} / ‖I‖_F`` (science.md §2 item 4; Figure 5b/12).

    Series (step = k): ``accumulated_branch``, ``accumulated_branch_uncorrelated``.
    Scalar ``accumulated_branch_excess`` = measured / uncorrelated at k = L (1 when the
    layers' branch Jacobians are uncorrelated; > 1 when they add coherently).
    Post-Norm keeps r_l flat, so the sum grows ∝ √L; Pre-Norm's decaying r_l keeps it flat.
    """
    sw, m = ctx.sweep, Measurement()
    uncorrelated = sw.branch_ratio.square().cumsum(1).sqrt()
    m.add_seed_series("accumulated_branch", sw.accumulated_branch, ctx.layers)
    m.add_seed_series("accumulated_branch_uncorrelated", uncorrelated, ctx.layers)
    m.add_seed_stat("accumulated_branch_final", sw.accumulated_branch[:, -1])
    m.add_seed_stat("accumulated_branch_excess", sw.accumulated_branch[:, -1] / uncorrelated[:, -1])
    return m


DEFAULT_PROBES = ("io_jacobian", "profile", "stream", "branch_ratio")


def run_probes(
    model: ResidualMLP,
    probes: Sequence[str] = DEFAULT_PROBES,
    *,
    h0: Tensor | None = None,
    options: dict | None = None,
    progress: Callable[[str], None] | None = None,
) -> Measurement:
    """Run ``probes`` on ``model`` with one Gaussian input per seed.

    Args:
        model: the network; its members are the seeds.
        probes: names from :data:`PROBES`.
        h0: inputs ``(E, 1, d)``; default: standard Gaussian drawn from each seed.
        options: probe options passed through :class:`ProbeContext`.

    Raises:
        KeyError: an unknown probe name (lists the known ones).
    """
    unknown = [p for p in probes if p not in PROBES]
    if unknown:
        raise KeyError(f"unknown probe(s) {unknown}; known: {sorted(PROBES)}")
    if h0 is None:
        p = next(model.parameters())
        h0 = gaussian_input(model.seeds, model.width, dtype=p.dtype, device=p.device)
    ctx = ProbeContext(model, h0, options)
    out = Measurement()
    for name in probes:
        if progress:
            progress(name)
        out.update(PROBES[name](ctx))
    for k, v in out.scalars.items():
        if not math.isfinite(v):
            log.warning("probe result %s = %s is not finite", k, v)
    return out


from . import branch, paths, representation  # noqa: E402,F401  (registers probes)
