"""Probes: the measurements a ``task=measure`` job can run (``task.probes``).

The registry is explicit here — probe modules never import it, so there is no import circle
and no registration by side effect.  A probe is ``fn(ctx: ProbeContext) -> Measurement``.
"""

from __future__ import annotations

from . import branch, gradients, meanfield, paths, representation, sweep
from .base import Probe, ProbeContext

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
    # the textbook chapter's mean-field lab (model=plain; science.md §5)
    "correlation": meanfield.probe_correlation,
    "jacobian_spectrum": meanfield.probe_jacobian_spectrum,
    "deep_linear": meanfield.probe_deep_linear,
    "gradient_norms": gradients.probe_gradient_norms,
    "shattered": gradients.probe_shattered,
}

#: probes of the mean-field lab that need ``model=plain`` (``deep_linear`` needs no network)
PLAIN_PROBES = ("correlation", "jacobian_spectrum", "gradient_norms", "shattered")
#: probes that differentiate one input per member: a batchnorm has no batch there
ONE_INPUT_PROBES = ("io_jacobian", "profile", "stream", "branch_ratio", "accumulated_branch",
                    "path_order", "branch_jacobian", "projection_split", "jacobian_spectrum")

#: what ``task=measure`` runs when ``task.probes`` is not given
DEFAULT_PROBES = ("io_jacobian", "profile", "stream", "branch_ratio")

__all__ = ["DEFAULT_PROBES", "ONE_INPUT_PROBES", "PLAIN_PROBES", "PROBES", "Probe", "ProbeContext"]
