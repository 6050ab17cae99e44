"""Per-layer series: Figure 1 (rank profiles), Figure 11 (stream growth), Figure 5b/12
(accumulated branch).  Every series is read with :func:`rankexp.tracking.metric_history`,
one call per run and key (step = layer).

Commands (``python -m analysis <command> --help``):

* ``profiles``    — ``erank(∂h_l/∂h_0)/d`` vs layer l, panels skip spacing × β scaling,
  one line per m/d (Figure 1; experiment ``fig1``); any per-layer series with
  ``--metric``: ``branch_ratio`` gets the Eq. 22 ratio ``√p r̃_l`` (Pre-Norm) / ``√p βα^M``
  (Post-Norm) dashed over each line, ``rms`` the Pre-Norm stream ``√(1 + κ(βα^M)² l)``.
* ``stream``      — ``rms(h_l)² − rms(h_0)²`` vs ``(βα^M)² l`` with the fitted κ of each
  run and the theory κ = E[σ(z)²] (½ for ReLU) of :func:`rankexp.theory.activation_constants`
  (Figure 11; Pre-Norm runs of ``fig5``).
* ``accumulated`` — ``‖Σ_{l≤k} βJ_l‖_F/‖I‖_F`` vs k and its final value vs L, beside the
  uncorrelated prediction ``(Σ_l ‖βJ_l‖_F²)^{1/2}/‖I‖_F`` from the measured r_l and in closed
  form, and the fully coherent sum ``Σ_l ‖βJ_l‖_F/‖I‖_F`` (Figure 5b/12; ``fig5``).
  Post-Norm grows ∝ √L, Pre-Norm stays flat.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from rankexp.theory import activation_constants, prenorm_branch_ratio, prenorm_stream_rms

from ..core import style
from ..core.runner import Command, add_where, out_dir, set_experiment_default
from ..core.select import PLACEMENT, PLACEMENT_ORDER, load, ordered, series, warn_mixed
from ..core.style import save
from ..core.tables import to_markdown, write_text

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
    """Long table of the per-layer ``metric`` over the seeds of each cell of ``keys``.

    Columns: ``keys…``, ``layer``, ``<metric>`` (mean over every seed of the cell's runs),
    ``<metric>_std`` (their standard deviation, pooled exactly from each run's logged
    ``<metric>_std`` series; :mod:`analysis.core.seeds`), ``runs``, and ``theory`` (the closed
    form of :data:`SERIES_THEORY` where the metric has one and the cell's runs share its
    inputs; NaN otherwise).  One :func:`metric_history` call per run for ``metric`` and one
    for ``<metric>_std`` (absent with one seed: 0).
    """
    rows = []
    bar = tqdm(total=len(df), desc=f"{metric} series", disable=None, leave=False)
    for values, runs in _cells(df, keys):
        parts = []
        for _, r in runs.iterrows():
            steps, v = series(uri, r["run_id"], metric)
            try:
                _, s = series(uri, r["run_id"], f"{metric}_std")
            except KeyError:
                s = np.zeros_like(v)
            n = float(r["seeds"]) if "seeds" in r and pd.notna(r["seeds"]) else 1.0
            parts.append(pd.DataFrame({"layer": steps, "m": v, "s": s, "n": n}))
            bar.update()
        pooled = pd.concat(parts).groupby("layer").apply(_pool, include_groups=False)
        pooled["runs"] = len(parts)
        pooled["theory"] = _series_theory(metric, runs, pooled.index.to_numpy())
        rows.append(pooled.reset_index().assign(**dict(zip(keys, values, strict=True))))
    bar.close()
    out = pd.concat(rows, ignore_index=True).rename(
        columns={"m": metric, "s": f"{metric}_std"}
    )
    return out[keys + ["layer", metric, f"{metric}_std", "runs", "theory"]]


def _pool(g: pd.DataFrame) -> pd.Series:
    """Mean and std of every seed of a layer from the runs' means ``m``, stds ``s``, counts ``n``."""
    n, m, s = g["n"].to_numpy(), g["m"].to_numpy(), g["s"].to_numpy()
    mean = (n * m).sum() / n.sum()
    ss = ((n - 1) * s**2 + n * (m - mean) ** 2).sum()
    return pd.Series({"m": mean, "s": np.sqrt(ss / (n.sum() - 1)) if n.sum() > 1 else 0.0})


def branch_ratio_theory(
    layers, placement: str, nominal_ratio: float, activation: str, alpha: float
) -> np.ndarray:
    """Measured branch-to-skip ratio ``r_l = ‖βJ_l‖_F/‖I‖_F`` predicted at each layer l.

    ``r_l = √p · r̃_l`` (p = E[σ′(αz)²], :func:`rankexp.theory.activation_constants`): Pre-Norm
    ``r̃_l`` is Eq. 22 (:func:`rankexp.theory.prenorm_branch_ratio`, κ of :func:`kappa_theory`);
    every other placement holds ``r̃_l = βα^M`` (Eq. 21 at unit rms: exact for post).
    """
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
_THEORY_NAME = {
    "branch_ratio": r"dashed: $\sqrt{p}\,\tilde r_\ell$ (Eq. 21/22)",
    "rms": r"dashed: $\sqrt{1+\kappa(\beta\alpha^M)^2\ell}$",
}
_THEORY_INPUTS = (PLACEMENT, "nominal_ratio", "activation", "alpha")


def _series_theory(metric: str, runs: pd.DataFrame, layers: np.ndarray) -> np.ndarray:
    f = SERIES_THEORY.get(metric)
    if f is None or any(k not in runs for k in _THEORY_INPUTS):
        return np.full(layers.shape, np.nan)
    ctx = runs[list(_THEORY_INPUTS)].drop_duplicates()
    if (
        ctx[PLACEMENT].nunique() > 1
        or ctx["activation"].nunique() > 1
        or not np.allclose(ctx["nominal_ratio"], ctx["nominal_ratio"].iloc[0], rtol=1e-6)
    ):
        return np.full(layers.shape, np.nan)  # a line over several contexts has no one prediction
    c = ctx.iloc[0]
    return np.asarray(
        f(layers, str(c[PLACEMENT]), float(c["nominal_ratio"]), str(c["activation"]),
          float(c["alpha"])),
        dtype=float,
    )


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
            if rows:
                sub = sub[sub[rows] == r]
            if cols:
                sub = sub[sub[cols] == c]
            for h in hv:
                line = sub[sub[hue] == h] if hue else sub
                if line.empty:
                    continue
                color = colors[h if hue else 0]
                ax.plot(
                    line["layer"],
                    line[metric],
                    color=color,
                    label=style.value_label(hue, h) if hue and not numeric else None,
                )
                ax.fill_between(
                    line["layer"],
                    line[metric] - line[f"{metric}_std"],
                    line[metric] + line[f"{metric}_std"],
                    color=color,
                    alpha=0.2,
                    lw=0,
                )
                if line["theory"].notna().any():
                    ax.plot(line["layer"], line["theory"], color=color, ls="--", lw=0.8)
                    theory_drawn = True
            title = ", ".join(style.value_label(k, v) for k, v in ((rows, r), (cols, c)) if k)
            ax.set_title(title)
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
    if "depth" not in keys and df["depth"].nunique() > 1:
        # layer l of an L = 12 and an L = 192 network are not one profile: draw the deepest
        deepest = df["depth"].max()
        log.info("runs of %s have depths %s; drawing L = %d (select with --where depth=L)",
                 args.experiment, sorted(df["depth"].unique().tolist()), deepest)
        df = df[df["depth"] == deepest].reset_index(drop=True)
    warn_mixed(df, keys, args.experiment)
    table = profile_table(df, args.uri, keys, args.metric)
    fig = draw_profiles(table, args.metric, args.rows, args.cols, args.hue, style.name(args.metric))
    fig.suptitle(f"{style.name(args.metric)} per layer")
    style.caption(fig, df, args.experiment, ["shaded: ±1 s.d. over seeds"])
    return save(fig, out_dir(args), f"profiles_{args.metric}", table.set_index(keys + ["layer"]))


PROFILES_COMMAND = Command(_profiles_arguments, _profiles_main,
                           "Figure 1: erank(∂h_l/∂h_0)/d vs layer, panels skip × β, lines per m/d")


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
                "kappa_fit_std": r.get("stream_kappa_std", np.nan),
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
    fig, (ax, bx) = style.panels(2, aspect=0.8)
    colors, sm = style.value_colors(per_run["alpha"], "plasma")
    for _, r in per_run.iterrows():
        s = long[long["run_id"] == r["run_id"]].iloc[1:]  # l = 0 has x = 0 (log axes)
        ax.plot(s["x"], s["y"], color=colors[r["alpha"]], lw=0.7, alpha=0.7)
    xs = np.geomspace(long["x"][long["x"] > 0].min(), long["x"].max(), 50)
    for kt in sorted(per_run["kappa_theory"].round(12).unique()):
        ax.plot(xs, kt * xs, **style.THEORY, label=rf"$\kappa = \mathrm{{E}}[\sigma^2] = {kt:.3g}$")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(r"$(\beta\alpha^M)^2\,\ell$")
    ax.set_ylabel(r"$\mathrm{rms}(h_\ell)^2 - \mathrm{rms}(h_0)^2$")
    ax.legend()
    ax.set_title("stream growth")
    style.colorbar(fig, sm, ax, "alpha")
    markers = dict(zip(sorted(per_run["expansion"].unique()), "os^Dv", strict=False))
    for (e, a), sub in per_run.groupby(["expansion", "alpha"]):
        bx.errorbar(
            sub["nominal_ratio"] * np.sqrt(sub["depth"]),
            sub["kappa_fit"],
            yerr=sub["kappa_fit_std"],
            fmt=markers[e],
            color=colors[a],
            mfc="none",
            ms=3,
            lw=0.6,
        )
    for e, m in markers.items():
        bx.plot([], [], m, color="0.3", mfc="none", label=style.value_label("expansion", e))
    for kt in sorted(per_run["kappa_theory"].round(12).unique()):
        bx.axhline(kt, **style.THEORY)
    bx.set_xscale("log")
    bx.set_xlabel(style.name("depth_factor"))
    bx.set_ylabel(style.name("stream_kappa"))
    bx.legend()
    bx.set_title(r"$\kappa$ per run (±1 s.d. over seeds)")
    fig.suptitle(r"Figure 11: Pre-Norm stream, $\mathrm{rms}(h_\ell)^2 = 1 + \kappa(\beta\alpha^M)^2\ell$")
    style.caption(fig, df, args.experiment, ["dashed: theory κ"])
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


STREAM_COMMAND = Command(_stream_arguments, _stream_main,
                         "Figure 11: Pre-Norm stream growth rms² − 1 vs (βα^M)² l, fitted vs theory κ")


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
    full = np.arange(1, int(k.max()) + 1)
    r = branch_ratio_theory(full, placement, nominal_ratio, activation, alpha)
    return np.sqrt(np.cumsum(r**2))[k.astype(int) - 1]


def coherent_theory(
    layers, placement: str, nominal_ratio: float, activation: str, alpha: float
) -> np.ndarray:
    """The fully coherent sum ``Σ_{l≤k} r_l`` (all βJ_l aligned, ‖Σ‖_F = Σ‖·‖_F) at each k,
    with the r_l of :func:`branch_ratio_theory`: the ceiling the accumulated branch reaches
    only if every block adds the same direction (∝ k for Post-Norm, ∝ √k for Pre-Norm)."""
    k = np.asarray(layers, dtype=float)
    full = np.arange(1, int(k.max()) + 1)
    r = branch_ratio_theory(full, placement, nominal_ratio, activation, alpha)
    return np.cumsum(r)[k.astype(int) - 1]


def accumulated_table(df: pd.DataFrame, uri: str | None) -> pd.DataFrame:
    """Long table, one row per (run, k): ``accumulated`` (logged ``accumulated_branch``),
    ``uncorrelated`` (logged ``accumulated_branch_uncorrelated``, from the measured r_l),
    ``theory`` (:func:`uncorrelated_theory`) and ``coherent`` (:func:`coherent_theory`), with
    the run's placement, m/d, α, L."""
    rows = []
    for _, r in tqdm(
        df.iterrows(), total=len(df), desc="accumulated series", disable=None, leave=False
    ):
        k, acc = series(uri, r["run_id"], "accumulated_branch")
        _, unc = series(uri, r["run_id"], "accumulated_branch_uncorrelated")
        ctx = (r[PLACEMENT], r["nominal_ratio"], str(r["activation"]), float(r["alpha"]))
        th = uncorrelated_theory(k, *ctx)
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
                    "coherent": coherent_theory(k, *ctx),
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
    styles = dict(zip(expansions, style.VALUE_STYLES * 4, strict=False))  # dashed: theory
    fig, axes = style.grid(len(placements), 2, aspect=0.72)
    depths = sorted(table["depth"].unique())
    dcolors, dsm = style.value_colors(depths, "viridis")
    acolors, asm = style.value_colors(alphas, "plasma")
    for i, pl in enumerate(placements):
        ax, bx = axes[i]
        sub = table[(table[PLACEMENT] == pl) & np.isclose(table["alpha"], a0)]
        for (L, e), s in sub.groupby(["depth", "expansion"]):
            ax.plot(s["k"], s["accumulated"], color=dcolors[L], ls=styles[e], lw=1.1)
            ax.plot(s["k"], s["uncorrelated"], color=dcolors[L], ls=styles[e], lw=0.5, alpha=0.6)
        if len(sub):
            longest = sub[sub["depth"] == sub["depth"].max()].drop_duplicates("k")
            ax.plot(longest["k"], longest["theory"], **style.THEORY,
                    label=r"uncorrelated $(\Sigma_l r_l^2)^{1/2}$")
            ax.plot(longest["k"], longest["coherent"], color="0.45", ls=":", lw=0.9,
                    label=r"coherent $\Sigma_l r_l$")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(r"$k$ (blocks summed)")
        ax.set_ylabel(style.name("accumulated_branch"))
        ax.set_title(f"{style.value_label(PLACEMENT, pl)}, {style.value_label('alpha', a0)}")
        ax.legend()
        fin = final[final[PLACEMENT] == pl]
        for (a, e), s in fin.groupby(["alpha", "expansion"]):
            s = s.sort_values("depth")
            bx.plot(s["depth"], s["accumulated"], "o", color=acolors[a], ls=styles[e], ms=2.5,
                    lw=0.8)
            bx.plot(s["depth"], s["theory"], color=acolors[a], ls="--", lw=0.6)
        bx.set_xscale("log")
        bx.set_yscale("log")
        bx.set_xticks(depths, [str(d) for d in depths])
        bx.minorticks_off()
        bx.set_xlabel(style.name("depth"))
        bx.set_ylabel(style.name("accumulated_branch_final"))
        bx.set_title(f"{style.value_label(PLACEMENT, pl)}: at $k = L$")
        if i == 0:
            for e in expansions:
                bx.plot([], [], color="0.3", ls=styles[e], label=style.value_label("expansion", e))
            bx.legend()
    style.colorbar(fig, dsm, axes[:, 0].tolist(), "depth", location="left")
    style.colorbar(fig, asm, axes[:, 1].tolist(), "alpha")
    fig.suptitle("Figure 5b/12: accumulated branch")
    style.caption(fig, df, args.experiment, [
        r"thin: uncorrelated from the measured $r_\ell$; dashed: its closed form (Eq. 22)"])
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


ACCUMULATED_COMMAND = Command(_accumulated_arguments, _accumulated_main,
                              "Figure 5b/12: accumulated branch vs depth, with the uncorrelated prediction")

COMMANDS = {"profiles": PROFILES_COMMAND, "stream": STREAM_COMMAND, "accumulated": ACCUMULATED_COMMAND}
