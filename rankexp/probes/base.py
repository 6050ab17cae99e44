"""What every probe shares: the network under test and lazily computed intermediates.

A *probe* is a pure function ``probe(ctx: ProbeContext) -> Measurement`` (tensors in, numbers
out); the registry that names them is :data:`rankexp.probes.PROBES`.  Probes share expensive
intermediate results through :class:`ProbeContext` (the forward sweep of
:mod:`rankexp.probes.jacobian` is computed once, on first use).

Every per-seed quantity is reduced to a mean (``name``) and a standard deviation over seeds
(``name_std``); the raw per-seed arrays are kept for the artifact file.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

import numpy as np
from torch import Tensor

from ..models.mlp import ResidualMLP
from ..result import Measurement
from ..seeding import gaussian_input
from .jacobian import ForwardSweep, forward_sweep


def probe_options(options: dict, name: str, defaults: dict) -> dict:
    """``options[name]`` (the ``task.options.<name>`` mapping) merged over ``defaults``.

    Raises:
        ValueError: a key the probe does not know (lists the allowed ones).
    """
    given = dict(options.get(name) or {})
    unknown = set(given) - set(defaults)
    if unknown:
        raise ValueError(
            f"task.options.{name}: unknown key(s) {sorted(unknown)}; allowed: {sorted(defaults)}"
        )
    return {**defaults, **given}


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
        """The one forward sweep over all blocks (:func:`rankexp.probes.jacobian.forward_sweep`)."""
        return forward_sweep(self.model, self.h0, progress=None)

    @property
    def width(self) -> int:
        return self.model.width

    def probe_options(self, name: str, defaults: dict) -> dict:
        """``task.options.<name>`` merged over ``defaults`` (:func:`probe_options`)."""
        return probe_options(self.options, name, defaults)

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
