"""Figure 12: GPT-2's FFN branch along the residual stream: the command ``ffn``, the claims and the
registry entry."""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from rankexp.tracking import download_artifact

from ..core import style
from ..core.claims import Claim, Measured, NotRun, Runs, at_most, near, seed_std
from ..core.registry import Experiment, Needs
from ..core.runner import Command, out_dir
from ..core.select import SelectionError, load, need, series
from ..core.style import save, write_markdown

#: the study's numbers (the study, fig12): (trained?, width) → off-diagonal mean cos,
#: accumulated / uncorrelated and coherent / uncorrelated at k = L
STUDY = {(False, 768): {"cos": "≈ 1/d", "accumulated": 1.00, "coherent": math.nan},
         (False, 1024): {"cos": "≈ 1/d", "accumulated": 1.00, "coherent": math.nan},
         (True, 768): {"cos": "0.18", "accumulated": 1.78, "coherent": 3.26},
         (True, 1024): {"cos": "0.15", "accumulated": 2.23, "coherent": 4.59}}

METRICS = ["ffn_accumulated_ratio", "ffn_coherent_ratio", "ffn_cos_offdiag_mean",
           "ffn_cos_offdiag_abs_mean", "ffn_cos_offdiag_rms", "width", "depth", "seeds",
           "model.config"]


def with_pretrained(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with a ``model.pretrained`` column: runs log no param for an unset value, so a
    store of random-init runs only has none."""
    return df if "model.pretrained" in df else df.assign(**{"model.pretrained": None})


def trained(df: pd.DataFrame) -> pd.Series:
    """Whether each run loaded pretrained weights (``model.pretrained`` set)."""
    p = with_pretrained(df)["model.pretrained"]
    return ~(p.isna() | p.astype(str).isin(["None", "", "nan", "null", "<NA>"]))


def network_label(row: pd.Series) -> str:
    """``init, GPT-2 Small`` / ``trained gpt2-medium`` / ``init, d = 64, L = 4``."""
    names = {(768, 12): "GPT-2 Small", (1024, 24): "GPT-2 Medium", (1280, 36): "GPT-2 Large",
             (1600, 48): "GPT-2 XL"}
    shape = names.get((int(row["width"]), int(row["depth"])),
                      f"$d = {int(row['width'])}$, $L = {int(row['depth'])}$")
    if row["trained"]:
        return f"trained {Path(str(row['model.pretrained'])).name}"
    return f"init, {shape}"


def networks(df: pd.DataFrame) -> pd.DataFrame:
    """The newest run per network (pretrained source or random config, width, depth), ordered
    random before pretrained, small before large."""
    df = with_pretrained(df).assign(trained=trained(df))
    if "end_time" in df:
        df = df.sort_values("end_time", ascending=False)
    keys = ["trained", "model.pretrained", "model.config", "width", "depth"]
    df = df.drop_duplicates(keys).sort_values(["trained", "width", "depth"])
    return df.reset_index(drop=True)


def mean_cosines(uri: str | None, run_id: str) -> np.ndarray:
    """The seed-mean cosine matrix ``(L, L)`` from the run's ``arrays.npz`` (``ffn_cosines``)."""
    with tempfile.TemporaryDirectory() as tmp:
        with np.load(download_artifact(uri, run_id, "arrays.npz", tmp)) as z:
            if "ffn_cosines" not in z.files:
                raise SelectionError(f"run {run_id} logged no ffn_cosines array (tracking.log_arrays=false?)")
            return z["ffn_cosines"].mean(0)


def summary(nets: pd.DataFrame) -> pd.DataFrame:
    """One row per network: its statistics beside the study's (:data:`STUDY`)."""
    rows = []
    for _, r in nets.iterrows():
        study = STUDY.get((bool(r["trained"]), int(r["width"])), {})
        rows.append({"network": network_label(r).replace("$", ""), "d": int(r["width"]),
                     "L": int(r["depth"]), "seeds": int(r["seeds"]),
                     "cos offdiag mean": r["ffn_cos_offdiag_mean"],
                     "abs cos offdiag mean": r["ffn_cos_offdiag_abs_mean"],
                     "cos offdiag rms · d": r["ffn_cos_offdiag_rms"] * r["width"],
                     "1/d": 1.0 / r["width"], "study cos": study.get("cos", "—"),
                     "accumulated/uncorrelated": r["ffn_accumulated_ratio"],
                     "study acc.": study.get("accumulated", math.nan),
                     "coherent/uncorrelated": r["ffn_coherent_ratio"],
                     "study coh.": study.get("coherent", math.nan)})
    return pd.DataFrame(rows).set_index("network")


def _draw_row(axes, r: pd.Series, uri: str | None) -> None:
    ax, bx, cx, dx = axes
    d = int(r["width"])
    k, acc = series(uri, r["run_id"], "ffn_accumulated")
    first = int(k[0])
    cos = mean_cosines(uri, r["run_id"])[first - 1:, first - 1:].copy()
    np.fill_diagonal(cos, np.nan)
    lim = max(float(np.nanmax(np.abs(cos))) if cos.size > 1 else 0.0, 3.0 / d)
    im = ax.imshow(cos, cmap="RdBu_r", vmin=-lim, vmax=lim, origin="upper",
                   extent=(first - 0.5, k[-1] + 0.5, k[-1] + 0.5, first - 0.5))
    ax.grid(False)
    ax.set_ylabel(f"{network_label(r)}\n" r"block $i$")
    ax.set_title(r"(a) $\cos(J_i, J_j)$")
    cb = ax.figure.colorbar(im, ax=ax, shrink=0.85, pad=0.02)
    cb.ax.tick_params(labelsize=6)
    cb.set_label(r"$\cos(J_i, J_j)$", fontsize=6.5)
    ax.set_xlabel(rf"block $j$" "\n" rf"mean {r['ffn_cos_offdiag_mean']:.1e}; $1/d$ = {1 / d:.1e}")
    _, unc = series(uri, r["run_id"], "ffn_uncorrelated")
    _, coh = series(uri, r["run_id"], "ffn_coherent")
    bx.plot(k, acc, "o-", ms=2.5, label=r"$\|\Sigma_{l\leq k} J_l\|_F$")
    bx.plot(k, unc, **style.THEORY, label=r"uncorr. $(\Sigma_l \|J_l\|_F^2)^{1/2}$")
    bx.plot(k, coh, color="0.45", ls=":", lw=0.9, label=r"coherent $\Sigma_l \|J_l\|_F$")
    bx.set_xlabel(r"$k$ (blocks summed)" "\n" f"at $L$: {r['ffn_accumulated_ratio']:.2f}× uncorr., "
                  f"coh. {r['ffn_coherent_ratio']:.2f}×")
    bx.set_ylim(0, 2.4 * float(np.max(coh)))  # room for the legend above the curves
    bx.set_title(r"(b) accumulated branch $/\sqrt{d}$")
    bx.legend(loc="upper left", fontsize=5.5, handlelength=1.2)
    for ax, key, ylabel, title in (
            (cx, "rms", r"$\mathrm{rms}(h_l)$", "(c) stream"),
            (dx, "ffn_ratio", r"$r_l = \|J_l\|_F/\sqrt{d}$", "(d) branch-to-skip ratio")):
        layers, values = series(uri, r["run_id"], key)
        keep = layers >= first
        ax.plot(layers[keep], values[keep], "o-", ms=2.5)
        ax.set_xlabel(r"block $l$")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
    for a in axes:
        a.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))


def _main(args: argparse.Namespace) -> list[Path]:
    df = load(args, METRICS)
    nets = networks(df)
    fig, axes = style.grid(len(nets), 4, aspect=0.85)
    for i, (_, r) in enumerate(nets.iterrows()):
        _draw_row(axes[i], r, args.uri)
    fig.suptitle("FFN-branch Jacobians $J_l = \\partial\\,\\mathrm{mlp}(\\mathrm{ln}_2(x))/\\partial x$ "
                 "along the residual stream")
    # GPT-2's FFN is W_proj GELU(W_fc ·), m/d = 4: the residual-MLP knobs logged beside it do not apply
    shown = nets.drop(columns=["activation", "expansion", "matrices"], errors="ignore")
    style.caption(fig, shown, args.experiment, ["σ: GELU (GPT-2 FFN, m/d = 4)",
        f"blocks from {int(series(args.uri, nets['run_id'].iloc[0], 'ffn_accumulated')[0][0])} "
        "(block 1 omitted)", "last token of a fixed prompt", "mean over seeds"])
    table = summary(nets)
    write_markdown(out_dir(args) / "ffn_summary.md", "Figure 12 (study: the study, fig12)", table,
                   runs=nets)
    return save(fig, out_dir(args), "fig12_ffn_jacobians", table)


#: what the trained half needs: checkpoints no grid of this checkout makes (offline)
PRETRAINED = ("pretrained GPT-2 checkpoints: python -m rankexp experiment=fig12 "
              "model.pretrained=gpt2,gpt2-medium seeds=1 -m (a hub or local copies)")


def _runs(runs: Runs, pretrained: bool, width: int | None = None) -> pd.DataFrame:
    df = with_pretrained(runs("fig12"))
    need(df, "ffn_accumulated_ratio", "ffn_cos_offdiag_rms", "width")
    df = df[trained(df) == pretrained]
    if width is not None:
        df = df[df["width"] == width]
    if df.empty:
        what = "pretrained" if pretrained else "random-init"
        raise NotRun(f"no {what} fig12 run" + (f" with d = {width}" if width else ""))
    return df


def _cos_init(runs: Runs) -> Measured:
    df = _runs(runs, False)
    worst = df.loc[(df["ffn_cos_offdiag_rms"] * df["width"]).idxmax()]
    return Measured(float(worst["ffn_cos_offdiag_rms"] * worst["width"]), math.nan,
                    f"largest over {len(df)} random-init run(s) of rms(off-diagonal cos) × d "
                    f"(d = {int(worst['width'])})")


def _accumulated_init(runs: Runs) -> Measured:
    df = _runs(runs, False)
    return Measured(float(df["ffn_accumulated_ratio"].mean()),
                    seed_std(df, "ffn_accumulated_ratio"),
                    f"‖Σ J_l‖_F / (Σ‖J_l‖²)^½ at k = L, mean over {len(df)} random-init run(s)")


def _trained(metric: str, width: int):
    def measure(runs: Runs) -> Measured:
        df = _runs(runs, True, width)
        return Measured(float(df[metric].mean()), math.nan,
                        f"pretrained {', '.join(sorted(df['model.pretrained'].astype(str).unique()))}")
    return measure


FIG12 = (
    Claim("fig12.cos_init", "At initialization the pairwise cosines of the FFN Jacobians are ≈ 1/d",
          "the study, fig12a", "≈ 1/d (rms × d ≈ 1)", at_most(3.0), _cos_init),
    Claim("fig12.accumulated_init", "At initialization accumulated / uncorrelated = 1.00 at k = L",
          "the study, fig12b", "1.00×", near(1.0, 0.05), _accumulated_init))

FIG12_TRAINED = tuple(
    claim
    for width, name, cos, acc, coherent in ((768, "small", 0.18, 1.78, 3.26),  # GPT-2 Small, Medium
                                            (1024, "medium", 0.15, 2.23, 4.59))
    for claim in (
        Claim(f"fig12.cos_trained_{name}",
              f"Trained GPT-2 {name.title()}: off-diagonal mean cosine of the FFN Jacobians",
              "the study, fig12a", f"{cos:g}", near(cos, 0.05),
              _trained("ffn_cos_offdiag_mean", width), needs=PRETRAINED),
        Claim(f"fig12.accumulated_trained_{name}",
              f"Trained GPT-2 {name.title()}: accumulated / uncorrelated at k = L "
              f"(fully coherent: {coherent:g}×)",
              "the study, fig12b", f"{acc:g}×", near(acc, 0.25),
              _trained("ffn_accumulated_ratio", width), needs=PRETRAINED)))

COMMANDS = {
    "ffn": Command(_main, "Figure 12: GPT-2 FFN-branch Jacobians — pairwise cosines vs 1/d, "
                          "accumulated vs uncorrelated/coherent, rms(h_l), r_l", "fig12", True)}

EXPERIMENTS = (Experiment("fig12", "Figure 12: GPT-2's FFN branch along the residual stream",
                          "the study, fig12", analyses=("ffn --experiment fig12",),
                          claims=FIG12 + FIG12_TRAINED, needs=Needs(packages=("transformers",))),)
