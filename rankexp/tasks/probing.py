"""Probes at ``task.probe_every``/``probe_steps`` on every member, on a copy under a forked RNG
(training unchanged)."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from ..models.mlp import ResidualMLP
from ..probes import INIT_PROBES, TRAINED_PROBES, ImageProbeContext
from ..result import Measurement
from .data import DeviceDataset
from .measure import run_probes

log = logging.getLogger(__name__)

#: folder of the per-step array files inside the job's ``result/`` (``step_000050.npz``)
PROBE_DIR = "probes"


def probes_at(step: int, probes: list[str]) -> list[str]:
    """The probes at ``step``: at 0 all but ``TRAINED_PROBES``, later all but ``INIT_PROBES``."""
    skip = TRAINED_PROBES if step == 0 else INIT_PROBES
    return [p for p in probes if p not in skip]


def probe_net(net: nn.Module, data: DeviceDataset, probes: list[str], options: dict, *,
              trained: bool) -> Measurement:
    """``probes`` of ``net`` itself: Gaussian inputs for the MLP, ``data``'s images otherwise."""
    if isinstance(net, ResidualMLP):
        return run_probes(net, probes, options=options)
    return run_probes(net, probes,
                      context=lambda m: ImageProbeContext(m, data, options, trained=trained))


def probe_members(net: nn.Module, data: DeviceDataset, probes: list[str], options: dict, *,
                  trained: bool, dtype: torch.dtype | None = None) -> Measurement:
    """``probes`` of every member of ``net`` on a copy under a forked RNG; per-member values in
    ``seed_arrays``."""
    p = next(net.parameters())
    copy_ = copy.deepcopy(net)
    if dtype is not None and isinstance(net, ResidualMLP):
        copy_.to(dtype)
    with torch.random.fork_rng(devices=[p.device] if p.device.type == "cuda" else []):
        return probe_net(copy_, data, probes, options, trained=trained)


def member_values(m: Measurement, members: int) -> dict[str, Tensor]:
    """Every per-member array of ``m`` (axis 0 = the members) as a CPU float64 tensor."""
    return {k: torch.as_tensor(np.asarray(m.arrays[k], dtype=np.float64))
            for k in sorted(m.seed_arrays) if np.ndim(m.arrays[k]) >= 1
            and np.shape(m.arrays[k])[0] == members}


def member_scalars(values: dict[str, Tensor]) -> dict[str, np.ndarray]:
    """The ``(E,)`` per-member scalars among ``values``."""
    return {k: v.numpy() for k, v in values.items() if v.ndim == 1}


def write_arrays(result_dir: Path, probes: dict[int, dict[str, Tensor]], lrs: list[float]) -> None:
    """One ``<result_dir>/probes/step_<step:06d>.npz`` per probed step (with ``lrs``)."""
    folder = result_dir / PROBE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    for step, values in probes.items():
        np.savez_compressed(folder / f"step_{step:06d}.npz", lrs=np.asarray(lrs),
                            **{k: v.numpy() for k, v in values.items()})
