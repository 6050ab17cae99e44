"""What every probe shares: the network under test, and the intermediates probes declare.

A probe is ``fn(ctx: ProbeContext) -> Measurement``; its ``needs`` name sweep intermediates
(``ctx.sweep``) or layer folds (``ctx.fold(name)``), computed once, on first use, for the union
of the needs. Pooled quantities come from ``Probe.reduce`` after every seed chunk is joined.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import cached_property
from typing import Any

import numpy as np
from torch import Tensor

from ..models.mlp import ResidualMLP
from ..seeding import gaussian_input
from .catalog import probe_options
from .jacobian import SWEEP_NEEDS, ForwardSweep, LayerJacobian, forward_sweep, layer_jacobians

#: a layer fold's factory: ``factory(ctx)`` is an accumulator whose ``step(lj)`` gets every block's
#: :class:`LayerJacobian` in order and whose ``result()`` is read after the last
FoldFactory = Callable[["ProbeContext"], Any]


class ProbeContext:
    """The network under test (``model``, E members = seeds, inputs ``h0`` ``(E, 1, d)``) plus the
    lazily computed intermediates its probes declared (``needs``; ``None``: every sweep need).

    Raises:
        ValueError: a need that is neither a sweep need nor a known fold.
    """

    def __init__(self, model: ResidualMLP, h0: Tensor, options: dict | None = None,
                 needs: Iterable[str] | None = None, folds: Mapping[str, FoldFactory] | None = None):
        self.model, self.h0, self.options = model, h0, dict(options or {})
        self.folds = dict(folds or {})
        self.needs = SWEEP_NEEDS if needs is None else frozenset(needs)
        unknown = self.needs - SWEEP_NEEDS - set(self.folds)
        if unknown:
            raise ValueError(f"unknown need(s) {sorted(unknown)}; known: "
                             f"{sorted(SWEEP_NEEDS | set(self.folds))}")
        self._fold_results: dict[str, Any] = {}

    @cached_property
    def sweep(self) -> ForwardSweep:
        """The one forward sweep, computing exactly the declared sweep needs and folds."""
        active = {n: self.folds[n](self) for n in sorted(self.needs & set(self.folds))}

        def feed(lj: LayerJacobian) -> None:
            for f in active.values():
                f.step(lj)

        sweep = forward_sweep(self.model, self.h0, needs=self.needs & SWEEP_NEEDS,
                              on_layer=feed if active else None, progress=None)
        self._fold_results.update({n: f.result() for n, f in active.items()})
        return sweep

    def fold(self, name: str) -> Any:
        """The result of layer fold ``name`` (KeyError: unknown): from the shared sweep when
        declared, else its own walk."""
        if name not in self._fold_results:
            if name in self.needs and "sweep" not in self.__dict__:
                self.sweep  # noqa: B018 — runs the sweep, which fills every declared fold
            else:
                f = self.folds[name](self)
                for lj in layer_jacobians(self.model, self.h0):
                    f.step(lj)
                self._fold_results[name] = f.result()
        return self._fold_results[name]

    @property
    def width(self) -> int:
        return self.model.width

    def probe_options(self, name: str, defaults: dict | None = None) -> dict:
        """``task.options.<name>`` merged over ``defaults`` (default: the declared ones;
        ValueError: an unknown key)."""
        return probe_options(self.options, name, defaults)

    def probe_inputs(self, n: int) -> Tensor:
        """n ≥ 2 standard Gaussian probe inputs per member ``(E, n, d)`` (``STREAM_INPUT``)."""
        if n < 2:
            raise ValueError(f"n={n} probe inputs: need at least 2")
        return gaussian_input(self.model.seeds, self.width, batch=int(n), dtype=self.h0.dtype,
                              device=self.h0.device)

    @property
    def layers(self) -> np.ndarray:
        return np.arange(1, self.model.depth + 1)
