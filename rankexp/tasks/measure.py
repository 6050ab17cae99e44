"""The ``measure`` task: run the chosen probes on a freshly initialized network.

The MLP families are probed with Gaussian inputs (:class:`~rankexp.probes.ProbeContext`); the
CIFAR ConvNets on CIFAR-10 itself (:class:`~rankexp.probes.ImageProbeContext`)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..models import build_model
from ..models.convnet import CifarResNet
from ..models.mlp import ResidualMLP
from ..probes import DEFAULT_PROBES, PROBES, ImageProbeContext, ProbeContext
from ..result import Measurement
from ..seeding import gaussian_input
from .data import dataset_for

if TYPE_CHECKING:
    from ..config import RankexpConfig

log = logging.getLogger(__name__)


def run_probes(
    model: ResidualMLP,
    probes: Sequence[str] = DEFAULT_PROBES,
    *,
    h0: Tensor | None = None,
    options: dict | None = None,
    progress: Callable[[str], None] | None = None,
    context: ImageProbeContext | None = None,
) -> Measurement:
    """Run ``probes`` on ``model`` with one Gaussian input per seed (or in ``context``).

    Args:
        model: the network; its members are the seeds.
        probes: names from :data:`PROBES`.
        h0: inputs ``(E, 1, d)``; default: standard Gaussian drawn from each seed.
        options: probe options passed through :class:`ProbeContext`.
        context: the context the probes get instead of a :class:`ProbeContext` (a ConvNet's
            :class:`ImageProbeContext`; ``h0`` and ``options`` are then not used).

    Raises:
        KeyError: an unknown probe name (lists the known ones).
    """
    unknown = [p for p in probes if p not in PROBES]
    if unknown:
        raise KeyError(f"unknown probe(s) {unknown}; known: {sorted(PROBES)}")
    ctx = context
    if ctx is None:
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


def task_measure(s: RankexpConfig, device: torch.device, job_dir: Path, run: Any, chash: str) -> Measurement:
    """``task=measure``: build the seeds-batched network and run ``task.probes``."""
    model = build_model(s, device)
    context = None
    if isinstance(model, CifarResNet):  # measured on CIFAR-10 itself
        dtype = next(model.parameters()).dtype
        context = ImageProbeContext(model, dataset_for(s, device, dtype), s.task.options)
    t0 = time.perf_counter()
    result = run_probes(model, s.task.probes, options=s.task.options,
                        progress=lambda p: log.info("probe %s", p), context=context)
    result.scalars["measure_seconds"] = time.perf_counter() - t0
    return result
