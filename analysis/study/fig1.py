"""Figure 1: the per-layer rank profile with and without skips: the command ``profiles``, the
claims and the registry entry."""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from rankexp.theory import activation_constants, prenorm_branch_ratio, prenorm_stream_rms

from ..core import style
from ..core.claims import Claim, Measured, NotRun, Runs, above, at_least, at_most
from ..core.registry import Experiment, Needs
from ..core.runner import Command, out_dir
from ..core.select import (
    PLACEMENT,
    PLACEMENT_ORDER,
    load,
    need,
    only,
    ordered,
    pooled,
    series,
    warn_mixed,
)
from . import mean_ratio, publish

log = logging.getLogger("analysis")


def seed_sd(uri: str | None, run_id: str, metric: str, like: np.ndarray) -> np.ndarray:
    """The run's ``<metric>_std`` series; zeros shaped as ``like`` if it logged none."""
    try:
        return series(uri, run_id, f"{metric}_std")[1]
    except KeyError:
        return np.zeros_like(like, dtype=float)


def profile_table(df: pd.DataFrame, uri: str | None, keys: list[str],
                  metric: str = "erank_profile") -> pd.DataFrame:
    """Long table of the per-layer ``metric`` per cell of ``keys``: ``keys…``, ``layer``,
    ``<metric>`` (seed mean), ``<metric>_std`` (pooled, :func:`analysis.core.select.pooled`),
    ``runs``, ``theory`` (:data:`SERIES_THEORY` where the cell's runs share its inputs, else NaN)."""
    rows = []
    groups = df.groupby(keys, sort=True, dropna=False) if keys else [((), df)]
    for values, runs in tqdm(groups, desc=f"{metric} series", disable=None, leave=False):
        parts = []
        for _, r in runs.iterrows():
            steps, v = series(uri, r["run_id"], metric)
            parts.append(pd.DataFrame({"layer": steps, metric: v, "seeds": r.get("seeds", 1.0),
                                       f"{metric}_std": seed_sd(uri, r["run_id"], metric, v)}))
        t = pooled(pd.concat(parts), metric, ["layer"]).assign(runs=len(parts))
        t["theory"] = _series_theory(metric, runs, t.index.to_numpy())
        rows.append(t.reset_index().assign(**dict(zip(keys, values, strict=True))))
    out = pd.concat(rows, ignore_index=True)
    out = out.rename(columns={"mean": metric, "std": f"{metric}_std"})
    out[f"{metric}_std"] = out[f"{metric}_std"].fillna(0.0)  # one seed: no band
    return out[keys + ["layer", metric, f"{metric}_std", "runs", "theory"]]


def branch_ratio_theory(layers, placement: str, nominal_ratio: float, activation: str,
                        alpha: float) -> np.ndarray:
    """Predicted ``r_l = ‖βJ_l‖_F/‖I‖_F = √p · r̃_l`` (p = E[σ′(αz)²]): Pre-Norm ``r̃_l`` is Eq. 22
    (κ of :func:`kappa_theory`); other placements ``r̃_l = βα^M`` (Eq. 21, exact for post)."""
    layers = np.asarray(layers, dtype=float)
    p = activation_constants(activation, alpha**2).survival
    if placement == "pre":
        r = prenorm_branch_ratio(layers, nominal_ratio, kappa_theory(activation, alpha))
    else:
        r = np.full(layers.shape, float(nominal_ratio))
    return np.sqrt(p) * r


def _stream_theory(layers, placement, nominal_ratio, activation, alpha) -> np.ndarray:
    """Pre-Norm ``rms(h_l) = √(1 + κ(βα^M)² l)`` (Figure 11); Post-Norm holds rms = 1."""
    if placement == "pre":
        return prenorm_stream_rms(layers, nominal_ratio, kappa_theory(activation, alpha))
    if placement == "post":
        return np.ones(np.shape(layers))
    return np.full(np.shape(layers), np.nan)


#: per-layer series with a closed form: ``f(layers, placement, βα^M, activation, α)``
SERIES_THEORY = {"branch_ratio": branch_ratio_theory, "rms": _stream_theory}

_THEORY_NAME = {"branch_ratio": r"dashed: $\sqrt{p}\,\tilde r_\ell$ (Eq. 21/22)",
                "rms": r"dashed: $\sqrt{1+\kappa(\beta\alpha^M)^2\ell}$"}

_THEORY_INPUTS = (PLACEMENT, "nominal_ratio", "activation", "alpha")


def _series_theory(metric: str, runs: pd.DataFrame, layers: np.ndarray) -> np.ndarray:
    f = SERIES_THEORY.get(metric)
    if f is None or any(k not in runs for k in _THEORY_INPUTS):
        return np.full(layers.shape, np.nan)
    ctx = runs[list(_THEORY_INPUTS)].drop_duplicates()
    if ctx[PLACEMENT].nunique() > 1 or ctx["activation"].nunique() > 1 or not np.allclose(
            ctx["nominal_ratio"], ctx["nominal_ratio"].iloc[0], rtol=1e-6):
        return np.full(layers.shape, np.nan)  # a line over several contexts has no one prediction
    c = ctx.iloc[0]
    return np.asarray(f(layers, str(c[PLACEMENT]), float(c["nominal_ratio"]), str(c["activation"]),
                        float(c["alpha"])), dtype=float)


def draw_profiles(table: pd.DataFrame, metric: str, rows: str, cols: str, hue: str, ylabel: str):
    """Grid ``rows × cols`` of panels (page-sized), one line per ``hue`` value, shaded ±1 seed
    s.d., the closed form (``theory`` column) dashed; a numeric ``hue`` gets a colour bar."""
    rv = ordered(table[rows].unique(), PLACEMENT_ORDER) if rows else [None]
    cv = ordered(table[cols].unique(), PLACEMENT_ORDER) if cols else [None]
    hv = sorted(table[hue].unique()) if hue else [None]
    numeric = bool(hue) and pd.api.types.is_numeric_dtype(table[hue])
    colors, sm = style.value_colors(hv if hue else [0])
    fig, axes = style.grid(len(rv), len(cv), aspect=0.7, sharey=metric.startswith("erank"))
    theory_drawn = False
    for i, r in enumerate(rv):
        for j, c in enumerate(cv):
            ax = axes[i, j]
            sub = table
            for key, v in ((rows, r), (cols, c)):
                sub = sub[sub[key] == v] if key else sub
            for h in hv:
                line = sub[sub[hue] == h] if hue else sub
                if line.empty:
                    continue
                color = colors[h if hue else 0]
                ax.plot(line["layer"], line[metric], color=color,
                        label=style.value_label(hue, h) if hue and not numeric else None)
                ax.fill_between(line["layer"], line[metric] - line[f"{metric}_std"],
                                line[metric] + line[f"{metric}_std"], color=color, alpha=0.2, lw=0)
                if line["theory"].notna().any():
                    ax.plot(line["layer"], line["theory"], color=color, ls="--", lw=0.8)
                    theory_drawn = True
            ax.set_title(", ".join(style.value_label(k, v) for k, v in ((rows, r), (cols, c)) if k))
            if metric.startswith("erank"):
                ax.set_ylim(0, 1.02)
            if i == len(rv) - 1:
                ax.set_xlabel(style.name("layer"))
            if j == 0:
                ax.set_ylabel(ylabel)
    if theory_drawn:
        axes[0, 0].plot([], [], **style.THEORY, label=_THEORY_NAME.get(metric, "theory"))
        axes[0, 0].legend(loc="best")
    if hue and numeric:
        style.colorbar(fig, sm, axes, hue)
    elif hue:
        axes[0, -1].legend()
    return fig


def _profiles_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metric", default="erank_profile",
                   help="per-layer series (default: erank_profile = erank(∂h_l/∂h_0)/d)")
    p.add_argument("--rows", default="skip_every",
                   help="one panel row per value (default: skip_every)")
    p.add_argument("--cols", default="beta_scaling",
                   help="one panel column per value (default: beta_scaling)")
    p.add_argument("--hue", default="expansion",
                   help="one line per value (default: expansion = m/d)")


def _profiles_main(args: argparse.Namespace) -> list[Path]:
    keys = [k for k in (args.rows, args.cols, args.hue) if k]
    df = load(args, keys)
    if "depth" not in keys and df["depth"].nunique() > 1:
        # layer l of an L = 12 and an L = 192 network are not one profile: draw the deepest
        deepest = df["depth"].max()
        log.info("runs of %s have depths %s; drawing L = %d (select with --where depth=L)",
                 args.experiment, sorted(df["depth"].unique().tolist()), deepest)
        df = df[df["depth"] == deepest].reset_index(drop=True)
    warn_mixed(df, keys, args.experiment)
    table = profile_table(df, args.uri, keys, args.metric)
    fig = draw_profiles(table, args.metric, args.rows, args.cols, args.hue, style.name(args.metric))
    return publish(fig, f"{style.name(args.metric)} per layer", df, args.experiment,
                   ["shaded: ±1 s.d. over seeds"], out_dir(args), f"profiles_{args.metric}",
                   table.set_index(keys + ["layer"]))


def kappa_theory(activation: str, alpha: float) -> float:
    """κ of ``rms(h_l)² = 1 + κ(βα^M)² l``: each block adds ``(βα^M)² · E[σ(α z)²]/α²``, which is
    E[σ(z)²] (½ for ReLU) at every α for positively homogeneous σ."""
    return activation_constants(activation, alpha**2).kappa / alpha**2


def _fig1_noskip_collapse(runs: Runs) -> Measured:
    df = only(runs("fig1"), beta_scaling="const")
    need(df, "erank_io", "skip_every")
    return mean_ratio(runs, only(df, skip_every=0), only(df, skip_every=1), "erank_io",
                      "erank(∂h_L/∂h_0): no skip / skip every block, β const, mean over m/d")


def _fig1_flat(runs: Runs) -> Measured:
    df = only(runs("fig1"), beta_scaling="inv_sqrt_depth", skip_every=1)
    need(df, "erank_io")
    ratios = []
    for rid, final in zip(df["run_id"], df["erank_io"], strict=True):
        _, profile = runs.series(rid, "erank_profile")
        ratios.append(final / profile[0])
    return Measured(float(min(ratios)), math.nan,
                    "min over m/d of erank at l = L / erank at l = 1 (skip every block, β = 1/√L)")


def _fig1_troughs(runs: Runs) -> Measured:
    df = only(runs("fig1"), beta_scaling="const", skip_every=4)
    need(df, "erank_min", "expansion")
    means = df.groupby("expansion")["erank_min"].mean().sort_index()
    if len(means) < 2:
        raise NotRun("needs ≥ 2 values of m/d")
    step = float(np.diff(means.to_numpy()).min())
    return Measured(step, math.nan, f"smallest rise of the trough per m/d step over m/d ∈ "
                    f"{[float(e) for e in means.index]}")


FIG1 = (
    Claim("fig1.noskip_collapse", "Without skips the profile collapses with depth (vs an identity skip every block)",
          "the study, fig1", "collapse", at_most(0.5), _fig1_noskip_collapse),
    Claim("fig1.flat_inv_sqrt_depth", "β = 1/√L keeps the profile flat",
          "the study, fig1", "flat (≈ 1)", at_least(0.8), _fig1_flat),
    Claim("fig1.wider_troughs", "Wider branches raise the troughs of the sawtooth (skip every 4)",
          "the study, fig1", "rises with m/d", above(0.0), _fig1_troughs))

COMMANDS = {"profiles": Command(
    _profiles_main, "Figure 1: erank(∂h_l/∂h_0)/d vs layer, panels skip × β, lines per m/d",
    experiment="fig1", where=True, arguments=_profiles_arguments)}

EXPERIMENTS = (Experiment("fig1", "Figure 1: the per-layer rank profile with and without skips",
                          "the study, fig1", analyses=("profiles --experiment fig1",), claims=FIG1,
                          needs=Needs(gpu_full=True)),)
