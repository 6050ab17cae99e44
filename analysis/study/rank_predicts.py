"""Rank at init predicts trainability: Spearman ρ and ROC-AUC over every trained grid: the command
``rank_predicts``, the claims and the registry entry."""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import rankdata

from rankexp.knobs import KNOBS
from rankexp.tracking import TrackingError

from ..core import style
from ..core.claims import Claim, Measured, NotRun, Runs, above
from ..core.registry import Experiment, Needs, default
from ..core.runner import Command, set_experiment_default
from ..core.runs import load_runs
from ..core.select import SelectionError
from ..core.style import write_markdown
from . import publish

log = logging.getLogger("analysis")

#: init quantity → the probe that logs it
QUANTITIES = {"erank_io": "io_jacobian", "stable_rank_io": "io_jacobian",
              "mean_path_order": "path_order", "log_gain_io": "io_jacobian",
              "grad_norm_proxy": "grad_norm_proxy", "jacob_cov": "jacob_cov",
              "log_synflow": "synflow"}

#: the trained outcomes ρ is taken against
TARGETS = ("max_stable_lr", "best_test_accuracy")

#: the statistics of the table, in its order: ρ against each target, AUC of "trainable"
STATISTICS = tuple(f"rho:{t}" for t in TARGETS) + ("auc:trainable",)

#: this analysis' own task=measure grid: every quantity on the trained grids' networks
INIT_EXPERIMENT = "rank_predicts"

#: bootstrap resamples and seed (stated in the table and the figure)
RESAMPLES, SEED = 2000, 0

#: fewer joined configs than this: no statistic (NaN), the claims are not judged
MIN_CONFIGS = 6

#: the knobs that define the network (rankexp/knobs.py's rows of the architecture and the
#: general block: not the task's, the seeds', the precision or where it runs), and the model
ARCH_KEYS = ("model.name",) + tuple(
    k.key for k in KNOBS
    if k.task is None and k.key.split(".")[0] not in ("task", "tracking", "data", "hydra")
    and k.key not in ("seeds", "seed", "device", "dtype", "lr"))


def spearman(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman ρ of the last axis of ``x`` against ``y`` (same shape ``(…, n)``): the Pearson
    correlation of their average ranks (ties share the mean rank; ±∞ rank at the ends).  NaN
    where either is constant.  Equals ``scipy.stats.spearmanr`` (tested)."""
    rx, ry = rankdata(x, axis=-1), rankdata(y, axis=-1)
    rx, ry = rx - rx.mean(-1, keepdims=True), ry - ry.mean(-1, keepdims=True)
    den = np.sqrt((rx * rx).sum(-1) * (ry * ry).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (rx * ry).sum(-1) / np.where(den > 0, den, 1.0), np.nan)


def roc_auc(score: np.ndarray, label: np.ndarray) -> np.ndarray:
    """ROC-AUC of ``score`` for the boolean ``label`` along the last axis: P(score of a positive
    > score of a negative) + ½ P(tie) = Mann–Whitney U₁/(n₁n₀), from average ranks.  NaN where
    one class is empty."""
    label = np.asarray(label, bool)
    r = rankdata(score, axis=-1)
    n1 = label.sum(-1)
    n0 = label.shape[-1] - n1
    u = (r * label).sum(-1) - n1 * (n1 + 1) / 2
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((n1 > 0) & (n0 > 0), u / np.maximum(n1 * n0, 1), np.nan)


def bootstrap_interval(stat, x: np.ndarray, y: np.ndarray, *, resamples: int = RESAMPLES,
                       seed: int = SEED, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of ``stat(x, y)`` over paired resamples of the n configs
    (``numpy.random.default_rng(seed)``; resamples where the statistic is undefined — one class,
    a constant — are left out).  ``(nan, nan)`` when none is defined."""
    idx = np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))
    values = stat(np.asarray(x)[idx], np.asarray(y)[idx])
    values = values[np.isfinite(values)]
    if not len(values):
        return math.nan, math.nan
    tail = 100 * (1 - level) / 2
    return float(np.percentile(values, tail)), float(np.percentile(values, 100 - tail))


def trained_experiments() -> list[str]:
    """The registry's experiments that train (:attr:`Needs.train`), in document order."""
    return [e.id for e in default() if e.needs.train]


def _load(name: str, uri: str | None) -> pd.DataFrame:
    try:
        return load_runs(name, uri)
    except TrackingError:
        return pd.DataFrame()


def _key(row: pd.Series, keys: list[str]) -> tuple:
    """The row's architecture as a hashable tuple: numbers to 9 digits, a missing value as
    ``"nan"`` (NaN ≠ NaN would never match), everything else as text."""
    return tuple(("nan" if math.isnan(float(v)) else round(float(v), 9))
                 if isinstance(v, (int, float, np.number)) and not isinstance(v, bool) else str(v)
                 for v in (row[k] for k in keys))


def join_init(train: pd.DataFrame, init: pd.DataFrame) -> pd.DataFrame:
    """``train`` with each :data:`QUANTITIES` column filled from ``init`` (measure runs): the mean
    over the init runs whose :data:`ARCH_KEYS` (those both tables have) equal the trained run's;
    a value the trained run logged itself is kept.  Columns ``init_runs`` (how many matched)."""
    out = train.copy()
    for q in QUANTITIES:
        if q not in out:
            out[q] = np.nan
    if init.empty:
        out["init_runs"] = 0
        return out
    keys = [k for k in ARCH_KEYS if k in train and k in init]
    have = [q for q in QUANTITIES if q in init]
    groups = {k: g for k, g in init.groupby(init.apply(_key, axis=1, keys=keys))} if keys else {}
    matched = []
    for i, row in out.iterrows():
        g = groups.get(_key(row, keys))
        matched.append(0 if g is None else len(g))
        for q in have:
            if g is not None and not np.isfinite(out.at[i, q]):
                out.at[i, q] = g[q].mean()
    out["init_runs"] = matched
    return out


def joined_configs(uri: str | None, experiments: list[str] | None = None) -> pd.DataFrame:
    """Every trained config of ``experiments`` joined with its init quantities, ``grid`` = its
    experiment; SelectionError without trained runs."""
    reg = default()
    frames = []
    own = _load(INIT_EXPERIMENT, uri)
    for name in experiments or trained_experiments():
        train = _load(name, uri)
        if train.empty or "best_test_accuracy" not in train:
            continue
        init = pd.concat([own, *(_load(r, uri) for r in reg[name].reads if r in reg)],
                         ignore_index=True) if name in reg else own
        joined = join_init(train, init)
        joined["grid"] = name
        log.info("%s: %d trained runs, %d with init quantities", name, len(joined),
                 int(joined[list(QUANTITIES)].notna().any(axis=1).sum()))
        frames.append(joined)
    if not frames:
        raise SelectionError(f"no trained runs of {experiments or trained_experiments()} in the "
                             "store; run one first (python -m rankexp experiment=fig6_train -m)")
    return pd.concat(frames, ignore_index=True)


def _columns(df: pd.DataFrame, quantity: str, statistic: str) -> tuple[np.ndarray, np.ndarray]:
    """The paired (init value, outcome) of the configs that have the quantity."""
    kind, target = statistic.split(":")
    lr = df["max_stable_lr"].astype(float) if "max_stable_lr" in df else pd.Series(np.nan, df.index)
    if kind == "auc":
        y = lr.notna().to_numpy()
    elif target == "max_stable_lr":
        y = lr.fillna(0.0).to_numpy()  # no LR trains: below every LR
    else:
        y = df[target].astype(float).to_numpy()
    x = df[quantity].astype(float).to_numpy() if quantity in df else np.full(len(df), np.nan)
    keep = ~np.isnan(x) & ~np.isnan(y.astype(float))
    return x[keep], y[keep]


def statistic_row(df: pd.DataFrame, quantity: str, statistic: str, *, resamples: int = RESAMPLES,
                  seed: int = SEED, min_configs: int = MIN_CONFIGS) -> dict:
    """``statistic`` (of :data:`STATISTICS`) of ``quantity`` over the configs ``df``: ``value``
    (ρ or AUC), ``lo``/``hi`` (bootstrap 95 %), ``n`` configs that have both, ``n_trainable``;
    NaN values below ``min_configs``."""
    x, y = _columns(df, quantity, statistic)
    stat = roc_auc if statistic.startswith("auc") else spearman
    value = float(stat(x, y)) if len(x) >= min_configs else math.nan
    lo, hi = (bootstrap_interval(stat, x, y, resamples=resamples, seed=seed)
              if np.isfinite(value) else (math.nan, math.nan))
    trainable = int(np.isfinite(df["max_stable_lr"].astype(float)).sum()) \
        if "max_stable_lr" in df else 0
    return {"value": value, "lo": lo, "hi": hi, "n": len(x), "n_trainable": trainable}


def prediction_table(df: pd.DataFrame, *, resamples: int = RESAMPLES, seed: int = SEED,
                     min_configs: int = MIN_CONFIGS) -> pd.DataFrame:
    """One row per (grid, quantity, statistic) (:func:`statistic_row`).  Grid ``all`` pools
    every grid, then each grid alone where there are several.  ``df``: rows of
    :func:`joined_configs` (columns ``grid``, the quantities, the targets)."""
    grids = [("all", df)] + ([(g, d) for g, d in df.groupby("grid", sort=False)]
                             if df["grid"].nunique() > 1 else [])
    rows = [{"grid": grid, "quantity": q, "statistic": s,
             **statistic_row(d, q, s, resamples=resamples, seed=seed, min_configs=min_configs)}
            for grid, d in grids for q in QUANTITIES for s in STATISTICS]
    return pd.DataFrame(rows).set_index(["grid", "quantity", "statistic"])


#: each statistic's panel: title, x label, the no-information line
PANELS = {"rho:max_stable_lr": ("vs max stable learning rate", "Spearman ρ", 0.0),
          "rho:best_test_accuracy": ("vs best test accuracy", "Spearman ρ", 0.0),
          "auc:trainable": ("trainable (a stable LR exists)", "ROC-AUC", 0.5)}


def draw(table: pd.DataFrame, grid: str = "all"):
    """One panel per statistic (:data:`PANELS`): each quantity's value (dot) and bootstrap
    95 % interval (bar), quantities as rows named in mathtext; the no-information line (ρ = 0,
    AUC = ½) dashed; the configs n in the title (per row where they differ)."""
    t = table.xs(grid, level="grid")
    quantities = list(QUANTITIES)
    fig, axes = style.panels(len(STATISTICS), max_cols=3, aspect=1.3)
    for ax, s in zip(axes, STATISTICS, strict=True):
        title, xlabel, none = PANELS[s]
        rows = t.xs(s, level="statistic").reindex(quantities)
        y = np.arange(len(quantities))
        v, lo, hi = (rows[c].to_numpy(float) for c in ("value", "lo", "hi"))
        ok = np.isfinite(lo) & np.isfinite(hi)
        ax.errorbar(v[ok], y[ok], xerr=np.abs(np.vstack([v[ok] - lo[ok], hi[ok] - v[ok]])),
                    fmt="o", ms=3.5, capsize=2, color="C0")
        alone = ~ok & np.isfinite(v)
        ax.plot(v[alone], y[alone], "o", ms=3.5, color="C0")
        ax.axvline(none, color="gray", lw=0.8, ls="--")
        if not np.isfinite(v).any():
            ax.text(0.5, 0.5, "undefined: the outcome is the same\nfor every config (or n too small)",
                    transform=ax.transAxes, ha="center", va="center", fontsize=7, color="0.35")
        ns = rows["n"].to_numpy(int)
        if len(set(ns)) == 1:
            title += f", n = {ns[0]}"
        else:
            for yi, n in zip(y, ns, strict=True):
                ax.annotate(f"n = {n}", (0.02, yi - 0.2), xycoords=("axes fraction", "data"),
                            ha="left", va="bottom", fontsize=6, color="0.35")
        ax.set_xlim(-1.05, 1.05) if s.startswith("rho") else ax.set_xlim(-0.02, 1.02)
        ax.set_yticks(y, [style.name(q) for q in quantities] if ax is axes[0] else [])
        ax.set(ylim=(len(quantities) - 0.5, -0.5), xlabel=xlabel)
        if ax is axes[0]:
            ax.set_ylabel("quantity at initialization")
        ax.set_title(title, fontsize="small")
    return fig


def _arguments(p: argparse.ArgumentParser) -> None:
    set_experiment_default(p, None, "trained experiments to read (default: every experiment of "
                           "the registry that trains, Needs.train)")
    p.add_argument("--resamples", type=int, default=RESAMPLES,
                   help=f"bootstrap resamples B (default {RESAMPLES}; seed {SEED})")
    p.add_argument("--min-configs", type=int, default=MIN_CONFIGS,
                   help=f"fewest configs a statistic is computed on (default {MIN_CONFIGS})")


def _main(args: argparse.Namespace) -> list[Path]:
    df = joined_configs(args.uri, args.experiment)
    table = prediction_table(df, resamples=args.resamples, min_configs=args.min_configs)
    out = Path(args.out) / INIT_EXPERIMENT
    title = (f"Init quantities against trainability: Spearman ρ and ROC-AUC, bootstrap 95 % "
             f"intervals (B = {args.resamples}, seed {SEED}); grids {sorted(df['grid'].unique())}")
    md = write_markdown(out / "rank_predicts.md", title, table.reset_index(), floatfmt=".3g")
    return [md, *publish(draw(table), "Does rank at initialization predict trainability?", df,
                         sorted(df["grid"].unique()), [f"{len(df)} trained configs",
                         f"bootstrap B = {args.resamples}, seed {SEED}", "bars: 95 % intervals",
                         "untrained: max stable LR = 0"], out, "rank_predicts", table)]


def measured(df: pd.DataFrame, quantity: str, statistic: str, *, none: float = 0.0,
             resamples: int = RESAMPLES, min_configs: int = MIN_CONFIGS) -> Measured:
    """ρ or AUC of ``quantity`` over ``df`` as :class:`Measured`: ``spread`` is its distance to
    the bootstrap interval's lower end, so ``above(none)`` holds when the interval does; NotRun
    below ``min_configs``."""
    x, _ = _columns(df, quantity, statistic)
    if len(x) < min_configs:
        raise NotRun(f"{len(x)} trained configs joined with {quantity} (probe "
                     f"{QUANTITIES[quantity]}); the statistic needs ≥ {min_configs}")
    row = statistic_row(df, quantity, statistic, resamples=resamples, min_configs=min_configs)
    value, lo, hi = row["value"], row["lo"], row["hi"]
    note = (f"n = {int(row['n'])} configs of {sorted(df['grid'].unique())}; bootstrap 95 % "
            f"[{lo:.2f}, {hi:.2f}] (B = {resamples}, seed {SEED}); no information: {none:g}")
    return Measured(value, value - lo if np.isfinite(lo) else math.nan, note)


def _joined(runs: Runs) -> pd.DataFrame:
    if "rank_predicts" not in runs.cache:
        try:
            runs.cache["rank_predicts"] = joined_configs(runs.uri)
        except SelectionError as e:
            runs.cache["rank_predicts"] = e
    found = runs.cache["rank_predicts"]
    if isinstance(found, Exception):
        raise NotRun(str(found))
    return found


RANK_PREDICTS = (
    Claim("rank_predicts.erank_lr", "Rank at initialization predicts trainability: "
          "erank(∂h_L/∂h_0)/d at init rises with the max stable learning rate over every "
          "trained config (Spearman ρ > 0, its bootstrap 95 % interval above 0)",
          "the study (the central claim); issue 21", "ρ > 0", above(0.0),
          lambda runs: measured(_joined(runs), "erank_io", "rho:max_stable_lr"), size="cpu"),
    Claim("rank_predicts.erank_auc", "erank(∂h_L/∂h_0)/d at init separates trainable configs "
          "(a stable LR exists) from the rest: ROC-AUC > 0.5, its bootstrap 95 % interval "
          "above 0.5", "the study; issue 21", "AUC > 0.5", above(0.5),
          lambda runs: measured(_joined(runs), "erank_io", "auc:trainable", none=0.5),
          size="cpu"))

COMMANDS = {
    'rank_predicts': Command(_main, "Spearman ρ and ROC-AUC of each init "
                                     "quantity against max stable LR and best test accuracy, "
                                     "over every trained grid", arguments=_arguments)}

EXPERIMENTS = (
    Experiment(
        INIT_EXPERIMENT,
        "Rank at init predicts trainability: Spearman ρ and ROC-AUC over every trained grid",
        "the study; issue 21 item 4", analyses=("rank_predicts",), claims=RANK_PREDICTS,
        needs=Needs(gpu_full=True),
        # the smoke end to end trains fig6_train only; the analysis reads every trained grid
        reads=("fig6_train",)),)
