"""Figure 4: where the norm sits and what it does: the command ``placements``, the claims and the
registry entry."""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd

from rankexp.models.spec import PRESET_SLOTS

from ..core import style
from ..core.claims import Claim, Measured, NotRun, Runs, at_least, at_most, near, per_width
from ..core.registry import Experiment, Needs
from ..core.runner import Command, out_dir
from ..core.select import OP_ORDER, PLACEMENT, load, need, only, pooled, warn_mixed
from ..core.style import to_markdown, write_markdown, write_text
from . import extreme, in_order, mean_ratio, publish

log = logging.getLogger("analysis")

OP = "norm.op"

PRE, OUT, POST = "norm.pre", "norm.out", "norm.post"

R_ORDER = ["none", "rmsnorm", "detached", "meansub", "layernorm"]

SPLIT = ("erank_post", "erank_post_noproj", "erank_prenorm", "erank_unnormalized",
         "rank_removed_by_projection", "rank_removed_by_rescaling", "rank_removed_total",
         "erank_projection_product", "erank_projection_product_rw")


def config_label(placement: str, op: str) -> str:
    return placement if placement == "none" else f"{placement}/{op}"


def preset_runs(df: pd.DataFrame) -> pd.DataFrame:
    """Runs whose P, B, R (``norm.pre/out/post``) are what their placement preset puts there
    (all runs of a store from before the general block, which has no such columns)."""
    slots = [c for c in (PRE, OUT, POST) if c in df]
    if not slots:
        return df
    keep = np.ones(len(df), dtype=bool)
    for col in slots:
        slot = col.split(".")[1]
        want = [op if slot in PRESET_SLOTS.get(p, ()) else "none" for p, op in zip(df[PLACEMENT], df[OP], strict=True)]
        keep &= (df[col].astype(str) == pd.Series(want, index=df.index)).to_numpy()
    return df[keep]


def figure4_runs(df: pd.DataFrame) -> pd.DataFrame:
    """The runs of Figure 4's bars: preset runs (:func:`preset_runs`; all if none) at the depth
    most runs have (other depths are the 4b control, :func:`control_table`)."""
    out = preset_runs(df)
    if out.empty:
        out = df
    if "depth" in out and out["depth"].nunique() > 1:
        main = out["depth"].value_counts().idxmax()
        log.info("placements: bars at L = %s (the Figure 4b runs at other depths are drawn apart)", main)
        out = out[out["depth"] == main]
    return out


def control_table(df: pd.DataFrame, metric: str = "erank_io") -> pd.DataFrame:
    """Figure 4b: mean, seed std (pooled over every seed of the cell's runs), seeds and count
    (runs) of ``metric`` per (R, depth) over the runs with the Pre-RMSNorm control (P =
    rmsnorm, B = identity); empty unless R takes several values."""
    if POST not in df or PRE not in df:
        return pd.DataFrame()
    d = df[(df[PRE].astype(str) == "rmsnorm") & (df.get(OUT, "none") == "none")]
    if d[POST].nunique() < 2:
        return pd.DataFrame()
    t = pooled(d, metric, [POST, "depth"]).rename(columns={"runs": "count"})  # spread over seeds
    return in_order(t, POST, R_ORDER)


def draw_control(table: pd.DataFrame, metric: str):
    """Figure 4b: ``metric`` vs depth, one line per post-residual op R (Pre-RMSNorm fixed)."""
    fig, (ax,) = style.panels(1, width=style.ONE_COLUMN, aspect=0.8)
    ops = list(dict.fromkeys(table.index.get_level_values(0)))
    colors, _ = style.value_colors(range(len(ops)))
    for k, op in enumerate(ops):
        t = table.xs(op, level=0)
        ax.plot(t.index, t["mean"], marker="o", color=colors[k],  # log axis: no error bars
                label=f"$R$ = {style.OP_NAMES.get(op, op)}")
    ax.set(xscale="log", yscale="log", xlabel=style.name("depth"), ylabel=style.name(metric))
    depths = sorted(table.index.get_level_values(1).unique())
    ax.set_xticks(depths, [str(int(d)) for d in depths])  # the depths run
    ax.xaxis.minorticks_off()
    ax.legend(title="Pre-RMSNorm +")
    return fig


def placement_table(df: pd.DataFrame, metric: str = "erank_io",
                    every: bool = False) -> pd.DataFrame:
    """Mean, pooled seed std (:func:`analysis.core.select.pooled`), ``count`` (runs) and ``seeds``
    of ``metric`` per (config, α); ``config`` = ``placement/op`` (``none`` pooled).  Without
    ``every``: rmsnorm per placement, every op for post, and none; rows in the study's order."""
    d = df.assign(config=[config_label(p, o) for p, o in zip(df[PLACEMENT], df[OP], strict=True)])
    if not every:
        keep = (d[OP] == "rmsnorm") | (d[PLACEMENT] == "post") | (d[PLACEMENT] == "none")
        d = d[keep] if keep.any() else d
    order = ["pre", "output", "post", "peri", "none"]
    d = d.assign(_p=[order.index(p) if p in order else 9 for p in d[PLACEMENT]],
                 _o=[OP_ORDER.index(o) if o in OP_ORDER else 9 for o in d[OP]])
    d.loc[d[PLACEMENT] == "none", "_o"] = 0
    t = pooled(d, metric, ["_p", "_o", "config", "alpha"]).rename(columns={"runs": "count"})
    return t[["mean", "std", "count", "seeds"]].droplevel([0, 1])


def detached_gap(table: pd.DataFrame) -> pd.Series:
    """``|erank(post/detached) − erank(post/rmsnorm)|`` per α (units of d); empty if absent."""
    configs = table.index.get_level_values("config")
    if not {"post/detached", "post/rmsnorm"} <= set(configs):
        return pd.Series(dtype=float, name="detached_gap")
    m = table["mean"]
    return (m.xs("post/detached") - m.xs("post/rmsnorm")).abs().rename("detached_gap")


def split_table(df: pd.DataFrame) -> pd.DataFrame:
    """Mean over runs of the projection-split metrics per (op, α), post runs only."""
    cols = [c for c in SPLIT if c in df]
    post = df[df[PLACEMENT] == "post"]
    if not cols or post.empty or post[cols].isna().all().all():
        return pd.DataFrame()
    return in_order(post.groupby([OP, "alpha"])[["erank_io", *cols]].mean(), OP, OP_ORDER)


def _tick(config: str) -> str:
    placement, _, op = config.partition("/")
    return style.config_label(placement, op)


def draw_placements(table: pd.DataFrame, metric: str, gap: pd.Series | None = None):
    """Grouped bars on a log axis, one group per config, one bar per α (no error bars: the caption
    states the largest relative seed s.d.); the detached−RMSNorm gap written in."""
    configs = list(dict.fromkeys(table.index.get_level_values("config")))
    alphas = sorted(table.index.get_level_values("alpha").unique())
    fig, (ax,) = style.panels(1, width=style.TWO_COLUMN, aspect=0.32)
    width = 0.8 / len(alphas)
    colors, sm = style.value_colors(alphas, "plasma", stop=0.85)
    for k, a in enumerate(alphas):
        t = table.xs(a, level="alpha").reindex(configs)
        xs = np.arange(len(configs)) + (k - (len(alphas) - 1) / 2) * width
        ax.bar(xs, t["mean"], width, color=colors[a])  # log axis: the seed spread is in the caption
    ax.set_xticks(range(len(configs)), [_tick(c) for c in configs], fontsize=6.5)
    ax.set(ylabel=style.name(metric), yscale="log")
    means = table["mean"][table["mean"] > 0]
    if len(means):  # bars start at 0: bound the log axis by the data, so its ticks are labelled
        ax.set_ylim(float(means.min()) / 1.6, float(means.max()) * 1.25)
    style.plain_log_ticks(ax)
    ax.grid(axis="x", visible=False)
    if gap is not None and len(gap):
        ax.text(0.99, 0.97, r"$|$detached $-$ RMSNorm$|$ (Post-Norm) $\leq$ "
                f"{gap.max():.2g} (study: $\\leq 0.004$)", transform=ax.transAxes,
                ha="right", va="top", fontsize=6.5)
    style.colorbar(fig, sm, ax, "alpha")
    return fig


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metric", default="erank_io",
                   help="bar height (default: erank_io = erank(∂h_L/∂h_0)/d)")
    p.add_argument("--all", action="store_true", dest="every",
                   help="every (placement, op) run, not only the figure's selection")


def _main(args: argparse.Namespace) -> list[Path]:
    everything = load(args, [args.metric, "alpha", PLACEMENT, OP])
    df = figure4_runs(everything)
    warn_mixed(df, ["alpha", PLACEMENT, OP], args.experiment)
    table = placement_table(df, args.metric, args.every)
    gap = detached_gap(table)
    out = out_dir(args)
    paths = publish(draw_placements(table, args.metric, gap),
                    f"{style.name(args.metric)} by norm placement and operation", df,
                    args.experiment, [style.spread_note(table["mean"], table["std"])], out,
                    f"placements_{args.metric}", table)
    wide = table["mean"].unstack("alpha").rename(columns=lambda a: f"alpha={a:g}")
    print(f"{args.metric} by placement/op and α ({', '.join(args.experiment)})\n")
    print(to_markdown(wide))
    control = control_table(everything, args.metric)
    if not control.empty:
        paths += publish(draw_control(control, args.metric),
                         "Pre-RMSNorm + post-residual op $R$ across depth",
                         everything[everything["depth"].isin(control.index.get_level_values(1))],
                         args.experiment, [style.spread_note(control["mean"], control["std"])],
                         out, f"placements_control_{args.metric}", control)
        print(f"\nFigure 4b: {args.metric} with a Pre-RMSNorm, by post-residual op R and depth "
              "(study: detached ≈ rmsnorm collapse; meansub and none keep a floor)\n")
        print(to_markdown(control["mean"].unstack("depth").rename(columns=lambda v: f"L={int(v)}")))
    if len(gap):
        print("\n|post/detached − post/rmsnorm| (units of d; study: ≤ 0.004): "
              + ", ".join(f"α={a:g}: {v:.2g}" for a, v in gap.items()))
    split = split_table(df)
    if split.empty:
        log.warning("no projection_split metrics in the post runs of %s (add projection_split "
                    "to task.probes); no split table", args.experiment)
        return paths
    md = write_markdown(out / "projection_split.md", "Projection split of the post runs "
                        "(units of d; Figure 4c / Table 3)", split)
    return [*paths, write_text(out / "projection_split.csv", split.to_csv()), md]


def _fig4_post_like_none(runs: Runs) -> Measured:
    df = _fig4_runs(runs)
    return mean_ratio(runs, only(df, norm_placement="post", norm_op="rmsnorm", alpha=1.0),
                      only(df, norm_placement="none", alpha=1.0), "erank_io",
                      "erank/d Post-RMSNorm ÷ no norm, α = 1")


def _fig4_runs(runs: Runs) -> pd.DataFrame:
    """Figure 4's bars (the Figure 4b also-sweep's runs at other depths and R left out)."""
    return figure4_runs(runs("fig4"))


def _fig4_floor(runs: Runs) -> Measured:
    df = _fig4_runs(runs)
    keep = df[df[PLACEMENT].isin(["pre", "output"]) & (df["norm.op"] == "rmsnorm")]
    if keep.empty:
        raise NotRun("no pre/output RMSNorm runs")
    return extreme(keep, "erank_io", lambda r: f"lowest: {r[PLACEMENT]}, α = {r['alpha']:g}",
                   lowest=True)


def _fig4_detached(runs: Runs) -> Measured:
    df = only(_fig4_runs(runs), norm_placement="post")
    det, rms = only(df, norm_op="detached"), only(df, norm_op="rmsnorm")
    worst, spread = -1.0, math.nan
    for a in sorted(set(det["alpha"]) & set(rms["alpha"])):
        pair = pd.concat([only(df, norm_op=op, alpha=a).head(1) for op in ("detached", "rmsnorm")],
                         ignore_index=True)
        gap = abs(pair["erank_io"].iloc[0] - pair["erank_io"].iloc[1])
        if gap > worst:
            per = runs.per_seed(pair, "erank_io")
            # same seeds → same weights and forward: the per-seed differences are the spread
            spread = float(np.std(per[0] - per[1], ddof=1)) if per is not None else math.nan
            worst = gap
    if worst < 0:
        raise NotRun("no α with both post/detached and post/rmsnorm runs")
    return Measured(worst, spread, "max over α of |erank(detached) − erank(rmsnorm)|/d, Post-Norm")


def _fig4_projection(runs: Runs) -> Measured:
    df = only(_fig4_runs(runs), norm_placement="post", norm_op="rmsnorm")
    need(df, "rank_removed_by_projection")
    return extreme(df, "rank_removed_by_projection",
                   lambda r: f"max over α (at α = {r['alpha']:g})", absolute=True)


#: the study's 0.4 % of width at d = 256 for a gap of about one direction: ∝ 1/d
GAP = per_width(at_most(0.004), 256)

FIG4 = (
    Claim("fig4.post_like_none", "Post-Norm collapses at the rate of no norm",
          "the study, fig4(a)", "≈ 1 (ratio)", near(1.0, 0.25), _fig4_post_like_none),
    Claim("fig4.pre_output_floor", "Pre- and output-norm keep a rank floor "
          "(Pre-Norm above ≈ 0.2 of width)", "the study, fig4(a), reference magnitudes",
          "≥ 0.2", at_least(0.2), _fig4_floor),
    Claim("fig4.detached_gap", "Post-Norm: detached ≈ RMSNorm (within 0.4 % of "
          "width)", "the study, fig4(b)", "≤ 0.004 (d = 256)", GAP, _fig4_detached),
    Claim("fig4.projection_share", "The post-norm projection removes ≤ 0.4 % of "
          "full rank", "the study, fig4(c)", "≤ 0.004 (d = 256)", GAP, _fig4_projection))


def deepest(df: pd.DataFrame) -> pd.DataFrame:
    """The runs at the largest depth."""
    need(df, "depth")
    return df[df["depth"] == df["depth"].max()]


def by_post(df: pd.DataFrame) -> pd.Series:
    """Mean erank(∂h_L/∂h_0)/d per post-residual op R."""
    need(df, "erank_io", "norm.post")
    return df.groupby("norm.post")["erank_io"].mean()


def _fig4b(runs: Runs) -> pd.Series:
    df = only(runs("fig4"), norm__pre="rmsnorm", norm__out="none")
    e = by_post(deepest(df))
    if not {"rmsnorm", "detached"} <= set(e.index):
        raise NotRun("no Figure 4b runs (norm=pre norm.post=rmsnorm,detached,…) in fig4")
    return e


def _fig4b_detached(runs: Runs) -> Measured:
    e = _fig4b(runs)
    L = int(deepest(only(runs("fig4"), norm__pre="rmsnorm"))["depth"].iloc[0])
    return Measured(abs(e["detached"] - e["rmsnorm"]), math.nan,
                    f"|erank(R = detached) − erank(R = rmsnorm)|/d with a Pre-RMSNorm, L = {L}")


def _fig4b_floor(runs: Runs) -> Measured:
    e = _fig4b(runs)
    floors = [e[o] for o in ("none", "meansub") if o in e]
    collapse = [e[o] for o in ("rmsnorm", "detached", "layernorm") if o in e]
    if not floors:
        raise NotRun("no Figure 4b run with R = none or meansub")
    return Measured(min(floors) / max(collapse), math.nan,
                    "min over R ∈ {none, meansub} ÷ max over the rescaling R, deepest L")


FIG4B = (
    Claim("fig4.b_detached_rmsnorm", "With a Pre-RMSNorm, post-residual detached ≈ "
          "rmsnorm (collapse; within 0.4 % of width)", "the study, fig4(b)",
          "≤ 0.004 (d = 256)", GAP, _fig4b_detached),
    Claim("fig4.b_centring_floor", "With a Pre-RMSNorm, R = meansub and none keep a "
          "floor while the rescaling R collapse (size=smoke's L ≤ 16 is too shallow to "
          "collapse)", "the study, fig4(b)", "floor ≫ collapse", at_least(2.0), _fig4b_floor,
          size="cpu"))

COMMANDS = {"placements": Command(
    _main, "Figure 4: erank by norm placement/op and α, and the projection split",
    experiment="fig4", where=True, arguments=_arguments)}

EXPERIMENTS = (
    Experiment("fig4", "Figure 4: where the norm sits and what it does", "the study, fig4",
               analyses=("placements --experiment fig4",), claims=FIG4 + FIG4B,
               needs=Needs(gpu_full=True)),)
