"""What makes a figure publication-ready here, checked on the matplotlib objects a command
drew (``analysis.core.style.recording``), not by eye: every label in the field's names
(mathtext for symbols, no metric keys or pseudo-TeX outside ``$…$``), mathtext that renders,
a caption line stating d, seeds and size, a page-sized canvas, labelled colour bars, every
panel row/column labelled, and the theory curves a command promises in its legend; and none
of what a reviewer marks (issue 19 item 5): no NaN or −0 (or round-off shown as a value) in
any text, a title on every figure, no error bars on a log axis, no colour bar for one or two
values (a legend instead), one meaning per line style; nor (issue 32 item 5) a paper's figure
number in a title, an empty legend, a log axis with fewer than two tick labels, a heatmap cell
without its seed spread."""

from __future__ import annotations

import contextlib
import re

import numpy as np
from matplotlib.colors import to_rgb
from matplotlib.container import ErrorbarContainer
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator

from analysis.core import style
from analysis.core.runner import main as analysis_main
from analysis.core.style import recording

#: words that are raw config/metric keys when they stand alone as a label
RAW_WORDS = {
    "alpha", "beta", "depth", "width", "expansion", "matrices", "activation",
    "nominal_ratio", "depth_factor", "erank_io", "erank_profile", "erank",
}  # fmt: skip
_MATH = re.compile(r"\$[^$]*\$")
_SNAKE = re.compile(r"\b[a-z][a-z0-9]*_[a-z0-9_]+\b")  # erank_io, best_test_accuracy
_DOTTED = re.compile(r"\b[a-z]+\.[a-z_]{2,}\b")  # norm.placement, task.stable_accuracy (not s.d.)


def text_problems(text: str, where: str) -> list[str]:
    """Raw keys or pseudo-TeX in one piece of text (math spans are allowed anything)."""
    if not text:
        return []
    if text.count("$") % 2:
        return [f"{where}: unbalanced $ in {text!r}"]
    plain = _MATH.sub(" ", text)
    out = []
    if m := _SNAKE.search(plain):
        out.append(f"{where}: raw key {m.group(0)!r} in {text!r}")
    if m := _DOTTED.search(plain):
        out.append(f"{where}: dotted key {m.group(0)!r} in {text!r}")
    if re.search(r"[_^]", plain):
        out.append(f"{where}: pseudo-TeX (_ or ^ outside $…$) in {text!r}")
    if plain.strip().lower() in RAW_WORDS:
        out.append(f"{where}: label is the raw key {text!r}")
    return out


#: NaN, a negative zero, or round-off printed as a value (−1.11e-16) in a text a reader sees
#: (round-off: float64's ε is 2.2e-16, so a value printed below 1e-12 is a 0 that lost its sign
#: bits; 5.9e-11, an integrator's relative error, is a value)
_NUMBER_NOISE = re.compile(r"(?<![\w.])(nan|NaN|[−-]0(?![.\d])|[−-]0\.0+(?![\d])"
                           r"|[−-]?\d(\.\d+)?e[−-](1[3-9]|[2-9]\d|\d{3}))(?![\w])")


def number_problems(text: str, where: str) -> list[str]:
    """NaN, −0 or a round-off value (|x| < 1e-12 printed in e-notation) in one text."""
    if text and (m := _NUMBER_NOISE.search(_MATH.sub(lambda t: t.group(0).replace("$", " "), text))):
        return [f"{where}: {m.group(0)!r} in {text!r}"]
    return []


def _is_colorbar(ax) -> bool:
    return getattr(ax, "_colorbar", None) is not None


def _legend_lines(fig):
    """``(label, line)`` of every legend entry of ``fig`` drawn as a line (a Line2D handle, or
    an error-bar entry's data line), axes legends and figure legends alike."""
    legends = [(ax.get_legend(), ax) for ax in fig.axes] + [(leg, None) for leg in fig.legends]
    for leg, ax in legends:
        if leg is None:
            continue
        bars = {c.get_label(): c.lines[0] for a in ([ax] if ax else fig.axes) for c in a.containers
                if isinstance(c, ErrorbarContainer)}
        for handle, text in zip(leg.legend_handles, leg.get_texts(), strict=False):
            label = text.get_text()
            line = handle if isinstance(handle, Line2D) else bars.get(label)
            if line is not None and label:
                yield label, line


def _dashes(line) -> tuple | None:
    """A drawn line's dash pattern as set (unscaled by its width), None when solid or no line."""
    if line.get_linestyle() in ("-", "None", "none", "", " "):
        return None
    offset, seq = line._unscaled_dash_pattern
    return (float(offset), tuple(float(v) for v in seq or ()))


def line_style_problems(fig) -> list[str]:
    """One meaning per line style (issue 19 item 5: Fig 5b's dashed lines meant its closed
    form and m/d = 4).  Over the legend entries drawn as non-solid lines, in the whole figure:

    * a style's key — an entry in black or grey, whose colour says nothing (the house's theory
      curves, ``style.THEORY``; the proxies ``plot([], [], color="0.3", ls=…)`` keying a style)
      — names one meaning: every grey or black entry of one dash pattern has one label, the
      house's black dashed theory curves counting as one meaning, "a closed form", whatever
      curve each panel's label names;
    * one look, one label: entries alike in dash pattern, colour and marker carry one label.
    """
    theory = (_dashes(Line2D([], [], ls=style.THEORY["ls"])), to_rgb(style.THEORY["color"]))
    keys: dict[tuple, set[str]] = {}
    looks: dict[tuple, set[str]] = {}
    for label, line in _legend_lines(fig):
        dashes = _dashes(line)
        if dashes is None:
            continue
        rgb = to_rgb(line.get_color())
        if max(rgb) - min(rgb) < 1e-6:
            meaning = "a closed form (style.THEORY)" if (dashes, rgb) == theory else label
            keys.setdefault(dashes, set()).add(meaning)
        looks.setdefault((dashes, rgb, str(line.get_marker())), set()).add(label)
    out = [f"one {_style_name(d)} line style keys {len(v)} meanings: {sorted(v)}"
           for d, v in keys.items() if len(v) > 1]
    out += [f"one look ({_style_name(d)}, colour {c}, marker {m!r}) carries {len(v)} labels: {sorted(v)}"
            for (d, c, m), v in looks.items() if len(v) > 1 and max(c) - min(c) >= 1e-6]
    return out


def _style_name(dashes: tuple) -> str:
    named = {_dashes(Line2D([], [], ls=ls)): word for ls, word in
             (("--", "dashed"), (":", "dotted"), ("-.", "dash-dot"))}
    return named.get(dashes, f"dash {dashes[1]}")


#: a paper's figure or table number in a title ("Figure 5b/12: …", "(He et al., Table 6)")
_PAPER_REF = re.compile(r"\b(Fig(ure)?s?\.?|Tables?)\s*\d")
#: a heatmap cell labelled with its value alone (no "±" spread below it)
_BARE_NUMBER = re.compile(r"[−-]?\d[\d.]*(e[−+-]?\d+)?")


def log_tick_problems(ax, i: int) -> list[str]:
    """A log axis of ``ax`` with fewer than two labelled ticks in view (a drawn canvas); an axis
    ticked at given values (the depths run: a FixedLocator) shows what it holds, even one."""
    out = []
    for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
        if axis.get_scale() != "log" or isinstance(axis.get_major_locator(), FixedLocator):
            continue
        lo, hi = sorted(axis.get_view_interval())
        shown = {t.get_loc() for t in axis.get_major_ticks() + axis.get_minor_ticks()
                 if lo * (1 - 1e-9) <= t.get_loc() <= hi * (1 + 1e-9) and t.label1.get_text()}
        if len(shown) < 2:
            out.append(f"axes[{i}]: log {name} axis with {len(shown)} labelled tick(s) "
                       f"over [{lo:.3g}, {hi:.3g}]")
    return out


def issue32_problems(fig) -> list[str]:
    """Issue 32 item 5: titles that name a paper figure, empty legends, log axes without two
    readable ticks, heatmap cells without their seed spread (unless the caption says one seed)."""
    titles = [("suptitle", fig._suptitle.get_text())] if fig._suptitle is not None else []
    titles += [(f"axes[{i}].title", ax.get_title()) for i, ax in enumerate(fig.axes)]
    out = [f"{where} names a paper figure, not what is shown: {t!r}" for where, t in titles
           if _PAPER_REF.search(t)]
    legends = [(f"axes[{i}]", ax.get_legend()) for i, ax in enumerate(fig.axes)]
    legends += [("figure", leg) for leg in fig.legends]
    out += [f"{where}: an empty legend" for where, leg in legends
            if leg is not None and not any(t.get_text().strip() for t in leg.get_texts())]
    one_seed = "one seed" in " ".join(t.get_text() for t in style.captions(fig))
    for i, ax in enumerate(fig.axes):
        if _is_colorbar(ax) or not ax.get_visible():
            continue
        out += log_tick_problems(ax, i)
        bare = [t.get_text() for t in ax.texts if _BARE_NUMBER.fullmatch(t.get_text().strip())]
        if ax.images and bare and not one_seed:
            out.append(f"axes[{i}]: heatmap cells without their seed spread ({bare[0]!r}, no ±)")
    return out


def reviewer_problems(fig) -> list[str]:
    """What a reviewer marks on a drawn figure (issue 19 item 5, issue 32 item 5)."""
    out = line_style_problems(fig) + issue32_problems(fig)
    for where, text in [*_texts(fig), *(("caption", t.get_text()) for t in style.captions(fig))]:
        out += number_problems(text, where)
    panels = [ax for ax in fig.axes if not _is_colorbar(ax) and ax.get_visible()]
    has_suptitle = fig._suptitle is not None and fig._suptitle.get_text().strip()
    if not has_suptitle and (len(panels) > 1 or not all(ax.get_title().strip() for ax in panels)):
        out.append("no title (a figure of several panels needs a suptitle; one panel, its title)")
    for i, ax in enumerate(fig.axes):
        if _is_colorbar(ax):
            m = ax._colorbar.mappable
            # a bar keying the values of a param (style.value_colors, or a bare mappable whose
            # array is those values); a heatmap's bar keys its cells, however few at smoke size
            vals = getattr(m, "values", None)
            if vals is None and not hasattr(m, "get_coordinates") and not hasattr(m, "get_extent") \
                    and m.get_array() is not None and np.size(m.get_array()):
                arr = np.asarray(m.get_array(), dtype=float).ravel()
                vals = np.unique(arr[np.isfinite(arr)])
            if vals is not None and len(vals) <= 2:
                out.append(f"axes[{i}]: a colour bar for {len(vals)} value(s) (a legend instead)")
            continue
        for c in ax.containers:
            if isinstance(c, ErrorbarContainer) and c.has_yerr and ax.get_yscale() == "log":
                out.append(f"axes[{i}]: error bars on a log y axis ({c.get_label()!r})")
            if isinstance(c, ErrorbarContainer) and c.has_xerr and ax.get_xscale() == "log":
                out.append(f"axes[{i}]: error bars on a log x axis ({c.get_label()!r})")
    return out


def _texts(fig):
    """``(where, text)`` of every label a reader sees: suptitle, titles, axis labels,
    legend entries and titles, colour-bar labels, categorical tick labels."""
    if fig._suptitle is not None:
        yield "suptitle", fig._suptitle.get_text()
    for i, ax in enumerate(fig.axes):
        yield f"axes[{i}].title", ax.get_title()
        yield f"axes[{i}].xlabel", ax.get_xlabel()
        yield f"axes[{i}].ylabel", ax.get_ylabel()
        leg = ax.get_legend()
        if leg is not None:
            yield f"axes[{i}].legend title", leg.get_title().get_text()
            for t in leg.get_texts():
                yield f"axes[{i}].legend", t.get_text()
        for t in ax.get_xticklabels():
            if not re.fullmatch(r"[−\-0-9.e+×^{}$\\a-z ]*", t.get_text()):
                yield f"axes[{i}].xtick", t.get_text()
    for leg in fig.legends:
        for t in leg.get_texts():
            yield "figure legend", t.get_text()


def _grid_labels(fig) -> list[str]:
    """Every row of panels has a y label and every column an x label (or category ticks)."""
    rows, cols = {}, {}
    for ax in fig.axes:
        if getattr(ax, "_colorbar", None) is not None or not ax.get_visible():
            continue
        spec = ax.get_subplotspec()
        if spec is None:
            continue
        r, c = spec.rowspan.start, spec.colspan.start
        rows.setdefault(r, []).append(bool(ax.get_ylabel()))
        categorical = any(
            t.get_text() and not re.fullmatch(r"[−\-0-9.e+$\\{}^]*", t.get_text())
            for t in ax.get_xticklabels()
        )
        cols.setdefault(c, []).append(bool(ax.get_xlabel()) or categorical)
    out = [f"row {r} of panels has no y label" for r, v in rows.items() if not any(v)]
    out += [f"column {c} of panels has no x label" for c, v in cols.items() if not any(v)]
    return out


def problems(fig) -> list[str]:
    """Everything that keeps ``fig`` from going into a paper as it is (empty: none)."""
    out = []
    try:
        fig.canvas.draw()  # mathtext that does not parse raises here
    except Exception as e:  # noqa: BLE001
        return [f"figure does not render: {type(e).__name__}: {e}"]
    w, h = fig.get_size_inches()
    if w > style.TWO_COLUMN + 1e-6 or h > style.PAGE_HEIGHT + 1e-6:
        out.append(f"canvas {w:.2f} × {h:.2f} in exceeds a page ({style.TWO_COLUMN} × "
                   f"{style.PAGE_HEIGHT} in)")
    caps = style.captions(fig)
    if not caps:
        out.append("no caption line")
    else:
        text = " ".join(t.get_text() for t in caps)
        for need, pattern in (("d", r"\$d (=|\\in)"), ("seeds", r"seeds: \d"), ("size", r"size = \w")):
            if not re.search(pattern, text):
                out.append(f"caption states no {need}: {text!r}")
        # the caption opens with the MLflow experiment names ("fig6_train: 8 runs"): names, not keys
        body = text.split(":", 1)[1] if ":" in text else text
        out += text_problems(_MATH.sub(" ", body).replace("seeds:", ""), "caption")
    for where, text in _texts(fig):
        out += text_problems(text, where)
    for i, ax in enumerate(fig.axes):
        if getattr(ax, "_colorbar", None) is not None and not (ax.get_ylabel() or ax.get_xlabel()):
            out.append(f"axes[{i}]: colour bar without a label")
    out += _grid_labels(fig)
    out += reviewer_problems(fig)
    return out


def legend_texts(fig) -> str:
    """Every legend entry of ``fig`` joined (theory curves are named there)."""
    parts = []
    for ax in fig.axes:
        if (leg := ax.get_legend()) is not None:
            parts += [t.get_text() for t in leg.get_texts()]
    return " | ".join(parts)


@contextlib.contextmanager
def checked(argv: list[str], theory: dict[str, list[str]] | None = None):
    """Run ``python -m analysis argv`` in this process; assert every figure it saved passes
    :func:`problems` and names each promised theory curve (``{figure stem prefix:
    [substring…]}`` in its legends).  Yields ``(status, figures)``; the figures close when the block ends."""
    with recording() as figs:
        rc = analysis_main(argv)
        if rc == 0:
            assert figs, f"`analysis {' '.join(argv)}` saved no figure"
        for fig in figs:
            found = problems(fig)
            assert not found, f"`analysis {argv[0]}`, figure {fig.get_label()}:\n" + "\n".join(found)
            wants = [w for k, ws in (theory or {}).items() if fig.get_label().startswith(k) for w in ws]
            for want in wants:
                assert want in legend_texts(fig), (
                    f"{fig.get_label()}: no theory curve {want!r} in the legend: {legend_texts(fig)}"
                )
        yield rc, {f.get_label(): f for f in figs}


#: the theory curves each figure promises, by figure stem (substrings of legend entries)
THEORY = {
    "stream_kappa": [r"\kappa = "],
    "accumulated_branch": ["uncorrelated", "coherent"],
    "isorank_erank_io": [r"L^{-1/2}"],  # the study's law, in the first panel
    "paths_profile": ["Binomial"],
    "paths_mean_order": ["uncorrelated"],
    "spike": [r"1/\pi", r"c_\sigma", "coherent", "uncorrelated"],
    "mp_erank": ["Gaussian product"],
    "mp_histograms": ["Marchenko"],
    "profiles_branch_ratio": ["Eq. 21/22"],
    "table1": ["1/c"],
    "fig16_best_test_accuracy_vs_depth": ["chance"],
}
