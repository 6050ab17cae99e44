"""Per-layer series: Figure 1 (rank profiles), Figure 11 (stream growth), Figure 5b/12
(accumulated branch).  Every series is read with :func:`rankexp.tracking.metric_history`,
one call per run and key (step = layer).

Commands (``python -m analysis <command> --help``):

* ``profiles``    — ``erank(∂h_l/∂h_0)/d`` vs layer l, panels skip spacing × β scaling,
  one line per m/d (Figure 1; experiment ``fig1``).
* ``stream``      — ``rms(h_l)² − rms(h_0)²`` vs ``(βα^M)² l`` with the fitted κ of each
  run and the theory κ = E[σ(z)²] (½ for ReLU) of :func:`rankexp.theory.activation_constants`
  (Figure 11; Pre-Norm runs of ``fig5``).
* ``accumulated`` — ``‖Σ_{l≤k} βJ_l‖_F/‖I‖_F`` vs k and its final value vs L, beside the
  uncorrelated prediction ``(Σ_l ‖βJ_l‖_F²)^{1/2}/‖I‖_F`` from the measured r_l and in closed
  form (Figure 5b/12; ``fig5``).  Post-Norm grows ∝ √L, Pre-Norm stays flat.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from rankexp.theory import activation_constants, prenorm_branch_ratio, prenorm_stream_rms

from .common import (
    PLACEMENT,
    PLACEMENT_ORDER,
    Command,
    add_where,
    label,
    load,
    ordered,
    out_dir,
    series,
    set_experiment_default,
    to_markdown,
    warn_mixed,
    write_text,
)
from .plotting import plt, save

log = logging.getLogger("analysis")


def _cells(df: pd.DataFrame, keys: list[str]):
    """``(cell values, runs)`` for each distinct combination of ``keys`` (sorted)."""
    if not keys:
        yield (), df
        return
    for values, runs in df.groupby(keys, sort=True, dropna=False):
        yield (values if isinstance(values, tuple) else (values,)), runs


# --------------------------------------------------------------------------- profiles (Fig. 1)
def profile_table(
    df: pd.DataFrame, uri: str | None, keys: list[str], metric: str = "erank_profile"
) -> pd.DataFrame:
    """Long table of the per-layer ``metric`` averaged over the runs of each cell of ``keys``.

    Columns: ``keys…``, ``layer``, ``<metric>`` (mean over the cell's runs of each run's
    seed-mean), ``<metric>_std`` (the seed spread logged by the probe, mean over runs),
    ``runs``.  One :func:`metric_history` call per run for ``metric`` and one for
    ``<metric>_std`` (absent with one seed: 0).
    """
    rows = []
    bar = tqdm(total=len(df), desc=f"{metric} series", disable=None, leave=False)
    for values, runs in _cells(df, keys):
        parts = []
        for rid in runs["run_id"]:
            steps, v = series(uri, rid, metric)
            try:
                _, s = series(uri, rid, f"{metric}_std")
            except KeyError:
                s = np.zeros_like(v)
            parts.append(pd.DataFrame({"layer": steps, metric: v, f"{metric}_std": s}))
            bar.update()
        mean = pd.concat(parts).groupby("layer").mean()
        mean["runs"] = len(parts)
        rows.append(mean.reset_index().assign(**dict(zip(keys, values, strict=True))))
    bar.close()
    out = pd.concat(rows, ignore_index=True)
    return out[keys + ["layer", metric, f"{metric}_std", "runs"]]


def draw_profiles(table: pd.DataFrame, metric: str, rows: str, cols: str, hue: str, ylabel: str):
    """Grid ``rows × cols`` of panels, one line per ``hue`` value, shaded ± seed std."""
    rv = sorted(table[rows].unique()) if rows else [None]
    cv = sorted(table[cols].unique()) if cols else [None]
    hv = sorted(table[hue].unique()) if hue else [None]
    cmap = plt.get_cmap("viridis")
    fig, axes = plt.subplots(
        len(rv),
        len(cv),
        figsize=(4.2 * len(cv), 3.0 * len(rv)),
        squeeze=False,
        sharey=True,
        layout="constrained",
    )
    for i, r in enumerate(rv):
        for j, c in enumerate(cv):
            ax = axes[i, j]
            sub = table
            if rows:
                sub = sub[sub[rows] == r]
            if cols:
                sub = sub[sub[cols] == c]
            for k, h in enumerate(hv):
                line = sub[sub[hue] == h] if hue else sub
                if line.empty:
                    continue
                color = cmap(k / max(len(hv) - 1, 1) * 0.9)
                ax.plot(
                    line["layer"],
                    line[metric],
                    color=color,
                    lw=1.4,
                    label=label(hue, h) if hue else None,
                )
                ax.fill_between(
                    line["layer"],
                    line[metric] - line[f"{metric}_std"],
                    line[metric] + line[f"{metric}_std"],
                    color=color,
                    alpha=0.15,
                    lw=0,
                )
            title = ", ".join(label(k, v) for k, v in ((rows, r), (cols, c)) if k)
            ax.set_title(title, fontsize=9)
            ax.set_ylim(0, 1.02)
            ax.grid(alpha=0.3)
            if i == len(rv) - 1:
                ax.set_xlabel("layer l")
            if j == 0:
                ax.set_ylabel(ylabel)
    if hue:
        axes[0, -1].legend(fontsize=8)
    return fig


def _profiles_arguments(p: argparse.ArgumentParser) -> None:
    set_experiment_default(p, ["fig1"], "MLflow experiment(s) (default: fig1)")
    p.add_argument(
        "--metric",
        default="erank_profile",
        help="per-layer series (default: erank_profile = erank(∂h_l/∂h_0)/d)",
    )
    p.add_argument(
        "--rows", default="skip_every", help="one panel row per value (default: skip_every)"
    )
    p.add_argument(
        "--cols", default="beta_scaling", help="one panel column per value (default: beta_scaling)"
    )
    p.add_argument(
        "--hue", default="expansion", help="one line per value (default: expansion = m/d)"
    )
    add_where(p)


def _profiles_main(args: argparse.Namespace) -> list[Path]:
    keys = [k for k in (args.rows, args.cols, args.hue) if k]
    df = load(args, keys)
    warn_mixed(df, keys, args.experiment)
    table = profile_table(df, args.uri, keys, args.metric)
    ylabel = "erank(∂h_l/∂h_0)/d" if args.metric == "erank_profile" else args.metric
    fig = draw_profiles(table, args.metric, args.rows, args.cols, args.hue, ylabel)
    fig.suptitle(f"{', '.join(args.experiment)}: {args.metric} per layer")
    return save(fig, out_dir(args), f"profiles_{args.metric}", table.set_index(keys + ["layer"]))


profiles_command = Command(_profiles_arguments, _profiles_main)


# --------------------------------------------------------------------------- stream (Fig. 11)
def kappa_theory(activation: str, alpha: float) -> float:
    """κ of ``rms(h_l)² = 1 + κ(βα^M)² l``: the energy a Pre-Norm branch adds per unit (βα^M)².

    The branch input has unit rms, its preactivation variance is α², so each block adds
    ``β² α^{2(M−1)} E[σ(α z)²]`` = ``(βα^M)² · E[σ(α z)²]/α²``; for positively homogeneous σ
    this is E[σ(z)²] (½ for ReLU) at every α (:func:`rankexp.theory.activation_constants`).
    """
    return activation_constants(activation, alpha**2).kappa / alpha**2


def stream_tables(df: pd.DataFrame, uri: str | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-run κ table and the long series table of Figure 11.

    Per run: ``kappa_fit`` (the logged ``stream_kappa``: per-seed least squares of
    ``rms² − rms_0²`` on ``(βα^M)² l`` through 0, mean over seeds), ``kappa_fit_mean``
    (the same fit on the seed-mean rms series), ``kappa_theory`` (:func:`kappa_theory`),
    ``rms_final`` (logged) and ``rms_final_theory`` (:func:`rankexp.theory.prenorm_stream_rms`
    at L, κ theory).  Series rows: run_id, layer l, ``x`` = (βα^M)² l, ``y`` = rms_l² − rms_0²
    of the seed-mean rms, ``y_theory`` = κ_theory x.
    """
    runs, rows = [], []
    for _, r in tqdm(df.iterrows(), total=len(df), desc="rms series", disable=None, leave=False):
        steps, rms = series(uri, r["run_id"], "rms")
        x = r["nominal_ratio"] ** 2 * steps
        y = rms**2 - rms[0] ** 2
        kt = kappa_theory(str(r["activation"]), float(r["alpha"]))
        runs.append(
            {
                "run_id": r["run_id"],
                PLACEMENT: r[PLACEMENT],
                "expansion": r["expansion"],
                "alpha": r["alpha"],
                "depth": int(r["depth"]),
                "nominal_ratio": r["nominal_ratio"],
                "kappa_fit": r["stream_kappa"],
                "kappa_fit_mean": float((x * y).sum() / (x * x).sum()),
                "kappa_theory": kt,
                "rms_final": r["rms_final"],
                "rms_final_theory": float(prenorm_stream_rms(r["depth"], r["nominal_ratio"], kt)),
            }
        )
        rows.append(
            pd.DataFrame(
                {"run_id": r["run_id"], "layer": steps, "x": x, "y": y, "y_theory": kt * x}
            )
        )
    return pd.DataFrame(runs), pd.concat(rows, ignore_index=True)


def _stream_arguments(p: argparse.ArgumentParser) -> None:
    set_experiment_default(p, ["fig5"], "MLflow experiment(s) (default: fig5)")
    p.add_argument(
        "--placement",
        default="pre",
        help="norm placement whose runs to draw (default: pre, where κ is defined; '' for all)",
    )
    add_where(p)


def _stream_main(args: argparse.Namespace) -> list[Path]:
    if args.placement:
        args.where = [*args.where, f"{PLACEMENT}={args.placement}"]
    df = load(
        args,
        [
            "rms_final",
            "stream_kappa",
            "nominal_ratio",
            "alpha",
            "depth",
            "activation",
            "expansion",
            PLACEMENT,
        ],
    )
    warn_mixed(
        df,
        ["alpha", "depth", "expansion", "beta", "beta_scaling", "norm.placement"],
        args.experiment,
    )
    per_run, long = stream_tables(df, args.uri)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.9), layout="constrained")
    alphas = sorted(per_run["alpha"].unique())
    cmap = plt.get_cmap("plasma")
    for _, r in per_run.iterrows():
        s = long[long["run_id"] == r["run_id"]].iloc[1:]  # l = 0 has x = 0 (log axes)
        color = cmap(alphas.index(r["alpha"]) / max(len(alphas) - 1, 1) * 0.85)
        ax.plot(s["x"], s["y"], color=color, lw=0.8, alpha=0.7)
    xs = np.geomspace(long["x"][long["x"] > 0].min(), long["x"].max(), 50)
    for kt in sorted(per_run["kappa_theory"].round(12).unique()):
        ax.plot(xs, kt * xs, "k--", lw=1.2, label=f"theory κ = {kt:.3g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("(βα^M)² l")
    ax.set_ylabel("rms(h_l)² − rms(h_0)²")
    ax.legend(fontsize=8)
    ax.set_title("stream growth (colour: α)", fontsize=9)
    for e, sub in per_run.groupby("expansion"):
        sub = sub.sort_values("nominal_ratio")
        bx.plot(
            sub["nominal_ratio"] * np.sqrt(sub["depth"]),
            sub["kappa_fit"],
            "o",
            ms=4,
            label=label("expansion", e),
        )
    for kt in sorted(per_run["kappa_theory"].round(12).unique()):
        bx.axhline(kt, color="k", ls="--", lw=1)
    bx.set_xscale("log")
    bx.set_xlabel("βα^M √L")
    bx.set_ylabel("fitted κ")
    bx.legend(fontsize=8)
    bx.set_title("κ per run vs theory", fontsize=9)
    fig.suptitle(f"{', '.join(args.experiment)}: Pre-Norm stream, rms² = 1 + κ(βα^M)² l")
    summary = per_run.groupby("nominal_ratio").agg(
        runs=("kappa_fit", "size"),
        kappa_fit=("kappa_fit", "mean"),
        kappa_fit_std=("kappa_fit", "std"),
        kappa_theory=("kappa_theory", "mean"),
    )
    print(
        f"Stream growth κ per βα^M, mean over runs ({', '.join(args.experiment)}, "
        f"{args.placement or 'all'} runs; noisy where (βα^M)² L ≪ 1)\n"
    )
    print(to_markdown(summary))
    out = out_dir(args)
    paths = save(fig, out, "stream_kappa", per_run.set_index("run_id"))
    long.to_csv(out / "stream_series.csv", index=False)
    paths.append(out / "stream_series.csv")
    log.info("wrote %s", paths[-1])
    return paths


stream_command = Command(_stream_arguments, _stream_main)


# --------------------------------------------------------------------------- accumulated (Fig. 5b/12)
def uncorrelated_theory(
    layers, placement: str, nominal_ratio: float, activation: str, alpha: float
) -> np.ndarray:
    """Closed-form uncorrelated prediction ``(Σ_{l≤k} r_l²)^{1/2}`` at each k of ``layers``.

    ``r_l = √p · r̃_l`` (p = E[σ′(αz)²], :func:`rankexp.theory.activation_constants`):
    Pre-Norm ``r̃_l`` decays as Eq. 22 (:func:`rankexp.theory.prenorm_branch_ratio`, κ of
    :func:`kappa_theory`); every other placement here holds ``r̃_l = βα^M`` (Eq. 21 at unit
    rms; exact for post), so the sum grows as ``√(p k) βα^M``.
    """
    k = np.asarray(layers, dtype=float)
    p = activation_constants(activation, alpha**2).survival
    if placement == "pre":
        full = np.arange(1, int(k.max()) + 1)
        r2 = p * prenorm_branch_ratio(full, nominal_ratio, kappa_theory(activation, alpha)) ** 2
        return np.sqrt(np.cumsum(r2))[k.astype(int) - 1]
    return np.sqrt(p * k) * nominal_ratio


def accumulated_table(df: pd.DataFrame, uri: str | None) -> pd.DataFrame:
    """Long table, one row per (run, k): ``accumulated`` (logged ``accumulated_branch``),
    ``uncorrelated`` (logged ``accumulated_branch_uncorrelated``, from the measured r_l) and
    ``theory`` (:func:`uncorrelated_theory`), with the run's placement, m/d, α, L."""
    rows = []
    for _, r in tqdm(
        df.iterrows(), total=len(df), desc="accumulated series", disable=None, leave=False
    ):
        k, acc = series(uri, r["run_id"], "accumulated_branch")
        _, unc = series(uri, r["run_id"], "accumulated_branch_uncorrelated")
        th = uncorrelated_theory(
            k, r[PLACEMENT], r["nominal_ratio"], str(r["activation"]), float(r["alpha"])
        )
        rows.append(
            pd.DataFrame(
                {
                    "run_id": r["run_id"],
                    PLACEMENT: r[PLACEMENT],
                    "expansion": r["expansion"],
                    "alpha": r["alpha"],
                    "depth": int(r["depth"]),
                    "k": k,
                    "accumulated": acc,
                    "uncorrelated": unc,
                    "theory": th,
                }
            )
        )
    return pd.concat(rows, ignore_index=True)


def _accumulated_arguments(p: argparse.ArgumentParser) -> None:
    set_experiment_default(p, ["fig5"], "MLflow experiment(s) (default: fig5)")
    p.add_argument(
        "--alpha",
        type=float,
        default=1.0,
        help="α of the curves vs k in the left column (default: 1)",
    )
    add_where(p)


def _accumulated_main(args: argparse.Namespace) -> list[Path]:
    df = load(
        args,
        [
            "accumulated_branch_final",
            "nominal_ratio",
            "alpha",
            "depth",
            "expansion",
            "activation",
            PLACEMENT,
        ],
    )
    warn_mixed(df, ["alpha", "depth", "expansion", PLACEMENT], args.experiment)
    table = accumulated_table(df, args.uri)
    final = table.sort_values("k").groupby("run_id").tail(1).set_index("run_id")
    placements = ordered(table[PLACEMENT], PLACEMENT_ORDER)
    alphas = sorted(table["alpha"].unique())
    a0 = min(alphas, key=lambda a: abs(np.log(a / args.alpha)))
    expansions = sorted(table["expansion"].unique())
    styles = dict(zip(expansions, ["-", "--", ":", "-."] * 4, strict=False))
    fig, axes = plt.subplots(
        len(placements), 2, figsize=(10, 3.4 * len(placements)), squeeze=False, layout="constrained"
    )
    dcmap, acmap = plt.get_cmap("viridis"), plt.get_cmap("plasma")
    depths = sorted(table["depth"].unique())
    for i, pl in enumerate(placements):
        ax, bx = axes[i]
        sub = table[(table[PLACEMENT] == pl) & np.isclose(table["alpha"], a0)]
        for (L, e), s in sub.groupby(["depth", "expansion"]):
            c = dcmap(depths.index(L) / max(len(depths) - 1, 1) * 0.9)
            ax.plot(
                s["k"],
                s["accumulated"],
                color=c,
                ls=styles[e],
                lw=1.3,
                label=f"L={L}" if e == expansions[0] else None,
            )
            ax.plot(s["k"], s["uncorrelated"], color=c, ls=styles[e], lw=0.7, alpha=0.5)
        if len(sub):
            longest = sub[sub["depth"] == sub["depth"].max()].drop_duplicates("k")
            ax.plot(longest["k"], longest["theory"], "k:", lw=1.2, label="uncorrelated, theory")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("k (layers summed)")
        ax.set_ylabel("‖Σ_{l≤k} βJ_l‖_F / ‖I‖_F")
        ax.set_title(f"{pl}, α = {a0:g} (thin: uncorrelated from measured r_l)", fontsize=9)
        ax.legend(fontsize=7)
        fin = final[final[PLACEMENT] == pl]
        for (a, e), s in fin.groupby(["alpha", "expansion"]):
            s = s.sort_values("depth")
            c = acmap(alphas.index(a) / max(len(alphas) - 1, 1) * 0.85)
            bx.plot(
                s["depth"],
                s["accumulated"],
                "o",
                color=c,
                ls=styles[e],
                ms=3,
                lw=1,
                label=f"α={a:g}" if e == expansions[0] else None,
            )
            bx.plot(s["depth"], s["theory"], color=c, ls=":", lw=0.8)
        bx.set_xscale("log")
        bx.set_yscale("log")
        bx.set_xticks(depths, [str(d) for d in depths])
        bx.minorticks_off()
        bx.set_xlabel("L (depth)")
        bx.set_ylabel("accumulated branch at k = L")
        styles_txt = ", ".join(f"m/d {e:g} {styles[e]}" for e in expansions)
        bx.set_title(f"{pl}: final vs L (dotted: theory; {styles_txt})", fontsize=9)
        bx.legend(fontsize=6, ncol=2)
    fig.suptitle(f"{', '.join(args.experiment)}: accumulated branch (Figure 5b / 12)")
    slope = []
    for (pl, e, a), s in final.groupby([PLACEMENT, "expansion", "alpha"]):
        if s["depth"].nunique() >= 2:
            b = np.polyfit(np.log(s["depth"]), np.log(s["accumulated"]), 1)[0]
            slope.append({PLACEMENT: pl, "expansion": e, "alpha": a, "slope_log_L": b})
    if slope:
        st = (
            pd.DataFrame(slope)
            .groupby([PLACEMENT, "expansion"])["slope_log_L"]
            .agg(["mean", "min", "max"])
        )
        print(
            "d log(accumulated branch at L) / d log L, over α "
            "(study: ≈ 0.5 for post, ≈ 0 for pre)\n"
        )
        print(to_markdown(st))
        write_text(out_dir(args) / "accumulated_branch_slopes.md", to_markdown(st) + "\n")
    return save(fig, out_dir(args), "accumulated_branch", table.set_index(["run_id", "k"]))


accumulated_command = Command(_accumulated_arguments, _accumulated_main)
