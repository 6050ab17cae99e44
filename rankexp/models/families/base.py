"""What a model family declares (torch-free): the one seam between a family and the rest.
Its probes are those that declare it (:attr:`rankexp.probes.catalog.Probe.families`); its config
rules live with every other rule in :mod:`rankexp.config.checks`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...probes import PROBES
from ...probes.catalog import ModelShape
from ..spec import effective_beta, hidden_width, nominal_ratio

#: the inputs a family's probes see: Gaussian vectors drawn per seed, or CIFAR-10 images
GAUSSIAN = "gaussian"
CIFAR10 = "cifar10"


@dataclass(frozen=True)
class Family:
    """One model family; every ``settings`` below is a typed ``RankexpConfig``.

    Attributes:
        name: ``model.name`` (``conf/model/<name>.yaml``).  schema: the ``model`` node's dataclass.
        builder: ``"module:function"`` of ``fn(settings, device, seeds=None, dtype=None) ->
            nn.Module`` (imported on first use).  tasks: the tasks it accepts.
        run_name: a single run's name (``post·α1·β1·L48·d256``).
        memory_shape: ``fn(settings, itemsize, deferred_spectra) -> ModelShape | ConvShape``.
        derived: params derived from the config, logged with the run (βα^M, …), or None.
        checks_fit: one seed is checked against the device's memory before the run.
        inputs: :data:`GAUSSIAN` or :data:`CIFAR10`.  default_probes: ``task=measure``'s
            default (None: :data:`rankexp.probes.DEFAULT_PROBES`).
        streams: its builder takes ``streamed=True`` (weights drawn block by block).
    """

    name: str
    schema: type
    builder: str
    tasks: tuple[str, ...]
    run_name: Callable[[Any], str]
    memory_shape: Callable[[Any, int, bool], Any]
    derived: Callable[[Any], Mapping[str, float]] | None = None
    checks_fit: bool = True
    inputs: str = GAUSSIAN
    default_probes: tuple[str, ...] | None = None
    streams: bool = False

    def build(self, s: Any, device: Any = "cpu", seeds=None, dtype=None,
              streamed: bool = False) -> Any:
        """The network ``s`` describes, on ``device`` (the builder imported now); ``streamed``
        only where the family :attr:`streams`.

        Raises:
            ValueError: ``streamed`` for a family whose builder does not stream.
        """
        if streamed and not self.streams:
            raise ValueError(f"model={self.name} does not draw its weights block by block")
        module, _, attr = self.builder.partition(":")
        kw = {"streamed": True} if streamed else {}
        return getattr(importlib.import_module(module), attr)(s, device, seeds=seeds, dtype=dtype, **kw)

    @property
    def probes(self) -> tuple[str, ...]:
        """The probes that declare this family, in the registry's order."""
        return tuple(n for n, p in PROBES.items() if self.name in p.families)


def branch_params(s: Any, matrices: int) -> dict[str, float]:
    """``beta_eff`` (depth-scaled β), ``nominal_ratio`` βα^M (Eq. 21) with a branch of
    ``matrices`` weight matrices, and ``depth_factor`` βα^M√L."""
    beta = effective_beta(s.beta, s.depth, s.beta_scaling.value)
    ratio = nominal_ratio(beta, s.alpha, matrices)
    return {"beta_eff": beta, "nominal_ratio": ratio, "depth_factor": ratio * s.depth**0.5}


def mlp_shape(s: Any, itemsize: int, deferred: bool) -> ModelShape:
    """One seed of a width-d, depth-L network of d×m branches, as the memory estimates see it
    (m: :func:`rankexp.models.spec.hidden_width`)."""
    return ModelShape(s.width, s.depth, hidden_width(s.width, s.expansion, s.matrices),
                      s.matrices, s.skip_every, itemsize, deferred)
