"""Table 6: M = 1 representation collapse at every width: the command ``table6``, the claims and
the registry entry."""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path

import pandas as pd

from ..core import style
from ..core.claims import Claim, Measured, Runs, at_most, near
from ..core.registry import Experiment, Needs
from ..core.runner import Command, out_dir
from ..core.select import PLACEMENT, SelectionError, load, need, only, series, warn_mixed
from ..core.style import write_markdown
from . import mean_of, publish

log = logging.getLogger("analysis")


def table6(df: pd.DataFrame, uri: str | None, layers: list[int]) -> pd.DataFrame:
    """``erank(Z_l)/d`` per (matrices, activation, width) and l (the ``rep_erank`` series); an l
    beyond every run's depth is left out (SelectionError if all are)."""
    rows = []
    for _, r in df.iterrows():
        steps, values = series(uri, r["run_id"], "rep_erank")
        at = dict(zip(steps.astype(int), values, strict=True))
        rows += [{"matrices": r["matrices"], "activation": r["activation"], "d": int(r["width"]),
                  "l": l, "erank": at[l]} for l in layers if l in at]
    if not rows:
        raise SelectionError(
            f"no run reaches any of the layers {layers} (depths: {sorted(df['depth'].unique())})")
    t = pd.DataFrame(rows).groupby(["matrices", "activation", "d", "l"])["erank"].mean()
    t = t.unstack("l")
    t.columns = [f"l={c}" for c in t.columns]
    return t


def _table6_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", type=int, nargs="+", default=[32, 64, 128, 256, 512],
                   help="layers l to tabulate (default: 32 64 128 256 512)")


def _table6_main(args: argparse.Namespace) -> list[Path]:
    needs = ["width", "depth", "matrices", "activation", "rep_erank_final"]
    df = load(args, needs, probe="representation")
    warn_mixed(df, (), args.experiment,
               keys=("expansion", PLACEMENT, "alpha", "beta", "task.options.representation.n"))
    t = table6(df, args.uri, sorted(set(args.layers)))
    dropped = [l for l in args.layers if f"l={l}" not in t.columns]
    if dropped:
        log.info("layers %s are deeper than every run; left out", dropped)
    out = out_dir(args)
    fig, (ax,) = style.panels(1)
    ds = sorted({idx[2] for idx in t.index})
    colors, sm = style.value_colors(ds, "viridis")
    for idx, row in t.iterrows():
        ls = [int(c[2:]) for c in t.columns]
        ax.plot(ls, row.values, "o-", color=colors[idx[2]],
                label=f"{style.value_label('matrices', idx[0])}, "
                f"{style.value_label('activation', idx[1])}" if idx[2] == ds[0] else None)
    ax.set_xscale("log", base=2)
    ax.set(xlabel=style.name("layer"), ylabel=style.name("rep_erank"))
    ax.legend()
    style.colorbar(fig, sm, ax, "width")
    head = f"Table 6 ({', '.join(args.experiment)}): erank(Z_l)/d"
    return [*publish(fig, r"Representation rank $\mathrm{erank}(Z_\ell)/d$ across layers", df, args.experiment,
                     ["mean over seeds"], out, "table6", t),
            write_markdown(out / "table6.md", head, t, floatfmt=".3f", runs=df)]


def _tab6_collapse(runs: Runs) -> Measured:
    df = only(runs("tab6"), matrices=1)
    need(df, "rep_erank_final")
    ratios = {}
    for _, r in df.iterrows():
        _, v = runs.series(r["run_id"], "rep_erank")
        ratios[int(r["width"])] = float(v[-1] / v[0])
    worst = max(ratios, key=ratios.get)
    return Measured(ratios[worst], math.nan,
                    f"max over d ∈ {sorted(ratios)} of erank(Z_L)/erank(Z_0) (worst: d = {worst})")


TAB6 = (
    Claim("tab6.collapse", "M = 1 ReLU: representation collapse at every width",
          "the study, tab6", "collapse", at_most(0.5), _tab6_collapse),
    Claim("fig15.pre_rms_512", "M = 1 ReLU, Pre-RMSNorm, d = 256: erank(Z_512)/d ≈ "
          "0.009", "the study, fig15(a)", "0.009", near(0.009, 0.005),
          mean_of("tab6", "rep_erank_final", matrices=1, width=256, depth=512), size="full"))

COMMANDS = {"table6": Command(
    _table6_main,
    "Table 6: erank(Z_l)/d at each width d and layer l (M = 1 representation collapse)",
    experiment="tab6", arguments=_table6_arguments)}

EXPERIMENTS = (
    Experiment("tab6", "Table 6: M = 1 representation collapse at every width", "the study, tab6",
               analyses=("table6 --experiment tab6",), claims=TAB6, needs=Needs(gpu_full=True)),)
