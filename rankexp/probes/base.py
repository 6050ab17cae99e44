"""What every probe shares: the network under test, and the intermediates probes *declare*.

A probe is a pure function ``fn(ctx: ProbeContext) -> Measurement`` (tensors in, numbers out),
registered in :data:`rankexp.probes.PROBES` as a :class:`Probe` together with what it needs.

**The "needs" mechanism.**  A probe never triggers work it did not declare.  Its
:attr:`Probe.needs` names intermediates of two kinds:

* *sweep needs* — what the one forward sweep (:func:`rankexp.probes.jacobian.forward_sweep`)
  can compute: ``io_jacobian``, ``partial_spectra``, ``branch_norms``, ``branch_sum``
  (:data:`rankexp.probes.jacobian.SWEEP_NEEDS`); the probe reads them from ``ctx.sweep``;
* *layer folds* — a per-layer accumulation fed each block's
  :class:`~rankexp.probes.jacobian.LayerJacobian` during that same sweep (the path-order
  dynamic program), registered by name in :data:`rankexp.probes.FOLDS` as a factory
  ``factory(ctx) -> LayerFold``; the probe reads its result with ``ctx.fold(name)``.

The task computes the union of the needs of the probes it runs (:func:`needs_of`) and hands it
to :class:`ProbeContext`, which runs the sweep once, on first use, with exactly that union
and every requested fold.  A probe with no needs (stream, representation, branch Jacobian,
spike, projection split) walks the network itself and costs nothing when it is not run.
A later probe family plugs in the same way: declare a new sweep need (extend the engine), or a
fold (any per-layer consumer of block Jacobians — e.g. GPT-2 FFN Jacobians' pairwise cosines),
or nothing.

**Seeds.**  Every per-seed quantity is reduced to a mean (``name``) and a standard deviation
over seeds (``name_std``) with the raw per-seed arrays kept (``Measurement.add_seed_*``).  A
quantity pooled over seeds (a Marchenko–Pastur fit over every seed's eigenvalues, a theory
value at the seeds' mean preactivation variance) is computed by the probe's :attr:`Probe.reduce`
from per-seed arrays, after the seeds of all memory chunks are joined
(:func:`rankexp.tasks.measure.measure_seeds`), so chunking seeds never changes a number.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import cached_property
from typing import Any, Protocol

import numpy as np
from torch import Tensor

from ..models.mlp import ResidualMLP
from ..seeding import gaussian_input
from .catalog import (  # noqa: F401 — the torch-free declarations, re-exported
    MemoryEstimate,
    ModelShape,
    Probe,
    needs_of,
    probe_options,
    sweep_memory,
)
from .jacobian import SWEEP_NEEDS, ForwardSweep, LayerJacobian, forward_sweep, layer_jacobians


class LayerFold(Protocol):
    """A per-layer consumer of the sweep: ``step`` is called with every block's Jacobian pieces
    in order, ``result`` once after the last block."""

    def step(self, lj: LayerJacobian) -> None: ...

    def result(self) -> Any: ...


#: a fold's factory: builds the empty accumulator for a context (reads its options, shapes)
FoldFactory = Callable[["ProbeContext"], LayerFold]


class ProbeContext:
    """The network under test plus the lazily computed intermediates its probes declared.

    Args:
        model: the :class:`ResidualMLP` (E members = seeds).
        h0: Gaussian inputs ``(E, 1, d)``, one per seed.
        options: the probe options from ``task.options`` (free-form mapping).
        needs: the union of the probes' needs; ``None`` = every sweep need (a context built by
            hand, e.g. in a test, behaves like v1's: the sweep computes everything).
        folds: fold factories by name (:data:`rankexp.probes.FOLDS`).

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
        """The result of layer fold ``name``: from the shared sweep when it was declared, else
        from a walk of its own (so a probe called outside the task still works).

        Raises:
            KeyError: an unknown fold.
        """
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

    def probe_options(self, name: str, defaults: dict) -> dict:
        """``task.options.<name>`` merged over ``defaults``.

        Raises:
            ValueError: a key the probe does not know (lists the allowed ones).
        """
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
