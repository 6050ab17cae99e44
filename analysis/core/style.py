"""One figure style for every command: page-sized panel grids (:func:`grid`, :func:`panels`;
:data:`ONE_COLUMN`, :data:`TWO_COLUMN`, :data:`PAGE_HEIGHT` inches), the study's symbols in
mathtext (:func:`name`, :func:`value_label`), a caption stating the runs' size
(:func:`caption`, ``gid="caption"``), colour bars for numeric params (:func:`value_colors`,
:func:`colorbar`), theory in one look (:data:`THEORY`: black dashed), :func:`save` (PNG + PDF
+ CSV) and the tables the commands write (:func:`to_markdown`, :func:`write_markdown`)."""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import matplotlib as mpl

mpl.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.colors import BoundaryNorm, ListedColormap  # noqa: E402

from rankexp.knobs import KNOBS  # noqa: E402

from .runs import attach_to_parents  # noqa: E402

ONE_COLUMN = 3.4  # inches: one column of a two-column paper
TWO_COLUMN = 7.0  # inches: the full text width
PAGE_HEIGHT = 8.5  # inches: the tallest figure a page takes with its caption

RC = {
    "font.family": "serif", "font.serif": ["DejaVu Serif"], "mathtext.fontset": "dejavuserif",
    "font.size": 8, "axes.titlesize": 8, "axes.labelsize": 8, "xtick.labelsize": 7,
    "ytick.labelsize": 7, "figure.titlesize": 9,
    "legend.fontsize": 6.5, "legend.title_fontsize": 6.5, "legend.frameon": False,
    "legend.handlelength": 1.6,
    "axes.grid": True, "grid.alpha": 0.3, "grid.linewidth": 0.5, "axes.linewidth": 0.6,
    "axes.spines.top": False, "axes.spines.right": False,
    "lines.linewidth": 1.1, "lines.markersize": 3.5, "errorbar.capsize": 1.5, "image.cmap": "viridis",
    "savefig.dpi": 200, "savefig.bbox": "tight", "savefig.pad_inches": 0.04,
    "pdf.fonttype": 42,  # TrueType: text stays text in the PDF
    "ps.fonttype": 42}

#: keyword arguments of every closed-form / theory curve
THEORY = {"color": "k", "ls": "--", "lw": 0.9}
#: line styles for the values of a param (m/d, d, …): dashed is the theory's (:data:`THEORY`)
#: and dotted the references' (chance, coherent sums), so a figure's styles keep one meaning
#: each (tests/figure_checks.py: one meaning per line style)
VALUE_STYLES = ("-", "-.", (0, (6, 2)), (0, (3, 1, 1, 1, 1, 1)))
CAPTION_FONTSIZE = 6.5


log = logging.getLogger("analysis")
logging.getLogger("fontTools").setLevel(logging.WARNING)  # PDF font subsetting chatter
mpl.rcParams.update(RC)

# --------------------------------------------------------------------------- names
#: metric keys and config params → their name in the study (mathtext)
SYMBOLS: dict[str, str] = {
    # input–output Jacobian and its per-layer profile (Eq. 2/3/10)
    "erank_io": r"$\mathrm{erank}(\partial h_L/\partial h_0)/d$",
    "erank_profile": r"$\mathrm{erank}(\partial h_\ell/\partial h_0)/d$",
    "erank_min": r"$\min_\ell\,\mathrm{erank}(\partial h_\ell/\partial h_0)/d$",
    "stable_rank_io": r"$\mathrm{srank}(\partial h_L/\partial h_0)$",
    "stable_rank_profile": r"$\mathrm{srank}(\partial h_\ell/\partial h_0)$",
    "log_gain_io": r"$\log\|\partial h_L/\partial h_0\|$",
    "log_gain_profile": r"$\log\|\partial h_\ell/\partial h_0\|$",
    # stream and branch ratio (Eq. 4/21/22)
    "rms": r"$\mathrm{rms}(h_\ell)$",
    "rms_final": r"$\mathrm{rms}(h_L)$",
    "stream_kappa": r"fitted $\kappa$",
    "branch_ratio": r"$r_\ell = \|\beta J_\ell\|_F/\|I\|_F$",
    "branch_ratio_last": r"$r_L = \|\beta J_L\|_F/\|I\|_F$",
    "nominal_ratio": r"$\beta\alpha^M$",
    "depth_factor": r"$\beta\alpha^M\sqrt{L}$",
    "accumulated_branch": r"$\|\Sigma_{l\leq k}\beta J_l\|_F/\|I\|_F$",
    "accumulated_branch_final": r"$\|\Sigma_{l\leq L}\beta J_l\|_F/\|I\|_F$",
    # path orders (Eq. 5/11)
    "path_profile": r"$\mu_k/\Sigma_j \mu_j$",
    "mean_path_order": r"$\langle k\rangle_{\mu}$",
    "mean_path_order_energy": r"$\langle k\rangle_{\mu^2}$",
    "path_order_peak": r"$\arg\max_k \mu_k$",
    # representation (Figure 7, Table 6)
    "rep_erank": r"$\mathrm{erank}(Z_\ell)/d$",
    "rep_erank_final": r"$\mathrm{erank}(Z_L)/d$",
    "branch_mean_sum_norm": r"$\|\Sigma_{k\leq\ell} m_k\|$",
    "branch_input_cos_cross": r"$\cos(b_\ell(x), b_k(x))$",
    "branch_mean_cos_cross": r"$\cos(m_\ell, m_k)$",
    # branch Jacobian (Eq. 9/25, Figures 8/9)
    "erank_branch": r"$\mathrm{erank}(J_f)/d$",
    "masked_rank": r"$\mathrm{rank}(D W_\mathrm{up})/d$",
    "mp_gamma": r"$\gamma = p\,m/d$",
    "hidden_stable_rank": r"$\mathrm{srank}(\sigma(W h))$",
    # projection split (Figure 4c)
    "erank_post": r"$\mathrm{erank}/d$, Post-Norm",
    "erank_post_noproj": r"$\mathrm{erank}/d$, no projection",
    "rank_removed_by_projection": r"$\Delta\mathrm{erank}/d$ by projection",
    # zero-cost proxies at init (rankexp/probes/proxies.py)
    "grad_norm_proxy": r"$\Sigma_l\,\|\partial\ell/\partial W_l\|_F$",
    "jacob_cov": "Jacobian covariance score",
    "log_synflow": r"$\log\,\Sigma|\theta\odot\partial R/\partial\theta|$ (synflow)",
    # training
    "best_test_accuracy": "best test accuracy",
    "max_stable_lr": "max stable learning rate",
    "test_acc": "test accuracy",
    "train_loss": "train loss (nats)",
    # config params: the knobs' TeX labels (rankexp.knobs.KNOBS), and two derived ones
    **{k.key: k.tex for k in KNOBS if k.tex is not None},
    "beta_eff": r"$\beta_\mathrm{eff}$",
    "layer": r"layer $\ell$"}

PLACEMENT_NAMES = {"pre": "Pre-Norm", "post": "Post-Norm", "output": "output norm",
                   "peri": "Peri-Norm", "none": "no norm"}
OP_NAMES = {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm", "detached": "detached",
            "meansub": "mean-sub."}
ACTIVATION_NAMES = {"relu": "ReLU", "gelu": "GELU", "silu": "SiLU", "tanh": "tanh",
                    "abs": r"$|\cdot|$", "linear": "linear", "leaky_relu": "leaky ReLU",
                    "swiglu": "SwiGLU"}
BETA_SCALING_NAMES = {"const": r"$\beta$ const", "inv_sqrt_depth": r"$\beta \propto 1/\sqrt{L}$",
                      "inv_depth": r"$\beta \propto 1/L$"}


def name(key: str) -> str:
    """The field's name of a metric key or config param (:data:`SYMBOLS`); an unknown key
    comes back readable, underscores as spaces."""
    return SYMBOLS.get(key, str(key).replace("_", " "))


def number(v) -> str:
    """``v`` as short text: ints without a point, floats to 3 significant digits."""
    if isinstance(v, (bool, np.bool_)):
        return str(v)
    if isinstance(v, (int, np.integer)) or (isinstance(v, float) and float(v).is_integer()):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.3g}"
    return str(v)


def value_label(key: str, value) -> str:
    """A legend entry for ``key = value``: ``$m/d = 4$``, ``Post-Norm``, ``no skip``,
    ``$\\beta \\propto 1/\\sqrt{L}$``, ``ReLU``."""
    names = {"norm.placement": PLACEMENT_NAMES, "norm.op": OP_NAMES,
             "activation": ACTIVATION_NAMES, "beta_scaling": BETA_SCALING_NAMES}.get(key)
    if names is not None:
        return names.get(value, str(value))
    if key == "skip_every":
        v = int(value)
        return {0: "no skip", 1: "skip every block"}.get(v, f"skip every {v}")
    sym = SYMBOLS.get(key)
    if sym and sym.startswith("$") and sym.endswith("$"):
        return f"{sym[:-1]} = {number(value)}$"
    return f"{name(key)} = {number(value)}"


def config_label(placement: str, op: str) -> str:
    """``Post-Norm / RMSNorm``; ``no norm`` (its op is unused)."""
    if placement == "none":
        return PLACEMENT_NAMES["none"]
    return f"{PLACEMENT_NAMES.get(placement, placement)}\n{OP_NAMES.get(op, op)}"


def spread_note(mean: pd.Series, std: pd.Series | None, what: str = "") -> str:
    """The caption's seed spread where log axes cannot draw error bars: the largest seed s.d.
    relative to its mean."""
    rel = pd.Series(dtype=float) if std is None else (std / mean.abs()).replace(
        [np.inf, -np.inf], np.nan).dropna()
    return (f"{what}seed s.d. ≤ {100 * rel.max():.2g} % of each point (1 s.d. over seeds)"
            if len(rel) else f"{what}one seed per point: no spread")


# --------------------------------------------------------------------------- grids
def grid(nrows: int, ncols: int, *, width: float = TWO_COLUMN, aspect: float = 0.72, **subplot_kw):
    """``(fig, axes)`` of ``nrows × ncols`` panels (``axes`` 2-D) that fits a page: ``width``
    inches wide (at most :data:`TWO_COLUMN`), each panel ``aspect`` as tall as wide, and no
    taller in all than :data:`PAGE_HEIGHT` (panels flatten to fit)."""
    width = min(width, TWO_COLUMN)
    height = min(nrows * width / ncols * aspect + 0.3, PAGE_HEIGHT)
    return plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False, layout="constrained",
                        **subplot_kw)


def panels(n: int, *, max_cols: int = 3, width: float | None = None, aspect: float = 0.75,
           **subplot_kw):
    """``(fig, axes)`` for ``n`` panels of one kind: at most ``max_cols`` to a row (wrapped
    into rows, never a 1 × n strip), one column wide for a single panel, else two; ``axes``
    is a list of ``n`` Axes in reading order (unused grid cells removed)."""
    ncols = max(1, min(n, max_cols))
    nrows = math.ceil(n / ncols)
    if width is None:
        width = ONE_COLUMN if n == 1 else TWO_COLUMN * (0.7 if ncols == 2 else 1.0)
    fig, axes = grid(nrows, ncols, width=width, aspect=aspect, **subplot_kw)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.remove()
    return fig, flat[:n]


# --------------------------------------------------------------------------- colour
def value_colors(values: Iterable, cmap: str = "viridis", stop: float = 0.9):
    """``({value: RGBA}, mappable)`` for the sorted distinct ``values`` of a numeric param: one
    colour band per value, so :func:`colorbar` reads the values, not a fake continuum."""
    vals = sorted(dict.fromkeys(values))
    base = plt.get_cmap(cmap)
    rgba = [base(x) for x in np.linspace(0, stop, len(vals))] if len(vals) > 1 else [base(0.0)]
    sm = mpl.cm.ScalarMappable(norm=BoundaryNorm(np.arange(len(vals) + 1) - 0.5, len(vals)),
                               cmap=ListedColormap(rgba))
    sm.values = vals  # for colorbar's tick labels
    return dict(zip(vals, rgba, strict=True)), sm


def colorbar(fig, mappable, ax, key: str, label: str | None = None, **kw):
    """A colour bar labelled ``label`` or ``key``'s name (one tick per :func:`value_colors` value);
    for one or two values legend entries on ``ax`` (the last panel) instead.  Returns either."""
    vals = getattr(mappable, "values", None)
    if vals is not None and len(vals) <= 2:
        target = np.ravel(ax)[-1]
        handles, labels = target.get_legend_handles_labels()
        for i, v in enumerate(vals):
            handles.append(mpl.lines.Line2D([], [], color=mappable.cmap(i), marker="s", ls="none", ms=6))
            labels.append(value_label(key, v) if label is None else f"{label} = {number(v)}")
        return target.legend(handles, labels, fontsize=7)
    kw = {"shrink": 0.9, "pad": 0.02, **kw}
    cb = fig.colorbar(mappable, ax=ax, label=label or name(key), **kw)
    if vals is not None:
        cb.set_ticks(range(len(vals)), labels=[number(v) for v in vals])
        cb.minorticks_off()
    cb.ax.tick_params(labelsize=6.5)
    return cb


def plain_log_ticks(ax, axis: str = "y") -> None:
    """Log-axis tick labels of ``ax`` as plain numbers (0.05, 0.2, 3, 100) instead of
    ``5×10⁻²``; minor ticks labelled: every one where the axis spans ≤ 3×, the 2s, 3s and 5s
    to ~1 decade, the 2s and 5s up to ~2 decades, none beyond."""
    target = ax.yaxis if axis == "y" else ax.xaxis

    def minor(v, pos=None) -> str:
        lo, hi = target.get_view_interval()
        if v <= 0 or lo <= 0:
            return ""
        mantissa = round(v / 10 ** math.floor(math.log10(v)), 6)
        keep = (range(2, 10) if hi / lo <= 3 else (2.0, 3.0, 5.0) if hi / lo <= 12
                else (2.0, 5.0) if hi / lo <= 150 else ())
        return f"{v:g}" if mantissa in keep else ""

    target.set_major_formatter(lambda v, pos=None: f"{v:g}" if v > 0 else "")
    target.set_minor_formatter(minor)


def finish(fig) -> None:
    """House touches every saved figure gets: plain-number ticks on log axes still using
    matplotlib's default ``10^k`` formatter (explicitly ticked axes keep their labels)."""
    for ax in fig.axes:
        for which, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            if axis.get_scale() == "log" and isinstance(axis.get_major_formatter(),
                                                        mpl.ticker.LogFormatterSciNotation):
                plain_log_ticks(ax, which)


# --------------------------------------------------------------------------- caption
def values(df: pd.DataFrame, key: str) -> list:
    """The distinct values of the column ``key`` (none if absent), numbers first, sorted."""
    if key not in df:
        return []
    return sorted(df[key].dropna().unique().tolist(), key=lambda v: (isinstance(v, str), v))


def caption_parts(df: pd.DataFrame, experiments: Sequence[str] | str, extra: Sequence[str] = ()):
    """The pieces of :func:`caption`'s line, in order; seeds as ``seeds: 4 per run`` (a train
    run is one seed; ``× 3 seed offsets`` for several ``seed`` values), size ``full`` where
    not logged."""
    exps = [experiments] if isinstance(experiments, str) else list(experiments)
    parts = [f"{', '.join(exps)}: {len(df)} run{'s' if len(df) != 1 else ''}"]
    # plain nets have no MLP branch (no m/d, M); M = 1 has no hidden width
    skip = {"expansion", "matrices"} if values(df, "model.name") == ["plain"] else \
        {"expansion"} if values(df, "matrices") == [1] else set()
    for key in ("width", "expansion", "depth", "matrices"):
        vals = values(df, key)
        if not vals or key in skip:
            continue
        if len(vals) == 1:
            shown = f"= {number(vals[0])}"
        elif len(vals) > 5:
            shown = rf"\in \{{{number(vals[0])}, \ldots, {number(vals[-1])}\}}"
        else:
            shown = r"\in \{" + ", ".join(map(number, vals)) + r"\}"
        parts.append(f"{name(key)[:-1]} {shown}$")
    acts = values(df, "activation")
    if acts:
        parts.append("σ: " + ", ".join(ACTIVATION_NAMES.get(a, a) for a in acts))
    train = "task.name" in df and (df["task.name"].astype(str) == "train").all()
    per_run = "1" if train else "/".join(str(int(v)) for v in values(df, "seeds"))
    offsets = len(values(df, "seed"))
    parts.append(f"seeds: {per_run} per run"
                 + (f" × {offsets} seed offsets" if offsets > 1 else ""))
    parts.append("size = " + ("/".join(map(str, values(df, "size"))) or "full"))
    return parts + list(extra)


def caption(fig, df: pd.DataFrame, experiments: Sequence[str] | str, extra: Sequence[str] = ()):
    """The caption under ``fig`` (``gid="caption"``): experiment, runs, d, m/d, L, M, σ, seeds,
    size, then ``extra``; wrapped at ``·`` breaks."""
    parts = caption_parts(df, experiments, extra)
    # the runs drawn: save attaches the files to their sweeps' parent runs
    fig._rankexp_runs = [*getattr(fig, "_rankexp_runs", []), df]
    per_line = max(40, int(fig.get_figwidth() * 72 / (0.48 * CAPTION_FONTSIZE)))
    lines, line = [], ""
    for p in parts:
        cand = f"{line} · {p}" if line else p
        if line and len(cand) > per_line:
            lines.append(line)
            line = p
        else:
            line = cand
    lines.append(line)
    return fig.text(0.5, 0.0, "\n".join(lines), ha="center", va="top", fontsize=CAPTION_FONTSIZE,
                    color="0.25", gid="caption")


def captions(fig) -> list:
    """The caption Texts of ``fig`` (those :func:`caption` wrote)."""
    return [t for t in fig.texts if t.get_gid() == "caption"]


# --------------------------------------------------------------------------- saving
#: while :func:`recording` is active, every figure :func:`save` writes is appended here
_recorders: list[list] = []


@contextlib.contextmanager
def recording() -> Iterator[list]:
    """Collect the Figure objects that :func:`save` writes inside the block (they stay open
    until the block ends, so tests can inspect their axes, labels and caption)."""
    figs: list = []
    _recorders.append(figs)
    try:
        yield figs
    finally:
        _recorders.remove(figs)
        for fig in figs:
            plt.close(fig)


def save(fig, out_dir: Path, stem: str, table=None) -> list[Path]:
    """``fig`` as PNG and PDF (``table`` as CSV) under ``out_dir``, attached to the sweep parent
    runs of the runs its caption counts; a figure without a caption only warns.  Returns paths."""
    if not captions(fig):
        log.warning("figure %s has no caption line (analysis.core.style.caption)", stem)
    finish(fig)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.png", out_dir / f"{stem}.pdf"]
    for p in paths:
        fig.savefig(p)
    if _recorders:
        fig.set_label(stem)
        _recorders[-1].append(fig)
    else:
        plt.close(fig)
    if table is not None:
        paths.append(out_dir / f"{stem}.csv")
        table.to_csv(paths[-1])
    for p in paths:
        log.info("wrote %s", p)
    attach_to_parents(paths, *getattr(fig, "_rankexp_runs", []))
    return paths


# --------------------------------------------------------------------------- tables
def to_markdown(table: pd.DataFrame, floatfmt: str = ".4g") -> str:
    """A GitHub-Markdown table of ``table`` (named index levels first; floats as ``floatfmt``,
    NaN and ±∞ — no value — as ``—``; every other cell as ``str``)."""

    def cell(v) -> str:
        if isinstance(v, (float, np.floating)):
            return format(float(v), floatfmt) if np.isfinite(v) else "—"
        return str(v)

    t = table.reset_index() if any(n is not None for n in table.index.names) else table
    lines = ["| " + " | ".join(map(str, t.columns)) + " |", "|" + "---|" * len(t.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in t.itertuples(index=False)]
    return "\n".join(lines)


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` (folders made), log it, return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    log.info("wrote %s", path)
    return path


def write_markdown(path: Path, title: str, table: pd.DataFrame, floatfmt: str = ".4g",
                   runs: pd.DataFrame | None = None) -> Path:
    """``title`` and :func:`to_markdown` of ``table`` into ``path`` (printed too), attached to the
    sweep parent runs of ``runs`` (:func:`~analysis.core.runs.attach_to_parents`)."""
    text = f"{title}\n\n{to_markdown(table, floatfmt)}\n"
    print(text)
    write_text(path, text)
    attach_to_parents([path], runs)
    return path
