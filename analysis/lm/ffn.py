"""Figure 12: the FFN branch of GPT-2 along its residual stream (``python -m analysis ffn``).

One row per network (random init or pretrained × GPT-2 Small / Medium / a reduced shape; the
newest run of each), four panels, blocks from the probe's ``first_block`` (2: block 1 omitted
as the study does):

* (a) the pairwise cosines ``⟨J_i, J_j⟩/‖J_i‖‖J_j‖`` (mean over seeds, diagonal blanked), with
  the off-diagonal mean beside the ``1/d`` baseline;
* (b) the accumulated ``‖Σ_{l≤k} J_l‖_F/√d`` vs k against the uncorrelated
  ``(Σ‖J_l‖²)^{1/2}/√d`` and the fully coherent ``Σ‖J_l‖/√d``;
* (c) the stream ``rms(h_l)`` and (d) the branch-to-skip ratio ``r_l = ‖J_l‖_F/√d`` vs l.

Also a table (``ffn_summary.md`` and the figure's CSV): per network the off-diagonal cosine
statistics, accumulated / uncorrelated and coherent / uncorrelated at k = L, beside the study's
values (science.md §4 fig12) where it states them.
"""

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
from ..core.runner import Command, add_where, out_dir, set_experiment_default
from ..core.select import SelectionError, load, series
from ..core.style import save
from ..core.tables import to_markdown, write_text

#: the study's numbers (science.md §4 fig12): (trained?, width) → off-diagonal mean cos,
#: accumulated / uncorrelated and coherent / uncorrelated at k = L
STUDY = {
    (False, 768): {"cos": "≈ 1/d", "accumulated": 1.00, "coherent": math.nan},
    (False, 1024): {"cos": "≈ 1/d", "accumulated": 1.00, "coherent": math.nan},
    (True, 768): {"cos": "0.18", "accumulated": 1.78, "coherent": 3.26},
    (True, 1024): {"cos": "0.15", "accumulated": 2.23, "coherent": 4.59},
}
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
        rows.append({
            "network": network_label(r).replace("$", ""),
            "d": int(r["width"]), "L": int(r["depth"]), "seeds": int(r["seeds"]),
            "cos offdiag mean": r["ffn_cos_offdiag_mean"],
            "abs cos offdiag mean": r["ffn_cos_offdiag_abs_mean"],
            "cos offdiag rms · d": r["ffn_cos_offdiag_rms"] * r["width"],
            "1/d": 1.0 / r["width"],
            "study cos": study.get("cos", "—"),
            "accumulated/uncorrelated": r["ffn_accumulated_ratio"],
            "study acc.": study.get("accumulated", math.nan),
            "coherent/uncorrelated": r["ffn_coherent_ratio"],
            "study coh.": study.get("coherent", math.nan),
        })
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
    l_rms, v_rms = series(uri, r["run_id"], "rms")
    keep = l_rms >= first
    cx.plot(l_rms[keep], v_rms[keep], "o-", ms=2.5)
    cx.set_xlabel(r"block $l$")
    cx.set_ylabel(r"$\mathrm{rms}(h_l)$")
    cx.set_title("(c) stream")
    l_r, v_r = series(uri, r["run_id"], "ffn_ratio")
    keep = l_r >= first
    dx.plot(l_r[keep], v_r[keep], "o-", ms=2.5)
    dx.set_xlabel(r"block $l$")
    dx.set_ylabel(r"$r_l = \|J_l\|_F/\sqrt{d}$")
    dx.set_title("(d) branch-to-skip ratio")
    for a in axes:
        a.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))


def _arguments(p: argparse.ArgumentParser) -> None:
    set_experiment_default(p, ["fig12"], "MLflow experiment(s) (default: fig12)")
    add_where(p)


def _main(args: argparse.Namespace) -> list[Path]:
    df = load(args, METRICS)
    nets = networks(df)
    fig, axes = style.grid(len(nets), 4, aspect=0.85)
    for i, (_, r) in enumerate(nets.iterrows()):
        _draw_row(axes[i], r, args.uri)
    fig.suptitle("Figure 12: FFN-branch Jacobians $J_l = \\partial\\,\\mathrm{mlp}(\\mathrm{ln}_2(x))/\\partial x$ "
                 "along the residual stream")
    # GPT-2's FFN is W_proj GELU(W_fc ·), m/d = 4: the residual-MLP knobs logged beside it do not apply
    shown = nets.drop(columns=["activation", "expansion", "matrices"], errors="ignore")
    style.caption(fig, shown, args.experiment, ["σ: GELU (GPT-2 FFN, m/d = 4)",
        f"blocks from {int(series(args.uri, nets['run_id'].iloc[0], 'ffn_accumulated')[0][0])} "
        "(block 1 omitted)", "last token of a fixed prompt", "mean over seeds"])
    table = summary(nets)
    text = to_markdown(table, floatfmt=".4g")
    print("Figure 12 (study: science.md §4 fig12)\n")
    print(text)
    write_text(out_dir(args) / "ffn_summary.md", text + "\n")
    return save(fig, out_dir(args), "fig12_ffn_jacobians", table)


FFN_COMMAND = Command(_arguments, _main,
                      "Figure 12: GPT-2 FFN-branch Jacobians — pairwise cosines vs 1/d, accumulated vs uncorrelated/coherent, rms(h_l), r_l")

COMMANDS = {"ffn": FFN_COMMAND}
