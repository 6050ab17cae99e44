"""``python -m analysis <command> --experiment NAME [options]`` — figures from logged runs."""

from __future__ import annotations

import argparse
import logging
import sys

from rankexp.tracking import TrackingError

from . import heatmap
from .training import curves_command, fig6_command, fig16_command, table5_command

COMMANDS = {
    "heatmap": (heatmap, "heatmap of a metric over two params, one panel per norm placement"),
    "fig6": (fig6_command, "Figure 6: rank heatmap beside best-accuracy heatmap, one row per placement"),
    "table5": (table5_command, "Table 5: max stable learning rate per (placement, depth), per α and max over α"),
    "fig16": (fig16_command, "Figure 16: best test accuracy vs depth, one line per (M, norm placement)"),
    "curves": (curves_command, "test accuracy and train loss vs step, one line per LR, of one train run"),
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
