"""The ``measure`` task: run the chosen probes on a freshly initialized network."""

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
from ..models.mlp import ResidualMLP
from ..probes import DEFAULT_PROBES, PROBES, ProbeContext
from ..result import Measurement
from ..seeding import gaussian_input

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


def task_measure(s: RankexpConfig, device: torch.device, job_dir: Path, run: Any, chash: str) -> Measurement:
    """``task=measure``: build the seeds-batched network and run ``task.probes``."""
    model = build_model(s, device)
    t0 = time.perf_counter()
    result = run_probes(model, s.task.probes, options=s.task.options,
                        progress=lambda p: log.info("probe %s", p))
    result.scalars["measure_seconds"] = time.perf_counter() - t0
    return result
