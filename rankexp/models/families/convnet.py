"""``model=cifar_resnet``: He et al.'s CIFAR-10 ResNets and plain ConvNets (the degradation
replication; :mod:`rankexp.models.convnet`)."""

from __future__ import annotations

from dataclasses import dataclass

from ...probes.catalog import ConvShape
from .base import CIFAR10, Family


@dataclass
class CifarResNetModel:
    """``model=cifar_resnet``: He et al.'s (2016, §4.2) CIFAR-10 ConvNet of depth 6n+2
    (:class:`rankexp.models.convnet.CifarResNet`), shaped by ``depth`` (6n+2), ``seed(s)``,
    ``dtype`` and its own ``residual`` (option-A shortcuts or none) and ``base_width`` (stage-1
    filters); the MLP's knobs (``width``, ``alpha``, ``norm`` …) are not used."""

    name: str = "cifar_resnet"
    residual: bool = True
    base_width: int = 16


def run_name(s) -> str:
    """``resnet·L110·train`` / ``plain·L56·lr0.1`` (``·w32`` at another base width)."""
    name = f"{'resnet' if s.model.residual else 'plain'}·L{s.depth}"
    if s.model.base_width != 16:
        name += f"·w{s.model.base_width}"
    return name + ("·" + s.task.name if s.lr is None else f"·lr{s.lr:g}")


FAMILY = Family(
    name="cifar_resnet", schema=CifarResNetModel, builder="rankexp.models.build:build_cifar_resnet",
    tasks=("measure", "train"), run_name=run_name,
    memory_shape=lambda s, itemsize, deferred: ConvShape(s.depth, s.model.base_width, itemsize),
    inputs=CIFAR10,
)
