"""The degradation replication's claims (He et al. 2016; the chapter's BN paradox; Veit et al.'s
lesions), each a small pure function of the replication's tables.

:func:`claim_tables` builds, once per store (``Runs.cache``), the tables the claims read from
the ``degradation`` runs — init-time gradient ratios (measure runs preferred) and, from train
runs, final errors, lesions and responses — with the functions of
:mod:`analysis.degradation.figures`; a table or entry the runs do not give (no size=full
training yet, a depth missing) is *not run*.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from rankexp import theory

from ..core.claims import Check, Claim, Measured, NotRun, Runs, near
from ..core.select import SelectionError
from .figures import (
    EXPERIMENT,
    HE_PLAIN110_ERROR,
    conv_steps,
    final_error_table,
    gradient_ratio_table,
    lesion_table,
    networks,
    response_table,
    with_task,
)

#: the plain nets' gradient-ratio growth per conv layer the replication measures at size=cpu
#: (README, degradation table: 1.13–1.14 at depths 32–110, seeds 0 and 1; issue 19: ≈ 1.13).
#: He et al. report no gradient norms; science.md §5 says "geometrically".
PLAIN_GROWTH_PER_CONV = 1.13
#: its tolerance, 0.04: half the gap to the mean-field rate of fully-connected BN–ReLU nets,
#: √(π/(π−1)) = 1.211 (Yang et al. 2019) — a fit inside is nearer the conv nets' rate than the
#: mean-field one — and 4× the fit's seed spread at size=cpu (0.009 from the README's table:
#: 1.143 ± 0.009)
PLAIN_GROWTH_TOL = round((theory.BN_RELU_GRADIENT_GROWTH - PLAIN_GROWTH_PER_CONV) / 2, 2)


def plain_growth_per_conv(ratio: pd.DataFrame) -> Measured:
    """The plain nets' gradient ratio ‖∇W₂‖/‖∇W_{6n+1}‖ growth factor per conv layer: ``e^k``
    of the least-squares line ``ln ratio = a + k·(6n − 1)`` over the measured depths
    (:func:`~analysis.degradation.figures.conv_steps`; ``a`` takes the two stage changes, the
    same at every depth), each depth weighted by its seed spread (δ ln ratio = s.d./ratio).

    Args:
        ratio: :func:`~analysis.degradation.figures.gradient_ratio_table` (columns ``plain``,
            ``plain_std``; index: depth).

    Returns:
        :class:`Measured`: the factor (dimensionless, > 1: geometric growth toward the input)
        and its seed spread (the fit's, from the depths' spreads; NaN without them).

    Raises:
        SelectionError: the plain ratio at fewer than two depths.
    """
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


def plain_degradation(errors: pd.DataFrame) -> float:
    """Plain-56 minus plain-20 final test error (pp; > 0: the deeper plain net is worse)."""
    return float(errors.loc[56, "plain_test"] - errors.loc[20, "plain_test"])


def resnet_gain(errors: pd.DataFrame) -> float:
    """ResNet-20 minus ResNet-110 final test error (pp; > 0: depth helps the ResNet)."""
    return float(errors.loc[20, "ResNet_test"] - errors.loc[110, "ResNet_test"])


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
    """The tables :data:`DEGRADATION` reads, built from the degradation runs ``df`` (as loaded by
    :func:`analysis.core.runs.load_runs`) wherever those runs allow: ``ratio`` (init-time gradient
    ratios, measure runs preferred), and from train runs ``errors``, ``lesion``, ``responses``."""
    df = networks(df)
    tables: dict[str, pd.DataFrame] = {}
    with_ratio = df[df["grad_ratio"].notna()] if "grad_ratio" in df else df.iloc[:0]
    if not with_ratio.empty:
        tables["ratio"] = gradient_ratio_table(with_task(with_ratio, "any", ("measure", "train"))[0])
    try:
        train, _ = with_task(df, "train", ("train",))
    except KeyError:
        return tables
    tables["errors"] = final_error_table(train)
    if "lesion_intact_error" in train:
        tables["lesion"] = lesion_table(uri, train[train["lesion_intact_error"].notna()])
    if "response_std_mean" in train:
        tables["responses"] = response_table(train)
    return tables


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
          "science.md §5 (BN paradox); the replication at size=cpu",
          f"≈ {PLAIN_GROWTH_PER_CONV:g} per conv",
          near(PLAIN_GROWTH_PER_CONV, PLAIN_GROWTH_TOL),
          _measure(lambda t: plain_growth_per_conv(t["ratio"])), size="cpu"),
    Claim("degradation.resnet_grad_ratio_bounded", "ResNets' gradient ratio stays within an "
              "order of magnitude of 1",
          "science.md §5", "|log10| ≤ 1",
          Check("≤ 1", lambda v: v <= 1),
          _measure(lambda t: resnet_ratio_spread(t["ratio"]))),
    Claim("degradation.plain_degrades", "plain-56 ends with higher test error than plain-20",
          "He et al. 2016 Fig. 6", "> 0 pp",
          Check("> 0", lambda v: v > 0),
          _measure(lambda t: plain_degradation(t["errors"])), size="full"),
    Claim("degradation.resnet_improves", "ResNet-110 ends with lower test error than ResNet-20",
          "He et al. 2016 Table 6", "8.75 → 6.43 %",
          Check("> 0", lambda v: v > 0),
          _measure(lambda t: resnet_gain(t["errors"])), size="full"),
    Claim("degradation.resnet_matches_he", "ResNet test errors match He et al.'s",
          "He et al. 2016 Table 6", "8.75/7.51/7.17/6.97/6.43 %",
          Check("≤ 1 pp", lambda v: v <= 1.0),
          _measure(lambda t: resnet_vs_he(t["errors"])), size="full"),
    Claim("degradation.plain110_fails", "plain-110 stays above 60 % test error",
          "He et al. 2016 §4.2", "> 60 %",
          Check("> 60", lambda v: v > HE_PLAIN110_ERROR),
          _measure(lambda t: float(t["errors"].loc[110, "plain_test"])), size="full"),
    Claim("degradation.lesion_resnet_milder", "lesioning one block hurts a ResNet less than a "
              "plain net",
          "Veit et al. 2016", "< 0 pp",
          Check("< 0", lambda v: v < 0),
          _measure(lambda t: lesion_gap(t["lesion"]))),
    Claim("degradation.resnet_smaller_responses", "trained ResNets have smaller layer "
              "responses than their plain counterparts",
          "He et al. 2016 Fig. 7", "< 1",
          Check("< 1", lambda v: v < 1),
          _measure(lambda t: response_ratio(t["responses"]))),
)
