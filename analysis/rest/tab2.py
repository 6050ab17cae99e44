"""Table 2: the post-residual ops' Jacobians: the command ``table2``, the claims and the registry
entry."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from ..core.claims import Claim, Measured, NotRun, Runs, at_most
from ..core.registry import Experiment
from ..core.runner import Command, out_dir
from ..core.runs import attach_to_parents
from ..core.select import load, need, pooled
from ..core.style import write_markdown

OP = "norm.op"

OPS = ["rmsnorm", "detached", "meansub", "layernorm"]

#: Table 2's reading of each op: (what J removes, whether it rescales)
TABLE2 = {"rmsnorm": ("x̂", "√d/‖x‖"), "detached": ("nothing", "√d/‖x‖"), "meansub": ("1", "none"),
          "layernorm": ("x̂_c and 1", "√d/‖x−μ‖")}

T2_COLUMNS = ("jac_autograd_error", "jac_removes_xhat", "jac_removes_xhat_c", "jac_removes_ones",
              "jac_rank_deficit", "jac_scale", "jac_scale_theory", "jac_sv_spread", "jac_scale_rms")


def table2(df: pd.DataFrame) -> pd.DataFrame:
    """One row per op (Table 2's order): the mean over every seed of each measured column,
    the worst seed's autograd error, and the study's reading."""
    cols = [c for c in T2_COLUMNS if c in df]
    rows = {}
    for op, g in df.groupby(OP):
        row = {c: float(pooled(g, c, []).iloc[0]["mean"]) for c in cols}
        row["removes (Table 2)"], row["rescale (Table 2)"] = TABLE2.get(op, ("?", "?"))
        rows[op] = row
    t = pd.DataFrame.from_dict(rows, orient="index")
    return t.reindex([o for o in OPS if o in t.index] + [o for o in t.index if o not in OPS]).rename_axis("op")


def _table2_main(args: argparse.Namespace) -> list[Path]:
    df = load(args, [OP, "jac_autograd_error", "jac_rank_deficit"])
    t = table2(df)
    out = out_dir(args)
    d = sorted(df["width"].unique().tolist()) if "width" in df else []
    head = (f"Table 2: Jacobians of the post-residual ops at gain 1 ({', '.join(args.experiment)}; "
            f"d = {'/'.join(str(int(v)) for v in d)}; removes_*: ‖J v̂‖/‖J‖₂, 0 = removed)")
    paths = [write_markdown(out / "table2.md", head, t, ".3g", runs=df), out / "table2.csv"]
    t.to_csv(paths[1])
    attach_to_parents(paths[1:], df)
    return paths


DEFICIT = {"rmsnorm": 1, "detached": 0, "meansub": 1, "layernorm": 2}


def _tab2_autograd(runs: Runs) -> Measured:
    df = runs("tab2")
    need(df, "jac_autograd_error")
    return Measured(float(df["jac_autograd_error"].max()), math.nan,
                    "max over ops of ‖J_closed − J_autograd‖_F / ‖J_autograd‖_F")


def _tab2_removed(runs: Runs) -> Measured:
    df = runs("tab2")
    need(df, "jac_rank_deficit", "norm.op")
    off = [abs(r["jac_rank_deficit"] - DEFICIT[r["norm.op"]]) for _, r in df.iterrows() if r["norm.op"] in DEFICIT]
    if not off:
        raise NotRun("no tab2 run of rmsnorm/detached/meansub/layernorm")
    return Measured(float(max(off)), math.nan, "max over ops of |d − rank(J) − Table 2's count| "
                    "(rmsnorm 1, detached 0, meansub 1, layernorm 2)")


TAB2 = (
    Claim("tab2.autograd", "The closed-form Jacobians of Table 2 equal autograd",
          "the study, tab2", "exact", at_most(1e-12), _tab2_autograd),
    Claim("tab2.removed", "rmsnorm removes x̂, detached nothing, meansub 1, layernorm "
          "both", "the study, tab2", "1/0/1/2 directions", at_most(0.0), _tab2_removed))

COMMANDS = {
    "table2": Command(_table2_main, "Table 2: the post-residual ops' Jacobians (closed form vs "
                                    "autograd, removed directions, scale)", "tab2", True)}

EXPERIMENTS = (Experiment("tab2", "Table 2: the post-residual ops' Jacobians", "the study, tab2",
                          analyses=("table2 --experiment tab2",), claims=TAB2),)
