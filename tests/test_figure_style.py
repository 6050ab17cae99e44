"""The house figure style (analysis/style.py) and the checker every analysis test applies to
the figures it draws (tests/figure_checks.py): the checker must catch v1's figures (metric
keys on axes, pseudo-TeX, no caption, a 2600-px strip) and pass the styled ones; names,
captions, grids and the seed spread are checked against what they must state."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from figure_checks import problems, text_problems
from matplotlib.mathtext import MathTextParser

from analysis.core import style
from analysis.core.runner import commands
from analysis.core.select import pooled
from analysis.core.style import plt

TESTS = Path(__file__).parent


def test_checker_catches_raw_keys_and_pseudo_tex_and_accepts_mathtext():
    assert text_problems("erank_io", "y")  # a metric key
    assert text_problems("norm.placement = post", "title")  # a dotted param
    assert text_problems("∂h_l/∂h_0", "y")  # TeX outside math
    assert text_problems("βα^M √L", "x")
    assert text_problems("alpha", "x")  # a param name as the label
    assert text_problems("$\\alpha", "x")  # unbalanced
    for ok in (style.name("erank_io"), style.name("depth_factor"), "layer $\\ell$",
               "best test accuracy", "error bars: ±1 s.d. over seeds",
               style.value_label("beta_scaling", "inv_sqrt_depth")):  # fmt: skip
        assert text_problems(ok, "label") == [], ok


def v1_figure():
    """Figure 4 as v1 drew it: raw key on the axis, pseudo-TeX title, a wide strip, no caption."""
    fig, ax = plt.subplots(figsize=(13.7, 3.9))
    ax.bar(range(3), [0.6, 0.1, 0.05])
    ax.set_xticks(range(3), ["pre/rmsnorm", "post/rmsnorm", "none"])
    ax.set_ylabel("erank_io")
    ax.set_title("fig4: erank_io vs βα^M")
    return fig


def styled_figure():
    fig, (ax,) = style.panels(1)
    ax.plot([1, 2, 3], [0.5, 0.3, 0.2], label=style.value_label("expansion", 4))
    ax.plot([1, 2, 3], [0.45, 0.3, 0.25], **style.THEORY, label="Eq. 22")
    ax.set_xlabel(style.name("depth"))
    ax.set_ylabel(style.name("erank_io"))
    ax.set_title("erank across depth")
    ax.legend()
    df = pd.DataFrame({"width": [64, 64], "expansion": [4, 4], "depth": [12, 24], "seeds": [4, 4],
                       "size": ["cpu", "cpu"], "matrices": [2, 2]})  # fmt: skip
    style.caption(fig, df, "fig5")
    return fig


@pytest.mark.parametrize("defect,found", [
    ("nan_title", "'nan'"), ("negative_zero", "'−0'"), ("roundoff", "e-16"), ("no_title", "no title"),
    ("log_bars", "error bars on a log y axis"), ("two_value_bar", "colour bar for 2 value"),
    ("paper_title", "names a paper figure"), ("empty_legend", "an empty legend"),
    ("log_one_tick", "log y axis with 1 labelled tick"),
])
def test_checker_marks_what_a_reviewer_marks(defect, found):
    """Issue 19 item 5: each defect, drawn on an otherwise clean figure, is reported."""
    import matplotlib as mpl

    fig = styled_figure()
    ax = fig.axes[0]
    if defect == "nan_title":
        ax.set_title(f"max spread: {float('nan'):.2g}")
    elif defect == "negative_zero":
        ax.plot([1], [0.3], label="Var$(\\lambda)$ = −0")
        ax.legend()
    elif defect == "roundoff":
        ax.plot([1], [0.3], label=f"Var = {-1.11e-16:.3g}")
        ax.legend()
    elif defect == "no_title":
        ax.set_title("")
    elif defect == "paper_title":  # issue 32 item 5: what is shown, not where it was printed
        fig.suptitle("Figure 5b/12: accumulated branch")
    elif defect == "empty_legend":  # a key with no entry (isorank's "r*: s" before issue 32)
        ax.legend(handles=[], title=r"$r^*$: $s$")
    elif defect == "log_one_tick":  # under a decade, minor ticks off: one power of ten in it
        ax.set_yscale("log")
        ax.set_ylim(0.6, 1.6)
        ax.yaxis.minorticks_off()
    elif defect == "log_bars":
        ax.errorbar([1, 2], [0.3, 0.2], yerr=[0.01, 0.01], label="bars")
        ax.set_yscale("log")
    else:
        sm = mpl.cm.ScalarMappable(cmap="viridis")
        sm.set_array(np.array([1.0, 2.0, 1.0]))
        fig.colorbar(sm, ax=ax, label=style.name("alpha"))
    assert any(found in p for p in problems(fig)), problems(fig)
    plt.close("all")


def test_heatmap_cells_show_the_seed_spread_of_every_seed_of_their_runs():
    """Issue 32 item 5: each run logs its seed mean and ``<metric>_std`` over its 4 seeds; the
    heatmap's table pools them (mean, s.d. over all seeds, seeds, runs) and every cell reads
    "mean ± s.d." — a cell of one seed only its mean, which the caption then says."""
    from analysis.study.fig2 import cell_note, draw_heatmap, heatmap_table

    rng = np.random.default_rng(1)
    seeds = {(a, L): rng.normal(0.5 / a, 0.03, 4) for a in (1.0, 2.0) for L in (4, 8)}
    df = pd.DataFrame([{"alpha": a, "depth": L, "width": 16, "seeds": 4, "size": "smoke",
                        "erank_io": v.mean(), "erank_io_std": v.std(ddof=1)}
                       for (a, L), v in seeds.items()])
    again = df.assign(erank_io=df["erank_io"] + 0.01)  # a second run of each cell
    table = heatmap_table(pd.concat([df, again]), "erank_io", "alpha", "depth", None)
    for (L, a), row in table.iterrows():
        both = np.concatenate([seeds[a, L], seeds[a, L] + 0.01])
        assert row["mean"] == pytest.approx(both.mean(), rel=1e-12)
        assert row["std"] == pytest.approx(both.std(ddof=1), rel=1e-12)
        assert (row["seeds"], row["count"]) == (8, 2)
    fig = draw_heatmap(table, "erank_io", "alpha", "depth", None, title="erank over α and L")
    style.caption(fig, df, "fig2", [cell_note(table["mean"], table["std"])])
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert len(texts) == 4 and all(re.fullmatch(r"[\d.]+\n±[\d.]+", t) for t in texts), texts
    assert problems(fig) == []
    one = heatmap_table(df.assign(seeds=1, erank_io_std=np.nan), "erank_io", "alpha", "depth", None)
    assert one["std"].isna().all() and (one["seeds"] == 1).all()
    fig = draw_heatmap(one, "erank_io", "alpha", "depth", None, title="erank over α and L")
    style.caption(fig, df, "fig2", ["cells: mean over seeds"])  # main's note: no word of one seed
    assert any("without their seed spread" in p for p in problems(fig)), problems(fig)
    style.captions(fig)[0].remove()
    style.caption(fig, df, "fig2", [cell_note(one["mean"], one["std"])])
    assert "one seed" in cell_note(one["mean"], one["std"]) and problems(fig) == []
    plt.close("all")


def test_one_meaning_per_line_style():
    """Issue 19 item 5 (Fig 5b: dashed = the closed form in one column, m/d = 4 in the other):
    a dash pattern keyed by two grey/black legend entries of different meanings, or one look
    (pattern, colour, marker) under two labels, is marked; a style keyed once, the same key
    repeated in several panels, each panel's closed form in the house's black dashed, and
    colours telling entries of one style apart are not."""
    fig = styled_figure()  # its theory curve: black dashed "Eq. 22"
    ax = fig.axes[0]
    ax.plot([], [], color="0.3", ls="--", label=style.value_label("expansion", 4))  # Fig 5b
    ax.legend()
    found = [p for p in problems(fig) if "dashed line style keys 2 meanings" in p]
    assert found and "a closed form" in found[0] and "m/d = 4" in found[0], problems(fig)
    fig = styled_figure()
    ax = fig.axes[0]
    for c, a in (("C1", 1), ("C1", 2)):
        ax.plot([1, 2], [0.2, 0.1 * a], color=c, ls=":", marker="o", label=style.value_label("alpha", a))
    ax.legend()
    assert any("carries 2 labels" in p for p in problems(fig)), problems(fig)
    ax.lines[-1].remove()
    ax.legend()
    assert problems(fig) == []
    # good: the style keyed once per figure (the key repeated in a second panel), an error-bar
    # entry of its own style, and colours telling apart dashed lines of one meaning
    fig, axes = style.panels(2)
    for ax, law in zip(axes, ("Eq. 21", "Eq. 22"), strict=True):  # dashed black: a closed form
        ax.plot([1, 2], [1, 2], **style.THEORY, label=law)
        ax.plot([], [], color="0.3", ls="-.", label=style.value_label("expansion", 4))
        for c, a in (("C0", 1), ("C3", 2)):
            ax.plot([1, 2], [a, a], color=c, ls="-.", label=style.value_label("alpha", a))
        ax.errorbar([1, 2], [1, 1.5], yerr=[0.1, 0.1], color="0.5", ls=":", label="measured")
        ax.set_xlabel(style.name("depth"))
        ax.set_ylabel(style.name("erank_io"))
        ax.legend()
    fig.suptitle("two panels")
    df = pd.DataFrame({"width": [64], "expansion": [4], "depth": [12], "seeds": [4], "size": ["cpu"],
                       "matrices": [2]})
    style.caption(fig, df, "fig5")
    assert problems(fig) == []
    axes[1].errorbar([1, 2], [1, 1.2], yerr=[0.1, 0.1], color="0.1", ls=":", label="fit")
    axes[1].legend()  # the error-bar entry's dotted line: a second meaning
    assert any("dotted line style keys 2 meanings" in p for p in problems(fig)), problems(fig)
    plt.close("all")


def test_one_or_two_values_get_a_legend_not_a_colour_bar_and_plain_captions_no_mlp_knobs():
    fig = styled_figure()
    colors, sm = style.value_colors([1.0, 2.0])
    out = style.colorbar(fig, sm, fig.axes[0], "alpha")
    assert len(fig.axes) == 1 and out is fig.axes[0].get_legend()  # no colour-bar axes
    assert "$\\alpha = 2$" in [t.get_text() for t in out.get_texts()]
    assert problems(fig) == []
    _, sm3 = style.value_colors([1.0, 2.0, 4.0])
    style.colorbar(fig, sm3, fig.axes[0], "alpha")
    assert len(fig.axes) == 2  # three values: a bar with one band per value
    plain = pd.DataFrame({"width": [16], "expansion": [4], "matrices": [2], "depth": [4], "seeds": [2],
                          "size": ["smoke"], "model.name": ["plain"]})
    text = " ".join(style.caption_parts(plain, "mf_spectrum"))
    assert "m/d" not in text and "$M" not in text and "$d = 16$" in text
    plt.close("all")


def test_checker_fails_v1_figures_and_passes_styled_ones():
    bad = problems(v1_figure())
    assert any("exceeds a page" in p for p in bad)
    assert any("no caption" in p for p in bad)
    assert any("erank_io" in p and "ylabel" in p for p in bad)
    assert any("pseudo-TeX" in p for p in bad)
    assert problems(styled_figure()) == []
    plt.close("all")


def test_every_symbol_is_valid_mathtext():
    parser = MathTextParser("agg")
    for key, sym in style.SYMBOLS.items():
        for math in re.findall(r"\$[^$]*\$", sym):
            parser.parse(math, dpi=72)  # raises ValueError on bad TeX
        assert text_problems(sym, key) == [], key


def test_value_labels_use_the_fields_names():
    assert style.value_label("expansion", 4.0) == "$m/d = 4$"
    assert style.value_label("alpha", 0.354) == r"$\alpha = 0.354$"
    assert style.value_label("norm.placement", "post") == "Post-Norm"
    assert style.value_label("skip_every", 0) == "no skip"
    assert style.value_label("beta_scaling", "inv_sqrt_depth") == r"$\beta \propto 1/\sqrt{L}$"
    assert style.name("erank_io") == r"$\mathrm{erank}(\partial h_L/\partial h_0)/d$"
    assert style.name("depth_factor") == r"$\beta\alpha^M\sqrt{L}$"


def test_caption_states_d_md_depth_seeds_and_size():
    df = pd.DataFrame({
        "width": [64] * 4, "expansion": [1, 1, 4, 4], "depth": [12, 24, 48, 96],
        "matrices": [2] * 4, "activation": ["relu"] * 4, "seeds": [2] * 4, "size": ["cpu"] * 4,
    })  # fmt: skip
    fig, _ = style.panels(2)
    text = style.caption(fig, df, "fig5").get_text()
    for want in ("fig5: 4 runs", "$d = 64$", r"$m/d \in \{1, 4\}$", r"$L \in \{12, 24, 48, 96\}$",
                 "seeds: 2 per run", "size = cpu", "ReLU"):  # fmt: skip
        assert want in text, (want, text)
    train = df.assign(**{"task.name": "train", "seed": [0, 1, 0, 1]}).drop(columns="size")
    text = style.caption(fig, train, "fig6_train").get_text()
    assert "seeds: 1 per run × 2 seed offsets" in text and "size = full" in text
    plt.close("all")


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 12])
def test_panel_grids_fit_a_page_and_wrap(n):
    fig, axes = style.panels(n)
    w, h = fig.get_size_inches()
    assert len(axes) == n and w <= style.TWO_COLUMN and h <= style.PAGE_HEIGHT
    rows = {ax.get_subplotspec().rowspan.start for ax in axes}
    assert len(rows) == -(-n // 3)  # at most 3 panels to a row: no 1 × n strip
    fig, axes = style.grid(9, 4)
    assert fig.get_size_inches()[1] <= style.PAGE_HEIGHT
    plt.close("all")


def test_discrete_colour_bar_has_one_tick_per_value():
    fig, (ax,) = style.panels(1)
    colors, sm = style.value_colors([4.0, 1.0, 2.0, 1.0])
    assert list(colors) == [1.0, 2.0, 4.0] and len(set(map(tuple, colors.values()))) == 3
    cb = style.colorbar(fig, sm, ax, "expansion")
    fig.canvas.draw()
    assert cb.ax.get_ylabel() == "$m/d$"
    assert [t.get_text() for t in cb.ax.get_yticklabels()] == ["1", "2", "4"]
    plt.close("all")


def test_seed_spread_pools_every_seed_of_a_cells_runs():
    """pooled() from run means/stds/counts equals the std of the concatenated seeds."""
    rng = np.random.default_rng(0)
    seeds = [rng.normal(0.3, 0.05, n) for n in (4, 4, 7)]
    df = pd.DataFrame({
        "cell": ["a", "a", "b"],
        "erank_io": [s.mean() for s in seeds],
        "erank_io_std": [s.std(ddof=1) for s in seeds],
        "seeds": [len(s) for s in seeds],
    })  # fmt: skip
    t = pooled(df, "erank_io", ["cell"])
    both = np.concatenate(seeds[:2])
    assert t.loc["a", "mean"] == pytest.approx(both.mean(), rel=1e-12)
    assert t.loc["a", "std"] == pytest.approx(both.std(ddof=1), rel=1e-12)
    assert t.loc["a", "seeds"] == 8 and t.loc["a", "runs"] == 2
    assert t.loc["b", "std"] == pytest.approx(seeds[2].std(ddof=1), rel=1e-12)  # one run
    # train runs are one seed each: the spread is over the runs (seed offsets)
    train = pd.DataFrame({"cell": ["c"] * 3, "acc": [0.5, 0.52, 0.47], "seeds": [4] * 3,
                          "task.name": ["train"] * 3})  # fmt: skip
    t = pooled(train, "acc", ["cell"])
    assert t.loc["c", "std"] == pytest.approx(np.std([0.5, 0.52, 0.47], ddof=1))
    assert t.loc["c", "seeds"] == 3


def test_every_analysis_command_is_style_checked_by_a_test():
    """Each command (the report aside) is run by a test whose figures go through figure_checks:
    the every-experiment test (test_analysis_experiments: every registry entry's commands, by
    default for the entries that do not train, nor read one that does), or a test module naming it (test_analysis_rank
    / _spectra via `checked`, _training via its batch)."""
    from analysis.core.registry import default

    sources = {p.name: p.read_text() for p in TESTS.glob("test_analysis_*.py")}
    checked = {n: s for n, s in sources.items() if "checked" in s or "problems" in s}
    reg = default()
    trains = {e.id for e in reg if e.needs.train or any(reg[r].needs.train for r in e.reads)}
    by_registry = {argv[0] for e in reg if e.id not in trains for argv in e.argvs()}
    for command in set(commands()) - {"report"} - by_registry:
        assert any(
            re.search(rf"""["']{command}["']""", s) for s in checked.values()
        ), f"no style-checked test runs `analysis {command}`"
