"""Probes: the measurements a ``task=measure`` job can run (``task.probes``).

The registry is explicit here — probe modules never import it, so there is no import circle
and no registration by side effect.  A probe is ``fn(ctx) -> Measurement``: the MLP's take a
:class:`ProbeContext`, the CIFAR ConvNets' (``convnet.py``; which family runs which probe:
``rankexp.config.FAMILY_PROBES``) an :class:`ImageProbeContext`.
"""

from __future__ import annotations

from . import branch, convnet, paths, representation, sweep
from .base import Probe, ProbeContext
from .convnet import ImageProbeContext

#: probe name (as in ``task.probes``) → probe function
PROBES: dict[str, Probe] = {
    "io_jacobian": sweep.probe_io_jacobian,
    "profile": sweep.probe_profile,
    "stream": sweep.probe_stream,
    "branch_ratio": sweep.probe_branch_ratio,
    "accumulated_branch": sweep.probe_accumulated_branch,
    "path_order": paths.probe_path_order,
    "representation": representation.probe_representation,
    "backward_representation": representation.probe_backward_representation,
    "branch_jacobian": branch.probe_branch_jacobian,
    "activation_spike": branch.probe_activation_spike,
    "projection_split": branch.probe_projection_split,
    "layer_response": convnet.probe_layer_response,
    "init_gradient_norms": convnet.probe_init_gradient_norms,
    "lesion": convnet.probe_lesion,
}

#: the probes a model family's networks run (every probe not listed here is the MLP's)
FAMILY_PROBES: dict[str, tuple[str, ...]] = {
    "cifar_resnet": ("layer_response", "init_gradient_norms", "lesion"),
}
#: probes of a trained network (task=train only, after training)
TRAINED_PROBES = ("lesion",)
#: probes of the initial network (under task=train they run before the first step)
INIT_PROBES = ("init_gradient_norms",)

#: what ``task=measure`` runs when ``task.probes`` is not given
DEFAULT_PROBES = ("io_jacobian", "profile", "stream", "branch_ratio")

__all__ = ["DEFAULT_PROBES", "FAMILY_PROBES", "INIT_PROBES", "PROBES", "TRAINED_PROBES", "ImageProbeContext", "Probe", "ProbeContext"]
