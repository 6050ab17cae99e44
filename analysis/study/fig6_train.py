"""Figure 6 (trainability) / Table 5: the rank grid trained on CIFAR-10: the commands ``fig6``,
``table5``, ``curves``, the claims and the registry entry."""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from ..core import style
from ..core.claims import Claim, Measured, NotRun, Runs, at_least, at_most, near
from ..core.registry import Experiment, Needs
from ..core.runner import Command, out_dir, set_experiment_default
from ..core.runs import cached_series
from ..core.select import (
    PLACEMENT,
    PLACEMENT_ORDER,
    SelectionError,
    load,
    need,
    only,
    ordered,
    select,
    warn_mixed,
)
from ..core.style import write_markdown
from . import in_order, publish
from .fig2 import cell_note, draw_panel, heatmap_table

CHANCE = 0.1  # CIFAR-10 has ten balanced classes

# config keys that should be equal across the runs one figure compares, unless they are its
# axes (seed may vary: cells average over it)
CONTEXT = ("alpha", "width", "expansion", "matrices", "beta", "beta_scaling", "activation",
           "skip_every", "norm.op", "seeds", "dtype", "task.steps", "task.batch_size", "task.lrs",
           "task.dtype", "task.stable_accuracy")

TRAIN_HELP = ("task=train experiment(s) (default: fig6_train; one-rate runs such as "
              "tab5_boundary's give each cell its boundary)")

#: a train run's per-LR final accuracy, ``final_test_acc_lr<lr>`` (its ``<lr>`` suffix: group 1)
LR_COLUMN = re.compile(r"^final_test_acc_lr(.+)$")


def depth_axis(ax, depths) -> None:
    """Logarithmic depth axis ticked at the depths that were run."""
    depths = sorted({int(d) for d in depths})
    ax.set_xscale("log")
    ax.set_xticks(depths, [str(d) for d in depths])
    ax.minorticks_off()
    ax.set_xlabel(style.name("depth"))


def fig6_table(rank: pd.DataFrame, train: pd.DataFrame, rank_metric: str = "erank_io",
               train_metric: str = "best_test_accuracy") -> pd.DataFrame:
    """Both halves of Figure 6 on one (placement, depth, alpha) index: ``<metric>``,
    ``<metric>_std``, ``<metric>_runs``, ``<metric>_seeds`` of the rank and the train metric
    (outer join)."""
    rank_t, train_t = (
        heatmap_table(df, m, "alpha", "depth", PLACEMENT).rename(
            columns={"mean": m, "std": f"{m}_std", "count": f"{m}_runs",
                     "seeds": f"{m}_seeds"})
        for df, m in ((rank, rank_metric), (train, train_metric)))
    return in_order(rank_t.join(train_t, how="outer"), PLACEMENT, PLACEMENT_ORDER)


def draw_fig6(table: pd.DataFrame, rank_metric: str, train_metric: str, log_rank: bool = False):
    """Rows = placements, columns = (rank, accuracy); every panel has the same depth × α axes."""
    placements = ordered(table.index.get_level_values(0), PLACEMENT_ORDER)
    depths = sorted(table.index.get_level_values(1).unique())
    alphas = sorted(table.index.get_level_values(2).unique())
    fig, axes = style.grid(len(placements), 2, aspect=0.7)
    for j, metric in enumerate((rank_metric, train_metric)):
        values = table[metric]
        vmin, vmax = float(np.nanmin(values)), float(np.nanmax(values))
        for i, p in enumerate(placements):
            grid, sd = (table[c].xs(p, level=0).unstack("alpha").reindex(index=depths,
                                                                          columns=alphas)
                        for c in (metric, f"{metric}_std"))
            im = draw_panel(axes[i, j], grid, vmin, vmax, log_rank and j == 0, sd)
            axes[i, j].set(xlabel=style.name("alpha"), ylabel=style.name("depth"),
                           title=style.value_label(PLACEMENT, p))
        style.colorbar(fig, im, axes[:, j].tolist(), metric)
    return fig


def _fig6_arguments(p: argparse.ArgumentParser) -> None:
    set_experiment_default(p, None, "not used: fig6 reads --rank-experiment and --train-experiment")
    p.add_argument("--rank-experiment", default="fig6", help="task=measure runs (default: fig6)")
    p.add_argument("--train-experiment", default="fig6_train",
                   help="task=train runs (default: fig6_train)")
    p.add_argument("--rank-metric", default="erank_io",
                   help="left column (default: erank_io = erank(∂h_L/∂h_0)/d)")
    p.add_argument("--train-metric", default="best_test_accuracy", help="right column (default: "
                   "best_test_accuracy, best final test accuracy over LRs)")
    p.add_argument("--log-color", action="store_true",
                   help="logarithmic colour scale for the rank column")


def _fig6_main(args: argparse.Namespace) -> list[Path]:
    if args.experiment is not None:
        raise SelectionError("fig6 takes --rank-experiment and --train-experiment, not --experiment")
    frames = {}
    for name, metric in ((args.rank_experiment, args.rank_metric),
                         (args.train_experiment, args.train_metric)):
        frames[name] = df = load(args, ["alpha", "depth", PLACEMENT, metric], experiments=[name])
        warn_mixed(df, ["alpha", "depth", PLACEMENT], [name], keys=CONTEXT)
    metrics = [args.rank_metric, args.train_metric]
    table = fig6_table(frames[args.rank_experiment], frames[args.train_experiment], *metrics)
    return publish(draw_fig6(table, args.rank_metric, args.train_metric, args.log_color),
                   f"{style.name(args.rank_metric)} at init beside "
                   f"{style.name(args.train_metric)}", frames[args.train_experiment],
                   [args.rank_experiment, args.train_experiment],
                   [f"{len(frames[args.rank_experiment])} rank runs",
                    cell_note(table[metrics], table[[f"{m}_std" for m in metrics]])],
                   Path(args.out) / args.train_experiment,
                   f"fig6_{args.rank_metric}_vs_{args.train_metric}", table)


def run_lrs(df: pd.DataFrame) -> dict[str, float]:
    """``{suffix: lr}`` of the per-LR columns ``final_test_acc_lr<suffix>`` the runs logged."""
    return {m.group(1): float(m.group(1)) for c in df.columns if (m := LR_COLUMN.match(str(c)))}


def max_stable_lr(df: pd.DataFrame, stable_accuracy: float | None = None) -> pd.Series:
    """Per run, the largest learning rate that did not diverge and ended ≥ ``stable_accuracy``
    (NaN if none): ``None`` reads the logged ``max_stable_lr``, a number recomputes it."""
    if stable_accuracy is None:
        return df["max_stable_lr"].astype(float)
    lrs = run_lrs(df)
    if not lrs:
        raise SelectionError("runs have no final_test_acc_lr<lr> columns to recompute max_stable_lr from")
    never = pd.Series(0.0, index=df.index)
    ok = {k: (df[f"final_test_acc_lr{k}"] >= stable_accuracy)
          & (df.get(f"diverged_lr{k}", never).fillna(0) == 0) for k in lrs}
    stable = pd.DataFrame({k: np.where(ok[k], lr, np.nan) for k, lr in lrs.items()}, index=df.index)
    return stable.max(axis=1)


def one_rate(df: pd.DataFrame) -> bool:
    """Whether every run trained a single learning rate (``lr=…``: a boundary sweep such as
    ``experiment=tab5_boundary``), not the batched ``task.lrs`` of a grid."""
    return "lr" in df and bool(len(df)) and bool(pd.to_numeric(df["lr"], errors="coerce").notna().all())


def boundary_lr(df: pd.DataFrame, stable_accuracy: float | None = None) -> pd.DataFrame:
    """One-rate runs (:func:`one_rate`) as one row per (placement, depth, α[, seed]) whose
    ``max_stable_lr`` is the boundary: the geometric midpoint of the largest stable rate and the
    smallest unstable one above it (as :func:`hydra_plugins.rankexp_plugins.contour.solve`); NaN where none held."""
    stable = max_stable_lr(df, stable_accuracy).notna()
    keys = [PLACEMENT, "depth", "alpha"] + (["seed"] if "seed" in df else [])
    rows = []
    for values, g in df.assign(_lr=pd.to_numeric(df["lr"]), _ok=stable).groupby(keys, sort=False):
        ok = g.loc[g["_ok"], "_lr"]
        lo = float(ok.max()) if len(ok) else np.nan
        above = g.loc[~g["_ok"] & (g["_lr"] > lo), "_lr"] if len(ok) else g["_lr"].iloc[:0]
        rate = float(np.sqrt(lo * above.min())) if len(above) else lo
        rows.append({**dict(zip(keys, values, strict=True)), "max_stable_lr": rate})
    return pd.DataFrame(rows, columns=[*keys, "max_stable_lr"])


def table5(df: pd.DataFrame, stable_accuracy: float | None = None) -> pd.DataFrame:
    """Max stable LR per (placement, depth) and α, plus ``max over α``; a cell's seeds give their
    smallest value; one-rate runs give the boundary (:func:`boundary_lr`)."""
    runs = boundary_lr(df, stable_accuracy) if one_rate(df) else \
        df.assign(max_stable_lr=max_stable_lr(df, stable_accuracy))
    cells = runs.groupby([PLACEMENT, "depth", "alpha"])["max_stable_lr"]
    wide = cells.agg(lambda v: v.min(skipna=False)).unstack("alpha")
    wide.columns = [f"alpha={a:g}" for a in wide.columns]
    wide["max over alpha"] = wide.max(axis=1)
    return in_order(wide, PLACEMENT, PLACEMENT_ORDER)


def lr_cells(table: pd.DataFrame, ran: pd.DataFrame | None = None) -> pd.DataFrame:
    """Learning rates as text: ``1e-03`` → ``0.001``; NaN → ``—`` (none stable), or blank where
    ``ran`` (same shape, bool) says the cell was not run."""
    # task.lrs' rates are 1–2 digits; a boundary (a midpoint) is cut to 2
    text = table.map(lambda v: "—" if pd.isna(v) else f"{float(v):.2g}")
    if ran is not None:
        text = text.where(ran.reindex_like(table).fillna(False).astype(bool), "")
    return text


def _table5_arguments(p: argparse.ArgumentParser) -> None:
    set_experiment_default(p, ["fig6_train"], TRAIN_HELP)
    p.add_argument("--stable-accuracy", type=float, default=None,
                   help="recompute stability at this final test accuracy (default: the logged "
                   "max_stable_lr, i.e. task.stable_accuracy = 0.4 of the runs)")


def _table5_main(args: argparse.Namespace) -> list[Path]:
    df = load(args, ["alpha", "depth", PLACEMENT]
              + (["max_stable_lr"] if args.stable_accuracy is None else []))
    warn_mixed(df, ["alpha", "depth", PLACEMENT], args.experiment, keys=CONTEXT)
    table = table5(df, args.stable_accuracy)
    thr = args.stable_accuracy if args.stable_accuracy is not None else "task.stable_accuracy"
    ran = df.groupby([PLACEMENT, "depth", "alpha"]).size().unstack("alpha").notna()
    ran.columns = [f"alpha={a:g}" for a in ran.columns]
    ran["max over alpha"] = ran.any(axis=1)
    how = ("the boundary: midpoint in log of the largest stable and the next unstable rate"
           if one_rate(df) else "the largest stable rate trained")
    out = out_dir(args)
    md = write_markdown(out / "table5_max_stable_lr.md", "Max stable learning rate (final test "
                        f"accuracy ≥ {thr}; {how}; — = none stable, blank = not run), "
                        f"{', '.join(args.experiment)}", lr_cells(table, ran))
    fig, (ax,) = style.panels(1)
    for p in ordered(table.index.get_level_values(0), PLACEMENT_ORDER):
        s = table.loc[p, "max over alpha"]
        ax.plot(s.index, s.values, "o-", label=style.value_label(PLACEMENT, p))
    depth_axis(ax, table.index.get_level_values(1))
    if table["max over alpha"].notna().any():
        ax.set_yscale("log")
    else:
        ax.text(0.5, 0.5, "no stable learning rate", transform=ax.transAxes, ha="center")
    ax.set_ylabel(r"max stable LR (max over $\alpha$)")
    ax.legend()
    if args.stable_accuracy is None and "task.stable_accuracy" in df:
        thr = "/".join(style.number(v) for v in sorted(df["task.stable_accuracy"].unique()))
    return [*publish(fig, "Max stable learning rate vs depth", df, args.experiment,
                     [f"stable: final test accuracy ≥ {thr}"], out, "table5_max_stable_lr", table),
            md]


def select_run(df: pd.DataFrame, run_id: str | None, where: list[str]) -> pd.Series:
    """The one run with ``run_id`` (a prefix) and every ``KEY=VALUE``; SelectionError else."""
    hits = select(df[df["run_id"].str.startswith(run_id or "")], where, ["(selected)"])
    if len(hits) != 1:
        names = (hits if len(hits) else df)[["run_id", "tags.mlflow.runName"]]
        raise SelectionError(f"{len(hits)} runs match --run-id {run_id!r} --where {where}; pick "
                             f"one of:\n{names.to_string(index=False)}")
    return hits.iloc[0]


def training_curves(uri: str | None, run: pd.Series) -> pd.DataFrame:
    """Long table (lr, metric, step, value) of the run's ``test_acc_lr*`` and ``train_loss_lr*`` series."""
    lrs = run_lrs(run.dropna().to_frame().T)
    if not lrs:
        raise SelectionError(f"run {run['run_id']} has no per-LR metrics (final_test_acc_lr<lr>); "
                             "is it a task=train run?")
    rows = []
    for k, lr in sorted(lrs.items(), key=lambda kv: kv[1]):
        for metric in ("test_acc", "train_loss"):
            got = cached_series(uri, run["run_id"], f"{metric}_lr{k}")  # its member's, or its own
            steps, values = got if got is not None else ((), ())
            rows += [(lr, metric, int(s), float(v)) for s, v in zip(steps, values, strict=True)]
    return pd.DataFrame(rows, columns=["lr", "metric", "step", "value"])


def _curves_arguments(p: argparse.ArgumentParser) -> None:
    set_experiment_default(p, ["fig6_train"], TRAIN_HELP)
    p.add_argument("--run-id", default=None, help="the run (an id prefix is enough)")
    p.add_argument("--where", nargs="*", default=[], metavar="KEY=VALUE",
                   help="pick the run by params, e.g. --where depth=16 alpha=1 norm.placement=post")


def _curves_main(args: argparse.Namespace) -> list[Path]:
    df = load(args, where=[])
    run = select_run(df, args.run_id, args.where)
    curves = training_curves(args.uri, run)
    fig, axes = style.panels(2, aspect=0.7)
    lrs = sorted(curves["lr"].unique())
    colors, sm = style.value_colors(lrs, "plasma")
    for ax, metric in zip(axes, ("test_acc", "train_loss"), strict=True):
        for lr, g in curves[curves["metric"] == metric].groupby("lr"):
            ax.plot(g["step"], g["value"], marker="o" if metric == "test_acc" else None,
                    color=colors[lr], ms=2.5)
        ax.set(xlabel="optimizer step", ylabel=style.name(metric))
    axes[0].axhline(CHANCE, color="gray", lw=0.8, ls=":", label="chance")
    axes[0].legend()
    style.colorbar(fig, sm, axes, "lr", label="Adam learning rate")
    return publish(fig, f"Training curves of {run.get('tags.mlflow.runName', '')} (run "
                   f"{run['run_id'][:8]})", run.to_frame().T, args.experiment, (), out_dir(args),
                   f"curves_{run['run_id'][:8]}", curves.set_index(["lr", "metric", "step"]))


def fig6_chance_gap(cells: pd.DataFrame) -> Measured:
    """Largest |best test accuracy − chance| over the Post-Norm cells (columns ``erank_io``,
    ``best_test_accuracy``) whose erank/d ≤ 0.02: "fails (≈ 10 %)" is two-sided — above
    chance it trains, below chance it is broken."""
    low = cells[cells["erank_io"] <= 0.02]
    if low.empty:
        raise NotRun(f"no Post-Norm cell with erank/d ≤ 0.02 (lowest: {cells['erank_io'].min():.3g})")
    gap = (low["best_test_accuracy"] - CHANCE).abs()
    return Measured(float(gap.max()), math.nan,
                    f"max |best accuracy − {CHANCE:g}| over {len(low)} Post-Norm cells with erank/d ≤ 0.02 "
                    f"(accuracies {low['best_test_accuracy'].min():.3g} … {low['best_test_accuracy'].max():.3g})")


def _fig6_chance(runs: Runs) -> Measured:
    rank = only(runs("fig6"), norm_placement="post")
    train = only(runs("fig6_train"), norm_placement="post")
    need(train, "best_test_accuracy")
    r = rank.groupby(["alpha", "depth"])["erank_io"].mean()
    t = train.groupby(["alpha", "depth"])["best_test_accuracy"].mean()
    return fig6_chance_gap(pd.concat([r, t], axis=1, join="inner").dropna())


def _lr_by_depth(df: pd.DataFrame) -> pd.Series:
    need(df, "max_stable_lr")
    cells = df.groupby(["depth", "alpha"])["max_stable_lr"].min()  # every seed stable
    return cells.groupby("depth").max().sort_index()


def post_lr_shrink_error(lr: pd.Series) -> Measured:
    """Measured minus Table 5's fall of log10 max stable LR (Post-Norm, α = 0.5) from the
    shallowest to the deepest depth of Table 5 that ``lr`` (max stable LR by depth) holds;
    −∞ when the deepest depth has no stable LR at all (a fall past every LR of the grid)."""
    lr = lr[[int(d) in TABLE5_POST for d in lr.index]]
    if len(lr) < 2:
        raise NotRun("needs Post-Norm α = 0.5 runs at two depths of Table 5")
    (d0, first), (d1, last) = (lr.index[0], lr.iloc[0]), (lr.index[-1], lr.iloc[-1])
    if not (np.isfinite(first) and first > 0):
        raise NotRun(f"no stable learning rate even at L = {d0}")
    table = TABLE5_POST[int(d1)] - TABLE5_POST[int(d0)]
    measured = -math.inf if not (np.isfinite(last) and last > 0) else math.log10(last / first)
    return Measured(measured - table, math.nan,
                    f"Δ log10 max stable LR from L = {d0} to L = {d1}: {measured:.3g} vs Table 5's {table:g}")


def _post_lr_shrinks(runs: Runs) -> Measured:
    return post_lr_shrink_error(_lr_by_depth(only(runs("fig6_train"), norm_placement="post", alpha=0.5)))


def _pre_lr(runs: Runs) -> Measured:
    df = only(runs("fig6_train"), norm_placement="pre")
    need(df, "max_stable_lr")
    cells = df.groupby(["depth", "alpha"])["max_stable_lr"].min().fillna(0.0)  # every seed stable
    (L, a), lr = cells.idxmin(), cells.min()
    return Measured(float(lr), math.nan, f"min over every (L, α) cell: L = {int(L)}, α = {a:g}")


TABLE5_POST = {12: -2.0, 24: -2.0, 48: -2.5, 96: -3.0, 192: -3.5, 384: -4.5}


def post_table5_error(lr: pd.Series) -> Measured:
    """Largest |log10 max stable LR − Table 5's| (Post-Norm, α = 0.5) over the depths of Table 5
    that ``lr`` (max stable LR by depth) holds; ∞ where a depth has no stable rate."""
    lr = lr[[int(d) in TABLE5_POST for d in lr.index]].fillna(0.0)
    if lr.empty:
        raise NotRun("no Post-Norm α = 0.5 result at a depth of Table 5")
    dev = [abs(math.log10(v) - TABLE5_POST[int(d)]) if v > 0 else math.inf for d, v in lr.items()]
    return Measured(float(max(dev)), math.nan,
                    f"max |Δ log10 LR| over L ∈ {[int(d) for d in lr.index]}")


def _post_lr_table5(runs: Runs) -> Measured:
    df = only(runs("fig6_train"), norm_placement="post", alpha=0.5)
    return post_table5_error(_lr_by_depth(df))


def _cifar55(runs: Runs) -> Measured:
    df = only(runs("fig6_train"), norm_placement="pre")
    need(df, "best_test_accuracy", "task.steps")
    df = df[df["task.steps"] >= 5000]
    if df.empty:
        raise NotRun("needs the study's 5000 training steps (size=full)")
    return Measured(float(df["best_test_accuracy"].max()), math.nan, "best over Pre-Norm runs")


FIG6_TRAIN = (
    Claim("fig6.post_chance", "Post-Norm fails (≈ 10 %) where its rank ≤ 1–2 %",
          "the study, fig6", "≈ 0.1", at_most(0.05), _fig6_chance, size="full"),
    Claim("tab5.post_lr_shrinks", "Max stable LR (acc ≥ 0.4) shrinks with depth for "
          "Post-Norm as Table 5 says (α = 0.5; measured − Table 5 fall, ± half a decade: the "
          "LR grid's spacing)", "the study, fig6, Table 5", "Table 5's fall", near(0.0, 0.5),
          _post_lr_shrinks, size="full"),
    Claim("tab5.pre_lr", "Pre-Norm: max stable LR 1e-2 at every depth and α",
          "the study, tab5", "0.01", at_least(0.01), _pre_lr),
    Claim("tab5.post_alpha_half", "Post-Norm α = 0.5: max stable LR "
          "10^{−2, −2, −2.5, −3, −3.5, −4.5} at L = 12…384", "the study, tab5",
          "Table 5", at_most(0.5), _post_lr_table5, size="full"),
    Claim("fig6.cifar_55", "MLP on CIFAR-10 reaches ≈ 55 % where it trains",
          "the study, reference magnitudes", "0.55", near(0.55, 0.05), _cifar55, size="full"))

COMMANDS = {
    "fig6": Command(_fig6_main, "Figure 6: rank heatmap beside best-accuracy heatmap, one row "
                                "per placement", None, False, _fig6_arguments),
    "table5": Command(_table5_main, "Table 5: max stable learning rate per (placement, depth), "
                                    "per α and max over α", None, False, _table5_arguments),
    "curves": Command(_curves_main, "test accuracy and train loss vs step, one line per LR, of "
                                    "one train run", None, False, _curves_arguments)}

EXPERIMENTS = (
    Experiment("fig6_train", "Figure 6 (trainability) / Table 5: the rank grid trained on CIFAR-10",
               "the study, fig6, tab5", analyses=("fig6", "table5"), claims=FIG6_TRAIN,
               needs=Needs(cifar10=True, train=True, gpu_full=True), reads=('fig6',)),)
