"""The deep-linear plateau T(N, a₀): the command ``deep_linear``, the claims and the registry
entry."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd

from rankexp.probes.catalog import DEEP_LINEAR_DEFAULTS

from ..core import style
from ..core.claims import Measured, NotRun, Runs, at_most
from ..core.runner import out_dir
from ..core.select import load, series
from ..core.style import save, to_markdown, write_text
from . import claim, entry, newest, worst

S_KEY = "task.options.deep_linear.s"


def deep_linear_table(df: pd.DataFrame, uri: str | None) -> pd.DataFrame:
    """Long table per (s, a₀, N): quadrature, asymptote (N > 2, a₀ < 1), simulation where run."""
    rows = []
    for _, r in newest(df, [S_KEY]).iterrows():
        s = float(r[S_KEY])
        a0s = sorted(float(c[len("T_quad_a"):]) for c in df.columns if c.startswith("T_quad_a")
                     and pd.notna(r[c]))
        for a0 in a0s:
            steps, quad = series(uri, r["run_id"], f"T_quad_a{a0:g}")
            asym = np.full_like(quad, np.nan)
            if a0 < 1:
                st, v = series(uri, r["run_id"], f"T_asym_a{a0:g}")
                asym[np.isin(steps, st)] = v
            sim = [r.get(f"T_sim_N{int(n)}_a{a0:g}", np.nan) for n in steps]
            rows.append(pd.DataFrame({"s": s, "a0": a0, "N": steps, "T_quad": quad,
                                      "T_asymptote": asym, "T_sim": sim}))
    t = pd.concat(rows, ignore_index=True)
    t["asymptote_ratio"] = t["T_asymptote"] / t["T_quad"]
    return t


def _deep_linear(runs: Runs) -> pd.DataFrame:
    return deep_linear_table(runs("deep_linear"), runs.uri)


def _deep_linear_main(args: argparse.Namespace) -> list[Path]:
    df = load(args, [S_KEY, "T_sim_rel_err"])
    t = deep_linear_table(df, args.uri)
    out = out_dir(args)
    table = t.pivot_table(index=["s", "N"], columns="a0", values="T_quad")
    write_text(out / "deep_linear.md", to_markdown(table, ".6g"))
    # the chains simulated are sim_width wide (the task's own network is unused): d is theirs
    key = "task.options.deep_linear.sim_width"
    sim_width = df[key].astype(int) if key in df else DEEP_LINEAR_DEFAULTS["sim_width"]
    ss = sorted(t["s"].unique())
    fig, axes = style.grid(1, len(ss), width=min(style.TWO_COLUMN, 3.6 * len(ss)), aspect=0.8)
    for ax, s in zip(axes[0], ss, strict=True):
        for k, (a0, g) in enumerate(t[t["s"] == s].groupby("a0")):
            col = f"C{k}"
            pos = g[g["T_quad"] > 0]
            lab = "identity start $a_0$ = 1" if a0 == 1 else f"$a_0$ = {a0:g}"
            ax.semilogy(pos["N"], pos["T_quad"], "-", color=col, label=lab)
            ax.semilogy(g["N"], g["T_asymptote"], "--", color=col, lw=0.8)
            ax.semilogy(g["N"], g["T_sim"], "o", mfc="none", color=col, ms=7)
        ax.plot([], [], "k--", lw=0.8, label=r"asymptote $a_0^{-(N-2)}/(s(N-2))$")
        ax.plot([], [], "ko", mfc="none", label="gradient flow on a real chain")
        ax.set(xlabel="layers $N$", ylabel=r"time $T(N, a_0)$ to reach $s/2$")
        ax.set_title(rf"target $s$ = {s:g} (lines: quadrature of 215.8)", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("The deep-linear plateau: learning time grows like $a_0^{-N}$")
    style.caption(fig, df.assign(width=sim_width).drop(columns=["depth"], errors="ignore"),
                  args.experiment, [f"one run per target $s$; gradient flow on orthogonal chains, "
                                    f"largest |sim − quad|/quad = {df['T_sim_rel_err'].max():.1e}"])
    return save(fig, out, "deep_linear", t)


#: the probe integrates gradient flow with DOP853 at rtol = 1e-10; an 8th-order method's global
#: error stays within 10³ of its local tolerance over the horizon
FLOW_TOL = 1e-7


def deep_linear_flow(df: pd.DataFrame) -> Measured:
    """Largest |T_sim − T_quad|/T_quad: gradient flow on real chains vs the quadrature 215.8."""
    if "T_sim_rel_err" not in df or df["T_sim_rel_err"].isna().all():
        raise NotRun("the deep_linear runs simulated no chain (T_sim_rel_err)")
    return Measured(float(df["T_sim_rel_err"].max()), math.nan, "over every simulated (N, a₀, s)")


def asymptote_bound(N, a0, s):
    """Bound on |T/T_asym − 1| (215.8 vs 215.9): with 1/(s − u) = 1/s + u/(s(s − u)) and
    s − u ≥ s/2 on [u₀, s/2], T N = (1/s)∫u^{−2+2/N} + R with 0 ≤ R ≤ (N/s²)(s/2)^{2/N}, so
    |T/T_asym − 1| ≤ a₀^{N−2} [(2/s)^{1−2/N} + (N − 2)(s/2)^{2/N}/s]."""
    N = np.asarray(N, dtype=float)
    return a0 ** (N - 2) * ((2 / s) ** (1 - 2 / N) + (N - 2) * (s / 2) ** (2 / N) / s)


def deep_linear_asymptote(t: pd.DataFrame) -> Measured:
    """T_quad/T_asym over every (s, a₀ < 1, N > 2) with T > 0 vs 1, bias
    :func:`asymptote_bound` (what 215.9 neglects, bounded; no seeds: quadrature)."""
    rows = t[(t["a0"] < 1) & (t["N"] > 2) & (t["T_quad"] > 0)].dropna(subset=["T_asymptote"])
    rows = rows.assign(measured=rows["T_quad"] / rows["T_asymptote"], theory=1.0, se=0.0,
                       bias=asymptote_bound(rows["N"], rows["a0"], rows["s"]))
    return worst(rows, lambda r: f"s = {r['s']:g}, a₀ = {r['a0']:g}, N = {r['N']:g}")


DEEP_LINEAR = (
    claim("deep_linear.flow", "Gradient flow on real deep linear chains takes the time "
           "T(N, a₀) of the quadrature 215.8", "the chapter, 215.8", "0",
           "deep_linear", deep_linear_flow, at_most(FLOW_TOL), size="smoke"),
    claim("deep_linear.asymptote", "T(N, a₀) → a₀^{−(N−2)}/(s(N−2)) for N > 2",
           "the chapter, 215.9", "ratio 1", _deep_linear, deep_linear_asymptote, size="smoke"))

COMMANDS, EXPERIMENTS = entry(
    "deep_linear", "The deep-linear plateau T(N, a₀)", "the chapter, 215.8/215.9", DEEP_LINEAR,
    _deep_linear_main,
    "deep-linear learning time T(N, a₀) by quadrature, asymptote, simulated chains")
