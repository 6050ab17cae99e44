"""Probes: the measurements a ``task=measure`` job can run (``task.probes``).

The registry is explicit here — probe modules never import it, so there is no import circle
and no registration by side effect.  Each entry is a :class:`~rankexp.probes.base.Probe`: the
function ``fn(ctx: ProbeContext) -> Measurement``, the intermediates it *needs* (the task
computes exactly their union: see :mod:`rankexp.probes.base`), how it pools seeds (``reduce``)
and its per-seed working memory (for seed chunking).

To add a probe: write ``fn`` in a module of its family, declare its needs (a sweep need of
:data:`rankexp.probes.jacobian.SWEEP_NEEDS`, a fold registered in :data:`FOLDS`, or none), and
add one line below.  Its options are the ``options`` it declares (their defaults): the config
schema of ``task.options.<probe>`` is built from them (:func:`rankexp.config.options_schema`), so
``task.options.representation.n=512`` overrides as typed and an unknown key is refused, listing
the allowed ones, before any run exists.
"""

from __future__ import annotations

from . import branch, gradients, meanfield, paths, representation, sweep
from .base import FoldFactory, Probe, ProbeContext, needs_of
from .jacobian import BRANCH_NORMS, BRANCH_SUM, IO_JACOBIAN, PARTIAL_SPECTRA

#: per-layer folds a probe can need by name; each runs inside the one shared sweep
FOLDS: dict[str, FoldFactory] = {
    "path_orders": paths.PathOrderFold,
}

#: probe name (as in ``task.probes``) → probe
PROBES: dict[str, Probe] = {
    "io_jacobian": Probe(sweep.probe_io_jacobian, frozenset({IO_JACOBIAN})),
    "profile": Probe(sweep.probe_profile, frozenset({PARTIAL_SPECTRA})),
    "stream": Probe(sweep.probe_stream, memory=sweep.stream_memory, options=sweep.STREAM_OPTIONS),
    "branch_ratio": Probe(sweep.probe_branch_ratio, frozenset({BRANCH_NORMS})),
    "accumulated_branch": Probe(sweep.probe_accumulated_branch, frozenset({BRANCH_NORMS, BRANCH_SUM})),
    "path_order": Probe(paths.probe_path_order, frozenset({"path_orders", IO_JACOBIAN, BRANCH_NORMS}),
                        memory=paths.path_order_memory, options=paths.PATH_ORDER_OPTIONS),
    "representation": Probe(representation.probe_representation,
                            reduce=representation.reduce_representation,
                            memory=representation.representation_memory,
                            options=representation.REPRESENTATION_OPTIONS),
    "backward_representation": Probe(representation.probe_backward_representation,
                                     memory=representation.backward_representation_memory,
                                     options=representation.BACKWARD_REPRESENTATION_OPTIONS),
    "branch_jacobian": Probe(branch.probe_branch_jacobian, reduce=branch.reduce_branch_jacobian,
                             memory=branch.branch_jacobian_memory,
                             options=branch.BRANCH_JACOBIAN_OPTIONS),
    "activation_spike": Probe(branch.probe_activation_spike, reduce=branch.reduce_activation_spike,
                              memory=branch.activation_spike_memory,
                              options=branch.ACTIVATION_SPIKE_OPTIONS),
    "projection_split": Probe(branch.probe_projection_split, reduce=branch.reduce_projection_split,
                              memory=branch.projection_split_memory),
    # the textbook chapter's mean-field lab (model=plain; science.md §5): they pool over all
    # seeds at once (fits, histograms), so their seeds are never split into memory chunks
    "correlation": Probe(meanfield.probe_correlation, splits_seeds=False,
                         options=meanfield.CORRELATION_DEFAULTS),
    "jacobian_spectrum": Probe(meanfield.probe_jacobian_spectrum, splits_seeds=False,
                               options=meanfield.SPECTRUM_DEFAULTS),
    "deep_linear": Probe(meanfield.probe_deep_linear, splits_seeds=False,
                         options=meanfield.DEEP_LINEAR_DEFAULTS),
    "gradient_norms": Probe(gradients.probe_gradient_norms, splits_seeds=False,
                            options=gradients.GRADIENT_NORMS_OPTIONS),
    "shattered": Probe(gradients.probe_shattered, splits_seeds=False,
                       options=gradients.SHATTERED_OPTIONS),
}

#: probes of the mean-field lab that need ``model=plain`` (``deep_linear`` needs no network)
PLAIN_PROBES = ("correlation", "jacobian_spectrum", "gradient_norms", "shattered")
#: probes that differentiate one input per member: a batchnorm has no batch there
ONE_INPUT_PROBES = ("io_jacobian", "profile", "stream", "branch_ratio", "accumulated_branch",
                    "path_order", "branch_jacobian", "projection_split", "jacobian_spectrum")

#: what ``task=measure`` runs when ``task.probes`` is not given
DEFAULT_PROBES = ("io_jacobian", "profile", "stream", "branch_ratio")

__all__ = ["DEFAULT_PROBES", "FOLDS", "ONE_INPUT_PROBES", "PLAIN_PROBES", "PROBES", "Probe",
           "ProbeContext", "needs_of"]
