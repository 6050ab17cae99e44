"""Table 1: activation constants beside the measured stable rank: the command ``table1``, the
claims and the registry entry."""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd

from rankexp.theory import activation_constants

from ..core import style
from ..core.claims import Claim, Measured, NotRun, Runs, at_most
from ..core.registry import Experiment
from ..core.runner import Command, out_dir
from ..core.select import PLACEMENT, load, need, warn_mixed
from ..core.style import write_markdown
from . import publish, worst
from .fig7 import coherence_gap
from .fig8 import activation_order

log = logging.getLogger("analysis")


def table1(df: pd.DataFrame) -> pd.DataFrame:
    """Table 1 per activation: ``c``, ``1/c``, ``p`` = E[σ′²], ``P(σ′≠0)``, ``κ`` = E[σ²] at q = 1
    beside ``stable_rank`` (seed mean) ± ``stable_rank_std``, ``coherence_measured``,
    ``stable_rank/(1/c)`` (NaN at c = 0), ``runs``."""
    rows = []
    for act in activation_order(df["activation"]):
        g = df[df["activation"] == act]
        k = activation_constants(act, 1.0)
        sr = float(g["hidden_stable_rank"].mean())
        rows.append({
            "activation": act, "c": k.coherence, "1/c": k.spike_bound, "p": k.survival,
            "P(σ′≠0)": k.survival_rate, "κ": k.kappa, "stable_rank": sr,
            "stable_rank_std": float(g["hidden_stable_rank_std"].mean())
            if "hidden_stable_rank_std" in g else math.nan,
            "coherence_measured": float(g["hidden_coherence"].mean()),
            "stable_rank/(1/c)": sr * k.coherence if k.coherence > 0 else math.nan,
            "runs": len(g)})
    return pd.DataFrame(rows).set_index("activation")


def _table1_main(args: argparse.Namespace) -> list[Path]:
    needs = ["activation", "hidden_stable_rank", "hidden_coherence"]
    df = load(args, needs, probe="activation_spike")
    warn_mixed(df, (), args.experiment,
               keys=("width", "expansion", "matrices", PLACEMENT, "alpha", "task.options.activation_spike.n"))
    if "alpha" in df and (df["alpha"] != 1).any():
        log.warning("runs with alpha ≠ 1: Table 1's constants are at unit preactivation variance")
    t = table1(df)
    out = out_dir(args)
    spread = float((t["stable_rank_std"] / t["stable_rank"]).max())
    paths = publish(draw_table1(t), r"Activation constants at $q = 1$ vs $\sigma(W h)$",
                    df, args.experiment, [f"bars: mean over seeds (s.d. ≤ {spread:.0%} of the "
                                          "mean; per activation in table1.csv)"], out, "table1", t)
    head = f"Table 1 ({', '.join(args.experiment)}): quadrature at q = 1 vs measured stable rank"
    return [*paths, write_markdown(out / "table1.md", f"{head} of σ(W h)", t, runs=df)]


def draw_table1(t: pd.DataFrame):
    """Measured stable rank of σ(W h) per activation (bars: the seed mean) beside the spike
    bound 1/c of the quadrature (black ticks; none where c = 0), and measured vs quadrature
    coherence c."""
    fig, (ax, bx) = style.panels(2, aspect=0.75)
    x = np.arange(len(t))
    names = [style.value_label("activation", a) for a in t.index]
    # a log axis: no error bars (a bar's lower edge would cross zero); the seed s.d. is stated
    # in the caption and listed in table1.csv / table1.md
    ax.bar(x, t["stable_rank"], 0.6, color="C0", label=style.name("hidden_stable_rank"))
    bound = t["1/c"].where(np.isfinite(t["1/c"]))
    ax.plot(x, bound, "k_", ms=14, mew=1.5, label=r"spike bound $1/c$ (quadrature)")
    ax.set(yscale="log", ylabel="stable rank", title=r"stable rank of $\sigma(W h)$")
    style.plain_log_ticks(ax)
    bx.bar(x - 0.2, t["coherence_measured"], 0.4, color="C1", label="measured")
    bx.bar(x + 0.2, t["c"], 0.4, color="0.3", label="quadrature")
    bx.set(ylabel=r"coherence $c = \mathrm{E}[\sigma]^2/\mathrm{E}[\sigma^2]$", title="coherence")
    for a in (ax, bx):
        a.set_xticks(x, names)
        a.grid(axis="x", visible=False)
        a.legend()
    return fig


def _stable_rank(runs: Runs) -> Measured:
    df = runs("tab1")
    need(df, "hidden_stable_rank")
    c = {a: activation_constants(a, 1.0).coherence for a in df["activation"].unique()}
    dev = {a: abs(g["hidden_stable_rank"].mean() * c[a] - 1)
           for a, g in df.groupby("activation") if c[a] > 0}
    if not dev:
        raise NotRun("no activation with c > 0")
    return worst(dev, "max |stable rank · c − 1|")


def _coherence(runs: Runs) -> Measured:
    df = runs("tab1")
    need(df, "hidden_coherence")
    return coherence_gap(df, "hidden_coherence", "max |measured − quadrature c|")


TAB1 = (
    Claim("tab1.stable_rank", "Measured stable rank of σ(W h) within 6 % of the "
          "spike bound 1/c", "the study, tab1", "≤ 6 %", at_most(0.06), _stable_rank),
    Claim("tab1.coherence", "Coherence of σ(W h) is c of the quadrature (relu 1/π, "
          "abs 2/π, gelu 0.187, silu 0.120, tanh 0)", "the study, Table 1", "c_σ",
          at_most(0.02), _coherence))

COMMANDS = {"table1": Command(
    _table1_main, "Table 1: c, 1/c, p, κ by quadrature beside the measured stable rank of σ(W h)",
    experiment="tab1")}

EXPERIMENTS = (Experiment("tab1", "Table 1: activation constants beside the measured stable rank",
                          "the study, tab1", analyses=("table1 --experiment tab1",), claims=TAB1),)
