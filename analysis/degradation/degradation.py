"""The degradation replication (He et al. 2016): the commands ``init-gradients``, ``responses``,
``error-curves``, ``error-table``, ``lesion``, the claims and the registry entry."""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from rankexp import theory

from ..core import style
from ..core.claims import Check, Claim, Measured, NotRun, Runs, above, at_most, below, near
from ..core.registry import Experiment, Needs
from ..core.runner import Command, out_dir
from ..core.select import SelectionError, load, series
from ..core.style import save, to_markdown, write_text
from ..study.fig6_train import LR_COLUMN

log = logging.getLogger("analysis")

EXPERIMENT = "degradation"

RESIDUAL = "model.residual"

FAMILY_NAMES = {False: "plain", True: "ResNet"}

PANEL_TITLES = {False: "plain networks", True: "ResNets"}

#: He et al.'s figure y-limit (%)
PAPER_YLIM = 20.0

#: He et al. §4.2: the plain 110-layer network "has >60% error"
HE_PLAIN110_ERROR = 60.0

def networks(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with ``residual`` (bool) and ``depth`` (int), plain→ResNet, by depth; SelectionError
    without ``model.residual`` (not ``model=cifar_resnet`` runs)."""
    if RESIDUAL not in df:
        raise SelectionError(f"runs have no {RESIDUAL} param: are they model=cifar_resnet runs "
                       "(python -m rankexp experiment=degradation -m)?")
    df = df.copy()
    df["residual"] = df[RESIDUAL].astype(str).str.lower().isin(["true", "1"])
    df["depth"] = df["depth"].astype(int)
    return df.sort_values(["residual", "depth"]).reset_index(drop=True)


def with_task(df: pd.DataFrame, task: str, prefer: Sequence[str] = ()) -> tuple[pd.DataFrame, str]:
    """``(runs, task)``: the runs of ``task``, or with ``any`` the first of ``prefer`` that has
    runs; SelectionError (naming the sizes that make them) when none."""
    names = df["task.name"].astype(str) if "task.name" in df else pd.Series("", index=df.index)
    for t in ([task] if task != "any" else list(prefer)):
        sel = df[names == t]
        if not sel.empty:
            return sel.reset_index(drop=True), t
    hint = {"train": "size=smoke or size=full", "measure": "size=cpu"}
    raise SelectionError(f"no task={task if task != 'any' else '/'.join(prefer)} runs with this metric "
                   f"(run python -m rankexp experiment={EXPERIMENT} "
                   f"{hint.get(task, 'size=cpu / size=smoke')} -m)")


def lr_key(row: pd.Series) -> str:
    """The suffix ``<k>`` of a train run's ``*_lr<k>`` metrics; SelectionError without any."""
    for c, v in row.items():
        m = LR_COLUMN.match(str(c))
        if m and pd.notna(v):
            return m.group(1)
    raise SelectionError(f"run {row.get('run_id')} has no final_test_acc_lr<lr>: is it a task=train run?")


def mean_series(uri: str | None, runs: pd.DataFrame, key: Callable[[pd.Series], str] | str):
    """``{(residual, depth): (steps, mean values over the runs)}`` of a logged series."""
    out = {}
    for (res, depth), group in runs.groupby(["residual", "depth"], sort=True):
        curves = [series(uri, row["run_id"], key(row) if callable(key) else key)
                  for _, row in group.iterrows()]
        steps = curves[0][0]
        same = [v for s, v in curves if len(s) == len(steps) and (s == steps).all()]
        out[(bool(res), int(depth))] = (steps, np.mean(same, axis=0))
    return out


def depth_colors(depths) -> dict[int, tuple]:
    """One viridis colour per depth (shallow dark, deep light), the same in every figure."""
    return style.value_colors(depths, stop=0.85)[0]


def _caption(fig, runs: pd.DataFrame, args: argparse.Namespace, *extra: str) -> None:
    """:func:`analysis.core.style.caption` of a ConvNet's runs (depth, seeds, size, task), its
    ``d`` the stage-1 filters ``model.base_width``."""
    keep = [c for c in ("depth", "seeds", "seed", "size", "task.name") if c in runs]
    frame = runs[keep].assign(width=runs["model.base_width"].astype(int)
                              if "model.base_width" in runs else 16)
    style.caption(fig, frame, args.experiment[0],
                  ["$d$: stage-1 filters (2$d$, 4$d$ after)", *extra])


def _label(res: bool, depth: int) -> str:
    return f"{FAMILY_NAMES[res]}-{depth}"


def _legend(ax, **kw) -> None:
    """A legend, or a note where the panel has no runs."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kw)
    else:
        ax.text(0.5, 0.5, "no runs", transform=ax.transAxes, ha="center", color="0.5")


def conv_steps(depth):
    """Conv layers from conv 2 to conv 6n+1 of a depth-(6n+2) network, ``6n − 1`` (the
    exponent of ``grad_ratio``'s per-layer growth); arrays in, arrays out."""
    return 6 * ((np.asarray(depth) - 2) // 6) - 1


def gradient_ratio_table(runs: pd.DataFrame) -> pd.DataFrame:
    """``grad_ratio`` per (depth × network): ``plain``, ``ResNet`` (seed means), ``*_std`` (pooled
    seed spread), ``*_log10``, ``*_per_layer`` (ratio^(1/(6n−1))); SelectionError without it."""
    if "grad_ratio" not in runs:
        raise SelectionError("runs have no grad_ratio (was init_gradient_norms in task.probes?)")
    var = runs["grad_ratio_std"].astype(float) ** 2 if "grad_ratio_std" in runs else np.nan
    g = runs.assign(var=var).groupby(["depth", "residual"])
    mean, std = g["grad_ratio"].mean().unstack(), np.sqrt(g["var"].mean().unstack())
    table = pd.concat({f"{FAMILY_NAMES[bool(r)]}{s}": t[r] for r in mean
                       for s, t in (("", mean), ("_std", std))}, axis=1)
    steps = conv_steps(table.index.to_numpy())
    for name in FAMILY_NAMES.values():
        if name in table:
            table[f"{name}_log10"] = np.log10(table[name])
            table[f"{name}_per_layer"] = table[name] ** (1.0 / steps)
    return table


def final_error_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Final errors (%) per depth: ``plain_test``, ``ResNet_test``, ``plain_train``,
    ``ResNet_train`` (clean, where logged), ``He_ResNet_test`` (He et al. Table 6), ``runs``."""
    from rankexp.models.convnet import HE_RESNET_TEST_ERROR  # defers torch

    cells = []
    for _, row in runs.iterrows():
        k, name = lr_key(row), FAMILY_NAMES[bool(row["residual"])]
        cell = {"depth": int(row["depth"]),
                f"{name}_test": 100 * (1 - float(row[f"final_test_acc_lr{k}"]))}
        clean = row.get(f"clean_train_error_lr{k}")
        if clean is not None and pd.notna(clean):
            cell[f"{name}_train"] = 100 * float(clean)
        cells.append(cell)
    g = pd.DataFrame(cells).groupby("depth")
    table = g.mean().assign(runs=g.size().astype(float))
    table["He_ResNet_test"] = [HE_RESNET_TEST_ERROR.get(int(d), np.nan) for d in table.index]
    order = [c for c in ("plain_test", "ResNet_test", "He_ResNet_test", "plain_train",
                         "ResNet_train", "runs") if c in table]
    return table[order]


def lesion_table(uri: str | None, runs: pd.DataFrame) -> pd.DataFrame:
    """Long table (network, depth, block, position, downsampling, error %, intact %) of the
    runs' ``lesion_error`` series (means over runs of a network)."""
    rows = []
    curves = mean_series(uri, runs, "lesion_error")
    intact = runs.groupby(["residual", "depth"])["lesion_intact_error"].mean()
    for (res, depth), (blocks, err) in curves.items():
        n = (depth - 2) // 6
        for b, e in zip(blocks.astype(int), err, strict=True):
            rows.append({"network": FAMILY_NAMES[res], "residual": res, "depth": depth, "block": b,
                         "position": (b - 0.5) / (3 * n), "downsampling": b in (n + 1, 2 * n + 1),
                         "error": 100 * e, "intact": 100 * float(intact[(res, depth)])})
    return pd.DataFrame(rows)


def _task_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", choices=["measure", "train", "any"], default="any",
                   help="which runs: task=measure (initialization), task=train, or any "
                        "(default: any)")


def _init_gradients_main(args: argparse.Namespace) -> list[Path]:
    df = networks(load(args, [RESIDUAL, "depth", "grad_ratio"]))
    runs, task = with_task(df, args.task, ("measure", "train"))
    table = gradient_ratio_table(runs)
    curves = mean_series(args.uri, runs, "grad_norm")
    colors = depth_colors(runs["depth"])
    fig, axes = style.panels(2, sharey=True)
    for ax, res in zip(axes, (False, True), strict=True):
        for (r, depth), (layers, norms) in curves.items():
            if r == res:
                ax.plot(layers / layers.max(), norms, color=colors[depth], marker=".", ms=2.5,
                        label=f"$L = {depth}$")
        ax.set_yscale("log")
        ax.set_title(f"{PANEL_TITLES[res]} at initialization")
        ax.set_xlabel("relative depth $i/(6n+1)$")
    plain = {d: c for (r, d), c in curves.items() if not r}
    if plain:  # the mean-field rate, anchored at the deepest plain net's last conv
        layers, norms = plain[max(plain)]
        axes[0].plot(layers / layers.max(), norms[-1] * theory.BN_RELU_GRADIENT_GROWTH ** (layers[-1] - layers),
                     **style.THEORY, label=r"mean field: $\sqrt{\pi/(\pi-1)}$ per layer")
    for ax in axes:  # the plain curves fill the upper left
        _legend(ax, loc="upper right")
    axes[0].set_ylabel(r"$\|\partial\ell/\partial W_i\|_F$")
    fig.suptitle("Gradients at initialization: plain nets explode toward the input, ResNets do not")
    batch = style.values(runs, "task.options.init_gradient_norms.batch") or [256]
    _caption(fig, runs, args, f"one fixed batch of {int(float(batch[0]))} training images",
             f"task = {task}")
    out = out_dir(args)
    paths = save(fig, out, "init_gradient_norms", table)
    paths.append(write_text(out / "init_gradient_ratio.md", to_markdown(table, ".3g")))
    log.info("gradient ratio ‖∇W₂‖/‖∇W_last‖ at initialization:\n%s", to_markdown(table, ".3g"))
    return paths


def _responses_main(args: argparse.Namespace) -> list[Path]:
    df = networks(load(args, [RESIDUAL, "depth", "response_std_mean"]))
    runs, task = with_task(df, args.task, ("train", "measure"))
    colors = depth_colors(runs["depth"])
    fig, grid = style.grid(2, 1, width=style.ONE_COLUMN * 1.6, aspect=0.42)
    axes = list(grid[:, 0])
    rows = []
    for ax, key, xlabel in (
            (axes[0], "response_std", r"3$\times$3 layer $i$ (network order)"),
            (axes[1], "response_std_sorted", r"3$\times$3 layer (sorted by magnitude)")):
        for (res, depth), (layers, std) in mean_series(args.uri, runs, key).items():
            ax.plot(layers, std, color=colors[depth], ls="-" if res else "--", lw=1.0,
                    label=_label(res, depth))
            if key == "response_std":
                rows += [{"network": FAMILY_NAMES[res], "depth": depth, "layer": int(i),
                          "std": float(s)} for i, s in zip(layers, std, strict=True)]
        ax.set_xlabel(xlabel)
        ax.set_ylabel("std of layer response")
        ax.ticklabel_format(axis="y", useOffset=False)
        if task == "measure":  # BN (scale 1) with batch statistics: 1 up to ε, by construction
            ax.axhline(1.0, **style.THEORY, label="BN at initialization: 1")
            ax.set_ylim(0, 1.25)
    axes[0].legend(ncol=2)
    state = "trained" if task == "train" else "at initialization (BN with batch statistics)"
    fig.suptitle(f"3×3 layer responses (after BN, before add/ReLU), {state}")
    _caption(fig, runs, args, f"task = {task}", "plain dashed, ResNet solid")
    table = pd.DataFrame(rows)
    return save(fig, out_dir(args), f"layer_responses_{task}", table)


def epoch_axis(row: pd.Series, steps: np.ndarray) -> np.ndarray:
    """A train run's logged steps as epochs (its series are at step = epoch when it ran with
    ``task.epochs``, else at step = optimizer step)."""
    epochs = row.get("task.epochs")
    if epochs is not None and str(epochs) not in ("None", "nan", ""):
        return steps.astype(float)
    return steps / float(row["steps_per_epoch"])


def _curves_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ylim", type=float, default=None,
                   help=f"top of the error axis in %% (default: the paper's {PAPER_YLIM:g} when "
                        "the ResNets end below it, else what the curves need)")


def _curves_main(args: argparse.Namespace) -> list[Path]:
    df = networks(load(args, [RESIDUAL, "depth"]))
    runs, _ = with_task(df, "train")
    colors = depth_colors(runs["depth"])
    fig, axes = style.panels(2, sharey=True)
    rows, resnet_finals = [], []
    for (res, depth), group in runs.groupby(["residual", "depth"]):
        curves = {}
        for name in ("train_error", "test_error"):
            xs, ys = [], []
            for _, row in group.iterrows():
                steps, values = series(args.uri, row["run_id"], f"{name}_lr{lr_key(row)}")
                xs.append(epoch_axis(row, steps))
                ys.append(100 * values)
            n = min(len(x) for x in xs)
            curves[name] = (xs[0][:n], np.mean([y[:n] for y in ys], axis=0))
        ax = axes[int(bool(res))]
        ax.plot(*curves["train_error"], color=colors[depth], ls="--", lw=0.7)
        ax.plot(*curves["test_error"], color=colors[depth], lw=1.6, label=_label(res, depth))
        if res:
            resnet_finals.append(float(curves["test_error"][1][-1]))
        for name, (x, y) in curves.items():
            rows += [{"network": FAMILY_NAMES[res], "depth": depth, "series": name,
                      "epoch": float(a), "error": float(b)} for a, b in zip(x, y, strict=True)]
    top = args.ylim
    if top is None:
        highest = max(r["error"] for r in rows)
        top = PAPER_YLIM if resnet_finals and max(resnet_finals) < PAPER_YLIM else min(
            100.0, 5 * math.ceil(highest / 5 + 0.2))
        if top != PAPER_YLIM:
            log.info("error-curves: the ResNets end above the paper's %g %% (short runs?); "
                     "y-axis up to %g %% (--ylim to set it)", PAPER_YLIM, top)
    for ax, res in zip(axes, (False, True), strict=True):
        ax.set_ylim(0, top)
        if top > PAPER_YLIM:
            ax.axhline(PAPER_YLIM, color="0.6", lw=0.6, ls=":")
        ax.set_title(PANEL_TITLES[res])
        ax.set_xlabel("epoch")
        _legend(ax)
    axes[0].set_ylabel("error (%)")
    fig.suptitle("Training on CIFAR-10: plain nets degrade with depth, ResNets do not")
    _caption(fig, runs, args, "bold: test error", "dashed: train error (augmented batches)",
             "layout of He et al. 2016, Fig. 6")
    return save(fig, out_dir(args), "error_curves", pd.DataFrame(rows))


def _table_main(args: argparse.Namespace) -> list[Path]:
    df = networks(load(args, [RESIDUAL, "depth"]))
    runs, _ = with_task(df, "train")
    table = final_error_table(runs)
    fig, (ax,) = style.panels(1)
    for name, kw in (("plain_test", dict(color="C3", ls="--", marker="s")),
                     ("ResNet_test", dict(color="C0", marker="o"))):
        if name in table:
            ax.plot(table.index, table[name], label=f"{name.split('_')[0]} (this run)", **kw)
    he = table["He_ResNet_test"].dropna()
    if not he.empty:
        ax.plot(he.index, he, color="k", ls=":", marker="x", label="ResNet, He et al. Table 6")
    ax.set_xscale("log")
    ax.set_xticks(table.index, [str(d) for d in table.index])
    ax.minorticks_off()
    ax.set_xlabel("network depth $L$")
    ax.set_ylabel("final test error (%)")
    ax.set_title("Final test error vs depth")
    ax.legend()
    _caption(fig, runs, args)
    out = out_dir(args)
    paths = save(fig, out, "final_errors", table)
    paths.append(write_text(out / "final_errors.md", to_markdown(table, ".3g")))
    log.info("final errors (%%):\n%s", to_markdown(table, ".3g"))
    return paths


def _lesion_main(args: argparse.Namespace) -> list[Path]:
    df = networks(load(args, [RESIDUAL, "depth", "lesion_intact_error"]))
    runs, _ = with_task(df, "train")
    table = lesion_table(args.uri, runs)
    colors = depth_colors(table["depth"])
    fig, axes = style.panels(2, sharey=True)
    for ax, res in zip(axes, (False, True), strict=True):
        for depth, t in table[table["residual"] == res].groupby("depth"):
            c = colors[depth]
            ax.plot(t["position"], t["error"], color=c, marker="o", ms=3, lw=1.0,
                    label=_label(res, depth))
            ds = t[t["downsampling"]]
            ax.plot(ds["position"], ds["error"], ls="none", marker="o", ms=6, mfc="white",
                    mec=c, zorder=3)
            ax.axhline(t["intact"].iloc[0], color=c, ls="--", lw=0.6)
        for x in (1 / 3, 2 / 3):
            ax.axvline(x, color="0.5", ls=":", lw=0.7)
        ax.set_xlim(0, 1)
        ax.set_title(PANEL_TITLES[res])
        ax.set_xlabel(r"relative block position $(b-\frac{1}{2})/3n$")
        _legend(ax)
    axes[0].set_ylabel("test error, one block lesioned (%)")
    fig.suptitle("Lesions: one block replaced by its shortcut (Veit et al. 2016)")
    _caption(fig, runs, args, "open circles: downsampling blocks (option A)",
             "dotted: stage boundaries", "dashed: intact network")
    return save(fig, out_dir(args), "lesion", table)


#: the plain nets' gradient-ratio growth per conv layer the replication measures at size=cpu
#: (README, degradation table: 1.13–1.14 at depths 32–110, seeds 0 and 1; issue 19: ≈ 1.13).
#: He et al. report no gradient norms; the chapter says "geometrically".
PLAIN_GROWTH_PER_CONV = 1.13

#: its tolerance, 0.04: half the gap to the mean-field rate of fully-connected BN–ReLU nets,
#: √(π/(π−1)) = 1.211 (Yang et al. 2019) — a fit inside is nearer the conv nets' rate than the
#: mean-field one — and 4× the fit's seed spread at size=cpu (0.009 from the README's table:
#: 1.143 ± 0.009)
PLAIN_GROWTH_TOL = round((theory.BN_RELU_GRADIENT_GROWTH - PLAIN_GROWTH_PER_CONV) / 2, 2)


def plain_growth_per_conv(ratio: pd.DataFrame) -> Measured:
    """The plain nets' gradient ratio ‖∇W₂‖/‖∇W_{6n+1}‖ growth per conv layer: ``e^k`` of the
    least-squares line ``ln ratio = a + k·(6n − 1)`` over depths (``a`` takes the two stage
    changes), each depth weighted by δ ln ratio = s.d./ratio.  ``ratio``:
    :func:`gradient_ratio_table`.  Returns the factor (> 1: geometric growth toward the input)
    ± the fit's seed spread; SelectionError with fewer than two depths."""
    r = ratio[["plain", "plain_std"]].dropna(subset=["plain"]) if "plain_std" in ratio \
        else ratio[["plain"]].dropna().assign(plain_std=np.nan)
    if len(r) < 2:
        raise SelectionError("plain grad_ratio at fewer than two depths")
    x, y = conv_steps(r.index.to_numpy()).astype(float), np.log(r["plain"].to_numpy(float))
    rel = (r["plain_std"] / r["plain"]).to_numpy(float)
    weighted = bool(np.all(np.isfinite(rel) & (rel > 0)))
    if weighted:
        (k, _), cov = np.polyfit(x, y, 1, w=1 / rel, cov="unscaled")
        spread = math.exp(k) * math.sqrt(cov[0, 0])
    else:
        k, spread = np.polyfit(x, y, 1)[0], math.nan
    depths = ", ".join(str(int(d)) for d in r.index)
    return Measured(math.exp(k), spread,
                    f"fitted over depths {depths}{' (seed-spread weights)' if weighted else ''}; "
                    f"tolerance ±{PLAIN_GROWTH_TOL:g}: half the gap to the mean-field rate "
                    f"√(π/(π−1)) = {theory.BN_RELU_GRADIENT_GROWTH:.3f} of fully-connected BN nets "
                    "(Yang et al. 2019), so a fit inside it is the conv nets' rate, not that one, "
                    "and far from no growth (1)")


def resnet_ratio_spread(ratio: pd.DataFrame) -> float:
    """Largest |log10 ratio| of the ResNets over depths (≤ 1: within an order of magnitude of 1)."""
    r = ratio["ResNet"].dropna()
    if r.empty:
        raise SelectionError("no ResNet grad_ratio")
    return float(np.abs(np.log10(r.to_numpy())).max())


def resnet_vs_he(errors: pd.DataFrame) -> float:
    """Largest |ResNet − He et al.| final test error over the depths both have (pp)."""
    diff = (errors["ResNet_test"] - errors["He_ResNet_test"]).dropna()
    if diff.empty:
        raise SelectionError("no ResNet test error at He et al.'s depths")
    return float(diff.abs().max())


def lesion_gap(lesion: pd.DataFrame) -> float:
    """Mean over depths of (ResNet − plain) mean error increase from lesioning an
    identity-shortcut block (pp; < 0: ResNets are hurt less)."""
    plain_blocks = lesion[~lesion["downsampling"]]
    inc = (plain_blocks["error"] - plain_blocks["intact"]).groupby(
        [plain_blocks["residual"], plain_blocks["depth"]]).mean()
    gaps = [inc[(True, d)] - inc[(False, d)] for d in sorted({d for _, d in inc.index})
            if (True, d) in inc and (False, d) in inc]
    if not gaps:
        raise SelectionError("lesions of plain and ResNet networks at a common depth")
    return float(np.mean(gaps))


def response_ratio(responses: pd.DataFrame) -> float:
    """Mean over depths of ResNet / plain mean response std (trained; < 1: ResNets respond less)."""
    both = responses.dropna(subset=["plain", "ResNet"])
    if both.empty:
        raise SelectionError("trained plain and ResNet responses at a common depth")
    return float((both["ResNet"] / both["plain"]).mean())


def claim_tables(uri: str | None, df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The tables :data:`DEGRADATION` reads from the runs ``df``, where they allow: ``ratio``
    (measure runs preferred), and from train runs ``errors``, ``lesion``, ``responses``."""
    df = networks(df)
    tables: dict[str, pd.DataFrame] = {}
    with_ratio = df[df["grad_ratio"].notna()] if "grad_ratio" in df else df.iloc[:0]
    if not with_ratio.empty:
        tables["ratio"] = gradient_ratio_table(with_task(with_ratio, "any", ("measure", "train"))[0])
    try:
        train, _ = with_task(df, "train")
    except KeyError:
        return tables
    tables["errors"] = final_error_table(train)
    if "lesion_intact_error" in train:
        tables["lesion"] = lesion_table(uri, train[train["lesion_intact_error"].notna()])
    if "response_std_mean" in train:  # mean response std over layers per depth × network
        means = train.groupby(["depth", "residual"])["response_std_mean"].mean()
        tables["responses"] = means.unstack("residual").rename(columns=FAMILY_NAMES)
    return tables


def _error(tables: dict[str, pd.DataFrame], depth: int, network: str) -> float:
    """The final test error (%) of ``network`` (plain, ResNet) at ``depth``."""
    return float(tables["errors"].loc[depth, f"{network}_test"])


def _measure(value):
    """A claim's ``measure``: ``value`` of the store's tables (:func:`claim_tables`); a table
    or an entry they lack is *not run*."""

    def measure(runs: Runs) -> Measured:
        if "degradation" not in runs.cache:
            runs.cache["degradation"] = claim_tables(runs.uri, runs(EXPERIMENT))
        try:
            v = value(runs.cache["degradation"])
            return v if isinstance(v, Measured) else Measured(v)
        except KeyError as e:  # a table, a depth or a network the runs do not give
            what = e.args[0] if e.args else e
            kind = "depth" if isinstance(what, int | np.integer) else "table or network"
            raise NotRun(f"the degradation runs give no {kind} {what!r} that this claim reads") from e

    return measure


DEGRADATION: tuple[Claim, ...] = (
    Claim("degradation.plain_grad_ratio_grows", "plain nets' gradient ratio ‖∇W₂‖/‖∇W_last‖ "
          "at initialization grows geometrically with depth, by ≈ 1.13 per conv layer",
          "the chapter (BN paradox); the replication at size=cpu",
          f"≈ {PLAIN_GROWTH_PER_CONV:g} per conv", near(PLAIN_GROWTH_PER_CONV, PLAIN_GROWTH_TOL),
          _measure(lambda t: plain_growth_per_conv(t["ratio"])), size="cpu"),
    Claim("degradation.resnet_grad_ratio_bounded",
          "ResNets' gradient ratio stays within an order of magnitude of 1", "the chapter",
          "|log10| ≤ 1", at_most(1), _measure(lambda t: resnet_ratio_spread(t["ratio"]))),
    Claim("degradation.plain_degrades", "plain-56 ends with higher test error than plain-20",
          "He et al. 2016 Fig. 6", "> 0 pp", above(0),
          _measure(lambda t: _error(t, 56, "plain") - _error(t, 20, "plain")), size="full"),
    Claim("degradation.resnet_improves", "ResNet-110 ends with lower test error than ResNet-20",
          "He et al. 2016 Table 6", "8.75 → 6.43 %", above(0),
          _measure(lambda t: _error(t, 20, "ResNet") - _error(t, 110, "ResNet")), size="full"),
    Claim("degradation.resnet_matches_he", "ResNet test errors match He et al.'s",
          "He et al. 2016 Table 6", "8.75/7.51/7.17/6.97/6.43 %",
          Check("≤ 1 pp", lambda v: v <= 1.0), _measure(lambda t: resnet_vs_he(t["errors"])),
          size="full"),
    Claim("degradation.plain110_fails", "plain-110 stays above 60 % test error",
          "He et al. 2016 §4.2", "> 60 %", above(HE_PLAIN110_ERROR),
          _measure(lambda t: _error(t, 110, "plain")), size="full"),
    Claim("degradation.lesion_resnet_milder",
          "lesioning one block hurts a ResNet less than a plain net", "Veit et al. 2016", "< 0 pp",
          below(0), _measure(lambda t: lesion_gap(t["lesion"]))),
    Claim("degradation.resnet_smaller_responses",
          "trained ResNets have smaller layer responses than their plain counterparts",
          "He et al. 2016 Fig. 7", "< 1", below(1),
          _measure(lambda t: response_ratio(t["responses"]))))

COMMANDS = {
    "init-gradients": Command(_init_gradients_main, "degradation: per-conv gradient norms at init "
                              "vs relative depth (log), plain | ResNet, and the ratio table",
                              EXPERIMENT, True, _task_argument),
    "responses": Command(_responses_main, "degradation / He et al. Fig. 7: response std per 3×3 "
                         "layer, layer order and sorted", EXPERIMENT, True, _task_argument),
    "error-curves": Command(_curves_main, "degradation / He et al. Fig. 6: train and test error vs "
                            "epoch, plain | ResNet", EXPERIMENT, True, _curves_arguments),
    "error-table": Command(_table_main, "degradation / He et al. Table 6: final errors per depth "
                           "beside He et al.'s ResNet column", EXPERIMENT, True),
    "lesion": Command(_lesion_main, "degradation: test error with each block replaced by its "
                      "shortcut, downsampling blocks marked", EXPERIMENT, True)}

EXPERIMENTS = (
    Experiment(
        "degradation",
        "The degradation replication (He et al. 2016)",
        "the chapter, last item (He et al. 2016 §4.2)",
        analyses=("init-gradients --experiment degradation", "responses --experiment degradation",
                  "error-curves --experiment degradation", "error-table --experiment degradation",
                  "lesion --experiment degradation"),
        claims=DEGRADATION,
        needs=Needs(cifar10=True, train=True, gpu_full=True)),)
