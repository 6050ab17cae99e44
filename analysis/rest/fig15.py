"""Figure 15: centring, not rescaling, keeps M = 1 rank: the command ``centring``, the claims and
the registry entry."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from ..core import style
from ..core.claims import Claim, near
from ..core.registry import Experiment
from ..core.runner import Command, out_dir
from ..core.select import load, pooled, series
from ..core.style import save, write_markdown
from ..study import mean_of
from ..study.fig1 import seed_sd
from .fig14 import probe_inputs

PRE, OUT = "norm.pre", "norm.out"

B_ORDER = ["meansub", "layernorm", "rmsnorm", "none"]

STUDY = {("layernorm", "none"): 0.078, ("rmsnorm", "none"): 0.009, ("rmsnorm", "meansub"): 0.745,
         ("rmsnorm", "layernorm"): 0.745, ("rmsnorm", "rmsnorm"): 0.008}


def final_table(df: pd.DataFrame) -> pd.DataFrame:
    """``rep_erank_final`` per (P, B): mean, s.d. over seeds, seeds, runs, and the study's value."""
    t = pooled(df, "rep_erank_final", [PRE, OUT])
    t["study (L = 512)"] = [STUDY.get(k, np.nan) for k in t.index]
    return t


def mean_profile(uri: str | None, runs: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(l, mean, s.d.)`` of ``rep_erank`` over the runs of one configuration (same depth)."""
    got = [series(uri, rid, "rep_erank") for rid in runs["run_id"]]
    steps = got[0][0]
    vals = np.stack([v for s, v in got if len(s) == len(steps)])
    sd = [seed_sd(uri, rid, "rep_erank", steps) for rid in runs["run_id"]]
    return steps, vals.mean(0), np.sqrt(np.mean(np.square(sd), 0))


def _band(ax, uri, runs, label, color) -> None:
    steps, m, s = mean_profile(uri, runs)
    ax.plot(steps, m, color=color, label=label)
    ax.fill_between(steps, np.clip(m - s, 1e-4, None), m + s, color=color, alpha=0.2, lw=0)


def _main(args: argparse.Namespace) -> list[Path]:
    df = load(args, [PRE, OUT, "rep_erank_final"])
    table = final_table(df)
    fig, axes = style.panels(2, max_cols=2, aspect=0.8)
    tab = style.plt.get_cmap("tab10")
    colors = {op: tab(i) for i, op in enumerate(B_ORDER)}
    a = df[df[OUT].astype(str) == "none"]
    for k, p in enumerate([o for o in ("layernorm", "rmsnorm") if o in set(a[PRE])]):
        _band(axes[0], args.uri, a[a[PRE] == p], f"pre-{style.OP_NAMES.get(p, p)}", tab(k + 4))
    axes[0].set_title("(a) pre-branch op $P$")
    b = df[df[PRE].astype(str) == "rmsnorm"]
    for op in [o for o in B_ORDER if o in set(b[OUT])]:
        label = "none" if op == "none" else style.OP_NAMES.get(op, op)
        _band(axes[1], args.uri, b[b[OUT] == op], f"$B$ = {label}", colors[op])
    axes[1].set_title("(b) Pre-RMSNorm + branch-output op $B$")
    for ax in axes:
        ax.set_xscale("symlog", linthresh=1)
        ax.set(yscale="log", xlabel=style.name("layer"), ylabel=style.name("rep_erank"))
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.suptitle("Representation rank of $M = 1$ branches — centring, not rescaling")
    style.caption(fig, df, args.experiment, [*probe_inputs(df), "bands: ±1 s.d. over seeds"])
    out = out_dir(args)
    paths = save(fig, out, "centring", table)
    head = f"Figure 15: erank(Z_L)/d by pre-branch op P and branch-output op B ({', '.join(args.experiment)})"
    paths.append(write_markdown(out / "centring.md", head, table, ".3f", runs=df))
    return paths


FIG15 = tuple(
    Claim(f"fig15.{cid}", f"M = 1 ReLU: {what}", f"the study, fig15({cid[0]})",
          f"{value} (d = 256, L = 512)", near(value, tol),
          mean_of("fig15", "rep_erank_final",
                  lambda df: f"erank(Z_L)/d at L = {int(df['depth'].max())}",
                  norm__pre=pre, norm__out=out))
    for cid, pre, out, what, value, tol in (
        ("a_pre_layernorm", "layernorm", "none", "pre-LayerNorm collapses too", 0.078, 0.03),
        ("a_pre_rmsnorm", "rmsnorm", "none", "pre-RMSNorm collapses", 0.009, 0.005),
        ("b_out_meansub", "rmsnorm", "meansub", "Pre-RMSNorm + branch-output meansub keeps the rank",
         0.745, 0.05),
        ("b_out_layernorm", "rmsnorm", "layernorm", "Pre-RMSNorm + branch-output layernorm keeps the "
         "rank", 0.745, 0.05),
        ("b_out_rmsnorm", "rmsnorm", "rmsnorm", "Pre-RMSNorm + branch-output rmsnorm collapses (the "
         "rescaling does not help)", 0.008, 0.005)))

COMMANDS = {"centring": Command(
    _main, "Figure 15: erank(Z_l)/d of M = 1 branches by pre-branch op P and branch-output op B",
    experiment="fig15", where=True)}

EXPERIMENTS = (
    Experiment("fig15", "Figure 15: centring, not rescaling, keeps M = 1 rank",
               "the study, fig15", analyses=("centring --experiment fig15",), claims=FIG15),)
