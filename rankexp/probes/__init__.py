"""Probes: the measurements a job can run (``task.probes``), declared once in :data:`PROBES`.

Each entry is a :class:`~rankexp.probes.catalog.Probe`: ``fn(ctx) -> Measurement`` (named
``"module:function"``, imported on first use), the intermediates it *needs*, how it pools seeds
(``reduce``), its per-seed memory, its options, and the families and tasks it runs on. This
package imports only the torch-free :mod:`~rankexp.probes.catalog`; the config schema of
``task.options.<probe>`` is built from the declared options.

To add a probe: write ``fn`` in a module of its family, declare its needs, options and memory in
:mod:`~rankexp.probes.catalog`, and add one line below (a CIFAR ConvNet's probe takes an
:class:`~rankexp.probes.convnet.ImageProbeContext`).
"""

from __future__ import annotations

from typing import Any

from . import catalog as c
from .catalog import (
    BRANCH_NORMS,
    BRANCH_SUM,
    IO_JACOBIAN,
    PARTIAL_SPECTRA,
    PATH_ORDERS,
    Probe,
    Ref,
    needs_of,
)

#: probe name (as in ``task.probes``) → probe
PROBES: dict[str, Probe] = {
    "io_jacobian": Probe(Ref("sweep:probe_io_jacobian"), frozenset({IO_JACOBIAN}), inputs="one",
                         streams=True),
    "profile": Probe(Ref("sweep:probe_profile"), frozenset({PARTIAL_SPECTRA}),
                     memory=c.profile_memory, inputs="one", streams=True),
    "stream": Probe(Ref("sweep:probe_stream"), memory=c.stream_memory, options=c.STREAM_OPTIONS,
                    inputs="one"),
    "branch_ratio": Probe(Ref("sweep:probe_branch_ratio"), frozenset({BRANCH_NORMS}), inputs="one",
                          streams=True),
    "accumulated_branch": Probe(Ref("sweep:probe_accumulated_branch"),
                                frozenset({BRANCH_NORMS, BRANCH_SUM}), inputs="one", streams=True),
    "path_order": Probe(Ref("paths:probe_path_order"),
                        frozenset({PATH_ORDERS, IO_JACOBIAN, BRANCH_NORMS}),
                        memory=c.path_order_memory, options=c.PATH_ORDER_OPTIONS, inputs="one"),
    "representation": Probe(Ref("representation:probe_representation"),
                            reduce_ref=Ref("representation:reduce_representation"),
                            memory=c.representation_memory, options=c.REPRESENTATION_OPTIONS),
    "backward_representation": Probe(Ref("representation:probe_backward_representation"),
                                     memory=c.backward_representation_memory,
                                     options=c.BACKWARD_REPRESENTATION_OPTIONS),
    "branch_jacobian": Probe(Ref("branch:probe_branch_jacobian"),
                             reduce_ref=Ref("branch:reduce_branch_jacobian"),
                             memory=c.branch_jacobian_memory, options=c.BRANCH_JACOBIAN_OPTIONS,
                             inputs="one"),
    "activation_spike": Probe(Ref("branch:probe_activation_spike"),
                              reduce_ref=Ref("branch:reduce_activation_spike"),
                              memory=c.activation_spike_memory, options=c.ACTIVATION_SPIKE_OPTIONS),
    "projection_split": Probe(Ref("branch:probe_projection_split"),
                              reduce_ref=Ref("branch:reduce_projection_split"),
                              memory=c.projection_split_memory, inputs="one"),
    # Table 2 (the post-residual ops' Jacobians vs autograd) and Table 3 (random-walk projections)
    "norm_jacobian": Probe(Ref("norm_jacobian:probe_norm_jacobian"), memory=c.norm_jacobian_memory,
                           options=c.NORM_JACOBIAN_DEFAULTS, inputs="one"),
    "projection_walk": Probe(Ref("walk:probe_projection_walk"), memory=c.projection_walk_memory,
                             options=c.WALK_DEFAULTS),
    # the chapter's mean-field lab (model=plain): they pool over all seeds at once (fits,
    # histograms), so their seeds are never split into memory chunks
    "correlation": Probe(Ref("meanfield:probe_correlation"), splits_seeds=False,
                         options=c.CORRELATION_DEFAULTS, families=c.PLAIN),
    "jacobian_spectrum": Probe(Ref("meanfield:probe_jacobian_spectrum"), splits_seeds=False,
                               options=c.SPECTRUM_DEFAULTS, families=c.PLAIN, inputs="one"),
    "deep_linear": Probe(Ref("meanfield:probe_deep_linear"), splits_seeds=False,
                         options=c.DEEP_LINEAR_DEFAULTS),
    "gradient_norms": Probe(Ref("gradients:probe_gradient_norms"), splits_seeds=False,
                            options=c.GRADIENT_NORMS_OPTIONS, families=c.PLAIN),
    "shattered": Probe(Ref("gradients:probe_shattered"), splits_seeds=False,
                       options=c.SHATTERED_OPTIONS, families=c.PLAIN),
    # zero-cost proxies of the NAS literature, measured at init beside the ranks
    "grad_norm_proxy": Probe(Ref("proxies:probe_grad_norm_proxy"),
                             memory=c.grad_norm_proxy_memory, options=c.GRAD_NORM_PROXY_OPTIONS),
    "jacob_cov": Probe(Ref("proxies:probe_jacob_cov"), memory=c.jacob_cov_memory,
                       options=c.JACOB_COV_OPTIONS),
    "synflow": Probe(Ref("proxies:probe_synflow"), memory=c.synflow_memory, inputs="one"),
    # Hugging Face causal LMs (model=gpt2): FFN-branch Jacobians along the stream (Figure 12)
    "ffn_jacobian": Probe(Ref("ffn:probe_ffn_jacobian"), memory=c.ffn_memory,
                          options=c.FFN_JACOBIAN_OPTIONS, families=c.LM),
    # He et al.'s degradation replication (model=cifar_resnet), per member on CIFAR-10 itself
    "layer_response": Probe(Ref("convnet:probe_layer_response"), memory=c.layer_response_memory,
                            options=c.LAYER_RESPONSE_OPTIONS, families=c.CONVNET),
    "init_gradient_norms": Probe(Ref("convnet:probe_init_gradient_norms"),
                                 memory=c.init_gradient_norms_memory,
                                 options=c.INIT_GRADIENT_NORMS_OPTIONS, families=c.CONVNET),
    "lesion": Probe(Ref("convnet:probe_lesion"), memory=c.lesion_memory, options=c.LESION_OPTIONS,
                    families=c.CONVNET, tasks=c.TRAINED),
}

#: the probes of the CIFAR ConvNets (model=cifar_resnet), and the only ones it runs
CIFAR_PROBES = tuple(n for n, p in PROBES.items() if p.families == c.CONVNET)
#: probes of a trained network (task=train only, after training)
TRAINED_PROBES = tuple(n for n, p in PROBES.items() if p.tasks == c.TRAINED)
#: probes of the initial network (under task=train they run before the first step): the
#: ConvNet's gradient norms and the zero-cost proxies
INIT_PROBES = ("init_gradient_norms", "grad_norm_proxy", "jacob_cov", "synflow")

#: what ``task=measure`` runs when ``task.probes`` is not given (a family may declare its own)
DEFAULT_PROBES = ("io_jacobian", "profile", "stream", "branch_ratio")


def __getattr__(name: str) -> Any:
    """The parts that need torch, imported on first use (PEP 562): :data:`FOLDS` (the layer folds
    probes can need by name), :class:`~.base.ProbeContext`, :class:`~.convnet.ImageProbeContext`."""
    if name == "FOLDS":
        from .paths import PathOrderFold

        value: Any = {PATH_ORDERS: PathOrderFold}
    elif name == "ProbeContext":
        from .base import ProbeContext as value
    elif name == "ImageProbeContext":
        from .convnet import ImageProbeContext as value
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


__all__ = ["CIFAR_PROBES", "DEFAULT_PROBES", "FOLDS", "INIT_PROBES", "PROBES", "TRAINED_PROBES",
           "ImageProbeContext", "Probe", "ProbeContext", "needs_of"]
