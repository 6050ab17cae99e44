"""Probes: the measurements a job can run (``task.probes``), declared once in :data:`PROBES`.

Each entry is a :class:`~rankexp.probes.catalog.Probe`: ``fn(ctx) -> Measurement`` (named
``"module:function"``, imported on first use), the intermediates it *needs*, how it pools seeds
(``reduce``), its per-seed memory, its options, and the families and tasks it runs on. This
package imports only the torch-free :mod:`~rankexp.probes.catalog`; the config schema of
``task.options.<probe>`` is built from the declared options.

To add a probe: write ``probe_<name>`` (and ``reduce_<name>`` to pool seeds) in a module of its
family, declare its options and ``<name>_memory`` in :mod:`~rankexp.probes.catalog`, and add one
line below (a CIFAR ConvNet's probe takes an :class:`~rankexp.probes.convnet.ImageProbeContext`).
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
    "profile": Probe(Ref("sweep:probe_profile"), frozenset({PARTIAL_SPECTRA}), inputs="one",
                     streams=True),
    "stream": Probe(Ref("sweep:probe_stream"), inputs="one"),
    "branch_ratio": Probe(Ref("sweep:probe_branch_ratio"), frozenset({BRANCH_NORMS}), inputs="one",
                          streams=True),
    "accumulated_branch": Probe(Ref("sweep:probe_accumulated_branch"),
                                frozenset({BRANCH_NORMS, BRANCH_SUM}), inputs="one", streams=True),
    "path_order": Probe(Ref("paths:probe_path_order"),
                        frozenset({PATH_ORDERS, IO_JACOBIAN, BRANCH_NORMS}), inputs="one"),
    "representation": Probe(Ref("representation:probe_representation")),
    "backward_representation": Probe(Ref("representation:probe_backward_representation")),
    "branch_jacobian": Probe(Ref("branch:probe_branch_jacobian"), inputs="one"),
    "activation_spike": Probe(Ref("branch:probe_activation_spike")),
    "projection_split": Probe(Ref("branch:probe_projection_split"), inputs="one"),
    # Table 2 (the post-residual ops' Jacobians vs autograd) and Table 3 (random-walk projections)
    "norm_jacobian": Probe(Ref("norm_jacobian:probe_norm_jacobian"), inputs="one"),
    "projection_walk": Probe(Ref("walk:probe_projection_walk")),
    # the chapter's mean-field lab (model=plain): they pool over all seeds at once (fits,
    # histograms), so their seeds are never split into memory chunks
    "correlation": Probe(Ref("meanfield:probe_correlation"), splits_seeds=False, families=c.PLAIN),
    "jacobian_spectrum": Probe(Ref("meanfield:probe_jacobian_spectrum"), splits_seeds=False,
                               families=c.PLAIN, inputs="one"),
    "deep_linear": Probe(Ref("meanfield:probe_deep_linear"), splits_seeds=False),
    "gradient_norms": Probe(Ref("gradients:probe_gradient_norms"), splits_seeds=False,
                            families=c.PLAIN),
    "shattered": Probe(Ref("gradients:probe_shattered"), splits_seeds=False, families=c.PLAIN),
    # zero-cost proxies of the NAS literature, measured at init beside the ranks
    "grad_norm_proxy": Probe(Ref("proxies:probe_grad_norm_proxy")),
    "jacob_cov": Probe(Ref("proxies:probe_jacob_cov")),
    "synflow": Probe(Ref("proxies:probe_synflow"), inputs="one"),
    # Hugging Face causal LMs (model=gpt2): FFN-branch Jacobians along the stream (Figure 12)
    "ffn_jacobian": Probe(Ref("ffn:probe_ffn_jacobian"), families=c.LM),
    # He et al.'s degradation replication (model=cifar_resnet), per member on CIFAR-10 itself
    "layer_response": Probe(Ref("convnet:probe_layer_response"), families=c.CONVNET),
    "init_gradient_norms": Probe(Ref("convnet:probe_init_gradient_norms"), families=c.CONVNET),
    "lesion": Probe(Ref("convnet:probe_lesion"), families=c.CONVNET, tasks=c.TRAINED),
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
