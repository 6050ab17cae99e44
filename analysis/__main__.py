"""``python -m analysis <command> --experiment NAME [options]`` — figures from logged runs."""

from __future__ import annotations

import argparse
import logging
import sys

from rankexp.tracking import TrackingError

from . import heatmap
from .isorank import collapse_command, isorank_command
from .meanfield import (
    deep_linear_command,
    mf_bn_command,
    mf_phase_command,
    mf_relu_collapse_command,
    mf_residual_command,
    mf_spectrum_command,
    mf_trainability_command,
)
from .paths_spike import paths_command, spike_command
from .placements import placements_command
from .profiles import accumulated_command, profiles_command, stream_command
from .report import report_command
from .spectra_tables import mp_command, table1_command, table6_command
from .training import curves_command, fig6_command, fig16_command, table5_command

COMMANDS = {
    "heatmap": (heatmap, "heatmap of a metric over two params, one panel per norm placement"),
    "fig6": (fig6_command, "Figure 6: rank heatmap beside best-accuracy heatmap, one row per placement"),
    "table5": (table5_command, "Table 5: max stable learning rate per (placement, depth), per α and max over α"),
    "fig16": (fig16_command, "Figure 16: best test accuracy vs depth, one line per (M, norm placement)"),
    "curves": (curves_command, "test accuracy and train loss vs step, one line per LR, of one train run"),
    "paths": (paths_command, "Figure 3: path-order profiles μ_k per β/α and ⟨k⟩ vs βα^M with the uncorrelated prediction"),
    "spike": (spike_command, "Figure 7: mean spike — cross-layer cosines vs c, ‖Σ m_k‖ vs l, erank(Z_l)/d vs l, per M and σ"),
    "mp": (mp_command, "Figures 8/9/17: erank(J_f)/d vs m/d and γ = p·m/d; Marchenko–Pastur histograms of D W_up"),
    "table1": (table1_command, "Table 1: c, 1/c, p, κ by quadrature beside the measured stable rank of σ(W h)"),
    "table6": (table6_command, "Table 6: erank(Z_l)/d at each width d and layer l (M = 1 representation collapse)"),
    "profiles": (profiles_command, "Figure 1: erank(∂h_l/∂h_0)/d vs layer, panels skip × β, lines per m/d"),
    "collapse": (collapse_command, "Figure 2b/5d: a metric vs βα^M or βα^M√L, and how exact the collapse is"),
    "isorank": (isorank_command, "Figure 5c/Table 4: iso-rank contours over (α, L) and their power-law slopes"),
    "stream": (stream_command, "Figure 11: Pre-Norm stream growth rms² − 1 vs (βα^M)² l, fitted vs theory κ"),
    "accumulated": (accumulated_command, "Figure 5b/12: accumulated branch vs depth, with the uncorrelated prediction"),
    "placements": (placements_command, "Figure 4: erank by norm placement/op and α, and the projection split"),
    # the mean-field lab (science.md §5)
    "mf_phase": (mf_phase_command, "phase diagram: measured χ₁ and ξ_c over (σ_w², σ_b²), critical line and ξ_c contours"),
    "mf_relu_collapse": (mf_relu_collapse_command, "critical ReLU 1 − c_l vs l against the exact map and 9π²/(2l²)"),
    "mf_spectrum": (mf_spectrum_command, "Var(λ) table of ∂h_L/∂h_0 beside L(v_W + v_D), log λ histograms"),
    "mf_bn": (mf_bn_command, "BN at init: per-layer gradient norms, ratio first/last vs depth, shattered-gradient autocorrelation"),
    "mf_residual": (mf_residual_command, "residual ReLU: stream variance vs (1+β²)^l, correlation vs the map and its ODE limit"),
    "mf_trainability": (mf_trainability_command, "best CIFAR-10 accuracy over (σ_w², L) with L = 6 ξ_c overlaid"),
    "deep_linear": (deep_linear_command, "deep-linear learning time T(N, a₀) by quadrature, asymptote, simulated chains"),
    "report": (report_command, "reproduction report: every experiment's figures, tables, config and the study's claims checked (HTML + Markdown)"),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m analysis", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    for name, (module, help_) in COMMANDS.items():
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.add_argument("--experiment", "-e", nargs="+", default=["rankexp"],
                        help="MLflow experiment name(s) (default: rankexp)")
        sp.add_argument("--uri", default=None,
                        help="tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///./mlflow.db)")
        sp.add_argument("--filter", default="", help="MLflow search filter, e.g. \"params.width = '256'\"")
        sp.add_argument("--out", default="figures", help="output folder (default: figures/<experiment>/)")
        module.add_arguments(sp)
        sp.set_defaults(run=module.main)
    return p


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parser().parse_args(argv)
    try:
        args.run(args)
    except (TrackingError, KeyError) as e:
        print(f"error: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
