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
The CIFAR ConvNets' probes (``convnet.py``, :data:`CIFAR_PROBES`) take an
:class:`~rankexp.probes.convnet.ImageProbeContext` (the network and CIFAR-10 on its device)
instead; they need no sweep and declare their memory on a
:class:`~rankexp.probes.convnet.ConvShape`.
"""

from __future__ import annotations

from . import (
    branch,
    convnet,
    ffn,
    gradients,
    meanfield,
    norm_jacobian,
    paths,
    representation,
    sweep,
    walk,
)
from .base import FoldFactory, Probe, ProbeContext, needs_of
from .convnet import ImageProbeContext
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
    # Table 2 (the post-residual ops' Jacobians vs autograd) and Table 3 (random-walk projections)
    "norm_jacobian": Probe(norm_jacobian.probe_norm_jacobian, memory=norm_jacobian.norm_jacobian_memory,
                           options=norm_jacobian.NORM_JACOBIAN_DEFAULTS),
    "projection_walk": Probe(walk.probe_projection_walk, memory=walk.projection_walk_memory,
                             options=walk.WALK_DEFAULTS),
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
    # Hugging Face causal LMs (model=gpt2): FFN-branch Jacobians along the stream (Figure 12)
    "ffn_jacobian": Probe(ffn.probe_ffn_jacobian, memory=ffn.ffn_memory, options=ffn.FFN_JACOBIAN_OPTIONS),
    # He et al.'s degradation replication (model=cifar_resnet; science.md §5): per member on
    # CIFAR-10 itself, so seeds split into chunks like the MLP's; memory from the ConvNet's shape
    "layer_response": Probe(convnet.probe_layer_response, memory=convnet.layer_response_memory,
                            options=convnet.LAYER_RESPONSE_OPTIONS),
    "init_gradient_norms": Probe(convnet.probe_init_gradient_norms,
                                 memory=convnet.init_gradient_norms_memory,
                                 options=convnet.INIT_GRADIENT_NORMS_OPTIONS),
    "lesion": Probe(convnet.probe_lesion, memory=convnet.lesion_memory, options=convnet.LESION_OPTIONS),
}

#: probes of the mean-field lab that need ``model=plain`` (``deep_linear`` needs no network)
PLAIN_PROBES = ("correlation", "jacobian_spectrum", "gradient_norms", "shattered")
#: probes of a causal LM (``model=gpt2``); the only ones that run on it
LM_PROBES = ("ffn_jacobian",)
#: probes that differentiate one input per member: a batchnorm has no batch there
ONE_INPUT_PROBES = ("io_jacobian", "profile", "stream", "branch_ratio", "accumulated_branch",
                    "path_order", "branch_jacobian", "projection_split", "jacobian_spectrum",
                    "norm_jacobian")
#: the probes of the CIFAR ConvNets (model=cifar_resnet), and the only ones it runs
CIFAR_PROBES = ("layer_response", "init_gradient_norms", "lesion")
#: probes of a trained network (task=train only, after training)
TRAINED_PROBES = ("lesion",)
#: probes of the initial network (under task=train they run before the first step)
INIT_PROBES = ("init_gradient_norms",)

#: what ``task=measure`` runs when ``task.probes`` is not given
DEFAULT_PROBES = ("io_jacobian", "profile", "stream", "branch_ratio")
#: ``model.name`` → its default ``task.probes`` where it differs from :data:`DEFAULT_PROBES`
FAMILY_DEFAULT_PROBES = {"gpt2": LM_PROBES}


def default_probes(family: str) -> list[str]:
    """Resolver ``rankexp_default_probes``: the ``task.probes`` of ``conf/task/measure.yaml`` for
    model family ``family``."""
    return list(FAMILY_DEFAULT_PROBES.get(str(family), DEFAULT_PROBES))

__all__ = ["CIFAR_PROBES", "DEFAULT_PROBES", "FAMILY_DEFAULT_PROBES", "FOLDS", "INIT_PROBES",
           "LM_PROBES", "ONE_INPUT_PROBES", "PLAIN_PROBES", "PROBES", "TRAINED_PROBES",
           "ImageProbeContext", "Probe", "ProbeContext", "default_probes", "needs_of"]
