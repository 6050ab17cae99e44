"""Figure 14: the pairwise cosine field of the branch means: the command ``cos_field``, the claims
and the registry entry."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
import pandas as pd

from ..core import style
from ..core.claims import Claim, Measured, NotRun, Runs, near, seed_std
from ..core.registry import Experiment
from ..core.runner import Command, out_dir
from ..core.select import SelectionError, load, need, only, pooled
from ..core.style import save, write_markdown
from ..meanfield import arrays

log = logging.getLogger("analysis")

KEYS = ["matrices", "activation"]

MATRIX = "branch_mean_cos_matrix"

PROBE_N = "task.options.representation.n"


def seed_matrices(uri: str | None, run_id: str) -> np.ndarray:
    """The run's per-seed ``cos(m_l, m_l′)``, ``(E, L, L)``, from its ``arrays.npz``."""
    got = arrays(uri, run_id)
    if MATRIX not in got:
        raise SelectionError(
            f"run {run_id} has no {MATRIX} in arrays.npz (probe representation, L ≥ 2)")
    return got[MATRIX]


def by_separation(c: np.ndarray) -> np.ndarray:
    """Mean of ``c[l, l′]`` over pairs at each separation ``|l − l′| = 1 … L−1``."""
    L = c.shape[-1]
    return np.array([np.diagonal(c, offset=k, axis1=-2, axis2=-1).mean() for k in range(1, L)])


def off_diagonal(c: np.ndarray) -> float:
    L = c.shape[-1]
    return float((c.sum() - np.trace(c)) / (L * (L - 1)))


def config_title(matrices: int, activation: str) -> str:
    return f"$M = {int(matrices)}$, {style.ACTIVATION_NAMES.get(activation, activation)}"


def draw_fields(fields: dict, every: int):
    """One heatmap per configuration: the seed-mean matrix at layers every, 2·every, …"""
    fig, axes = style.panels(len(fields), max_cols=3, aspect=1.0)
    im = None
    for ax, (key, c) in zip(axes, fields.items(), strict=True):
        L = c.shape[-1]
        idx = np.arange(every - 1, L, every) if L >= 2 * every else np.arange(L)
        im = ax.imshow(c[np.ix_(idx, idx)], cmap="RdBu_r", vmin=-1, vmax=1, origin="lower",
                       extent=(idx[0] + 0.5, idx[-1] + 1.5, idx[0] + 0.5, idx[-1] + 1.5))
        ax.set(title=f"{config_title(*key)}: mean {off_diagonal(c):.3f}",
               xlabel=style.name("layer"), ylabel=r"layer $\ell'$")
        ax.grid(False)
    fig.colorbar(im, ax=axes, shrink=0.8, label=r"$\cos(m_\ell, m_{\ell'})$")
    return fig


def draw_separation(fields: dict, coherence: dict):
    """Off-diagonal mean against |l − l′|, one line per configuration, c of Table 1 dashed."""
    fig, (ax,) = style.panels(1, aspect=0.8)
    colors, _ = style.value_colors(range(len(fields)), "tab10", stop=0.3)
    for k, (key, c) in enumerate(fields.items()):
        s = by_separation(c)
        ax.plot(np.arange(1, len(s) + 1), s, color=colors[k], label=config_title(*key))
        if np.isfinite(coherence.get(key, np.nan)):
            ax.axhline(coherence[key], **{**style.THEORY, "color": colors[k]})
    ax.plot([], [], **style.THEORY, label=r"$c = E[\sigma]^2/E[\sigma^2]$ (Table 1)")
    ax.set(xscale="log", xlabel=r"layer separation $|\ell - \ell'|$",
           ylabel=r"mean $\cos(m_\ell, m_{\ell'})$")
    ax.legend()
    return fig


def probe_inputs(df: pd.DataFrame) -> list[str]:
    """The caption's ``n = …/… probe inputs`` of the representation probe (none if not logged)."""
    n = sorted({int(v) for v in df.get(PROBE_N, pd.Series(dtype=float)).dropna()})
    return [f"n = {'/'.join(map(str, n))} probe inputs"] if n else []


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--every", type=int, default=8, help="draw every k-th layer (default 8, the study's)")


def _main(args: argparse.Namespace) -> list[Path]:
    df = load(args, [*KEYS, "branch_mean_cos_cross"])
    fields, coherence, rows = {}, {}, []
    for key, g in df.groupby(KEYS, sort=True):
        mats = [seed_matrices(args.uri, rid) for rid in g["run_id"]]
        if len({m.shape[-1] for m in mats}) > 1:
            log.warning("%s: runs of different depth; using L = %d", key, mats[0].shape[-1])
            mats = [m for m in mats if m.shape[-1] == mats[0].shape[-1]]
        fields[key] = np.concatenate(mats).mean(0)
        c = float(g["coherence_theory"].mean()) if "coherence_theory" in g else np.nan
        # M = 1 adds the same mean direction every layer (cos = c); M = 2 rotates it by W_down
        coherence[key] = c if int(key[0]) == 1 else 0.0
        cross = pooled(g, "branch_mean_cos_cross", []).iloc[0]
        rows.append({"matrices": int(key[0]), "activation": key[1], "cos_mean_offdiag": cross["mean"],
                     "cos_mean_offdiag_std": cross["std"], "seeds": int(cross["seeds"]),
                     "predicted": coherence[key],
                     "cos_input_cross": float(g["branch_input_cos_cross"].mean())
                     if "branch_input_cos_cross" in g else np.nan})
    # the study's panel order: (a) M = 1 with a coherent σ, (b) M = 2, (c) a centred σ
    order = sorted(fields, key=lambda k: (0 if int(k[0]) == 1 and coherence[k] > 1e-3
                                          else 1 if int(k[0]) == 2 else 2, k))
    fields = {k: fields[k] for k in order}
    table = pd.DataFrame(rows).set_index(KEYS).reindex(order)
    out = out_dir(args)
    fig = draw_fields(fields, args.every)
    fig.suptitle(r"Pairwise $\cos(m_\ell, m_{\ell'})$ of the branch means")
    extra = probe_inputs(df)
    style.caption(fig, df, args.experiment, [*extra, f"every {args.every}th layer", "mean over seeds"])
    paths = save(fig, out, "cos_field", table)
    fig = draw_separation(fields, coherence)
    fig.suptitle(r"$\cos(m_\ell, m_{\ell'})$ does not decay with layer separation")
    style.caption(fig, df, args.experiment, [*extra, "mean over seeds"])
    paths += save(fig, out, "cos_field_separation")
    head = f"Figure 14: off-diagonal mean of cos(m_l, m_l′) ({', '.join(args.experiment)})"
    paths.append(write_markdown(out / "cos_field.md", head, table, ".3f", runs=df))
    return paths


def _fig14(matrices: int, centred: bool):
    def measure(runs: Runs) -> Measured:
        df = only(runs("fig14"), matrices=matrices)
        need(df, "branch_mean_cos_cross", "activation")
        df = df[df["activation"].isin(("tanh",) if centred else ("relu",))]
        if df.empty:
            raise NotRun(f"no fig14 run with M = {matrices}, σ = {'tanh' if centred else 'relu'}")
        return Measured(float(df["branch_mean_cos_cross"].mean()), seed_std(df, "branch_mean_cos_cross"),
                        "off-diagonal mean of cos(m_l, m_l′)")

    return measure


FIG14 = (
    Claim("fig14.a_uniform_c", "M = 1 ReLU: the branch means form a uniform field at "
          "c = 1/π", "the study, fig14(a)", "0.320 (d = 256, n = 4096)", near(0.320, 0.03),
          _fig14(1, False)),
    Claim("fig14.b_m2_zero", "M = 2: the branch means are uncorrelated across layers",
          "the study, fig14(b)", "0.002", near(0.002, 0.01), _fig14(2, False)),
    Claim("fig14.c_centred_zero", "A centred activation (tanh, M = 1): no mean field",
          "the study, fig14(c)", "−0.000", near(0.0, 0.01), _fig14(1, True)))

COMMANDS = {"cos_field": Command(
    _main, "Figure 14: pairwise cos(m_l, m_l') of the branch means, every 8th layer, per M and σ",
    experiment="fig14", where=True, arguments=_arguments)}

EXPERIMENTS = (
    Experiment("fig14", "Figure 14: the pairwise cosine field of the branch means",
               "the study, fig14", analyses=("cos_field --experiment fig14",), claims=FIG14),)
