"""Helpers shared by the rank-figure commands (profiles, collapse, isorank, stream,
accumulated, placements): loading runs, checking columns, selecting runs, reading series.

Errors a user can act on are raised as :class:`~rankexp.tracking.TrackingError` (no such
experiment, no finished runs) or :class:`KeyError` (a missing param, metric or series);
``python -m analysis`` prints them and exits with status 2.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from rankexp.tracking import TrackingError

from .runs import PARAMS_ATTR, cached_series, load_runs

log = logging.getLogger("analysis")

PLACEMENT = "norm.placement"
PLACEMENT_ORDER = ["pre", "post", "output", "peri", "none"]
OP_ORDER = ["rmsnorm", "detached", "meansub", "layernorm"]


@dataclass(frozen=True)
class Command:
    """What ``analysis/__main__.py`` needs of a command: its options and its entry point."""

    add_arguments: Callable[[argparse.ArgumentParser], None]
    main: Callable[[argparse.Namespace], list[Path]]


def set_experiment_default(p: argparse.ArgumentParser, names: list[str], help_: str) -> None:
    """Replace the shared ``--experiment`` option's default (and its help) for one command."""
    for action in p._actions:
        if action.dest == "experiment":
            action.default, action.help = names, help_


def add_where(p: argparse.ArgumentParser) -> None:
    """``--where KEY=VALUE`` (repeatable): keep runs whose param equals VALUE."""
    p.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keep runs with param KEY = VALUE (numeric compare where the column is numeric); "
        "repeatable, e.g. --where expansion=4 --where norm.placement=post",
    )


def load(args: argparse.Namespace, columns: Iterable[str] = ()) -> pd.DataFrame:
    """Finished runs of ``args.experiment`` (``--uri``, ``--filter``, ``--where``) that have
    every one of ``columns``.

    Raises:
        TrackingError: unknown experiment, or no finished run (matching the filters).
        KeyError: a ``--where`` key or one of ``columns`` the runs do not have.
    """
    df = load_runs(args.experiment, args.uri, filter_string=args.filter)
    if df.empty:
        where = f" matching --filter {args.filter!r}" if args.filter else ""
        raise TrackingError(
            f"experiment(s) {args.experiment} hold no finished runs{where}; run the sweep first "
            f"(python -m rankexp experiment={args.experiment[0]} -m)"
        )
    df = select(df, getattr(args, "where", []), args.experiment)
    require(df, list(columns), args.experiment)
    return df


def select(df: pd.DataFrame, where: list[str], experiments: list[str]) -> pd.DataFrame:
    """Rows whose params match every ``KEY=VALUE`` of ``where``.

    Raises:
        KeyError: malformed item, unknown key, or no run left (lists the values present).
    """
    for item in where:
        key, sep, value = item.partition("=")
        if not sep:
            raise KeyError(f"--where wants KEY=VALUE, got {item!r}")
        require(df, [key], experiments)
        col = df[key]
        if pd.api.types.is_numeric_dtype(col):
            try:
                mask = np.isclose(col.astype(float), float(value), rtol=1e-9, atol=0)
            except ValueError:
                raise KeyError(f"--where {item!r}: {key} is numeric, {value!r} is not") from None
        else:
            mask = col.astype(str) == value
        if not mask.any():
            raise KeyError(
                f"--where {item!r}: no run of {experiments} has {key} = {value}; "
                f"values present: {sorted(col.dropna().unique().tolist(), key=str)}"
            )
        df = df[mask]
    return df.reset_index(drop=True)


def require(df: pd.DataFrame, columns: list[str], experiments: list[str]) -> None:
    """Raises KeyError naming the experiment and the columns its runs lack."""
    missing = [c for c in columns if c not in df]
    if missing:
        raise KeyError(
            f"runs of experiment(s) {experiments} have no column(s) {missing} (was the probe "
            f"that logs them in task.probes?); available: {', '.join(sorted(map(str, df.columns)))}"
        )


def series(uri: str | None, run_id: str, key: str) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` of the series ``key`` of one run.

    Served by :func:`analysis.runs.cached_series`: the first call for a key reads it in bulk
    for every run the last :func:`load` of this store returned (and caches them on disk), so
    a loop over runs costs one query per key, not one per run.

    Raises:
        KeyError: the run never logged ``key``.
    """
    got = cached_series(uri, run_id, key)
    if got is None or got[0].size == 0:
        raise KeyError(
            f"run {run_id} has no series {key!r} (was the probe that logs it in task.probes?)"
        )
    return got


def ordered(values, order: list[str]) -> list:
    """Distinct ``values`` in the given ``order``, unknown ones last (sorted as text)."""
    values = list(dict.fromkeys(values))
    return sorted(values, key=lambda v: (order.index(v) if v in order else 99, str(v)))


def varying(df: pd.DataFrame, keys: Iterable[str]) -> list[str]:
    """The ``keys`` (present in ``df``) that take more than one value."""
    return [k for k in keys if k in df and df[k].astype(str).nunique() > 1]


#: config keys that define a network (and its measurement); runs compared on one axis
#: should agree on the ones that are not axes of the figure
CONFIG_KEYS = (
    PLACEMENT,
    "norm.op",
    "depth",
    "width",
    "expansion",
    "matrices",
    "activation",
    "skip_every",
    "alpha",
    "beta",
    "beta_scaling",
    "seeds",
    "seed",
    "dtype",
)


def warn_mixed(df: pd.DataFrame, axes: Iterable[str], experiments: list[str]) -> list[str]:
    """Warn about config keys (not ``axes``) that vary: their runs are averaged together.

    Returns the names of those keys.
    """
    mixed = [k for k in varying(df, CONFIG_KEYS) if k not in set(axes)]
    if mixed:
        log.warning(
            "experiment(s) %s: runs differ in %s, which this figure does not separate; they "
            "are averaged (select with --where KEY=VALUE)",
            experiments,
            ", ".join(f"{k} ∈ {sorted(df[k].dropna().unique().tolist(), key=str)}" for k in mixed),
        )
    return mixed


#: params that are functions of others (βα^M, β/√L…) or that only tell repeated runs of one
#: config apart (the seed offset): never a reason to keep two runs out of one cell
DERIVED_PARAMS = ("beta_eff", "nominal_ratio", "depth_factor", "seed", "size")


def mixed_cells(df: pd.DataFrame, cells: Sequence[str]) -> dict[str, list]:
    """Params (other than ``cells``) whose value differs between runs of one cell: the runs a
    figure would average although their configs differ (e.g. one extra run with another width
    or other probes).  Params are the loaded table's param columns (``load_runs``), else
    :data:`CONFIG_KEYS`.

    Returns ``{param: sorted values}`` over the cells where it differs.
    """
    params = df.attrs.get(PARAMS_ATTR) or [k for k in CONFIG_KEYS if k in df]
    others = [k for k in params if k in df and k not in set(cells) and k not in DERIVED_PARAMS]
    if not others or df.empty:
        return {}
    text = df[others].astype(str)
    counts = text.groupby([df[c].astype(str) for c in cells], dropna=False).nunique()
    bad = [k for k in others if (counts[k] > 1).any()]
    return {k: sorted(df[k].dropna().unique().tolist(), key=str) for k in bad}


def refuse_mixed(df: pd.DataFrame, cells: Sequence[str], command: str) -> None:
    """Refuse (exit 2) to average runs whose configs differ within a cell, naming the params.

    Raises:
        SystemExit: the message lists every differing param with its values and how to select.
    """
    mixed = mixed_cells(df, cells)
    if mixed:
        first = next(iter(mixed))
        raise SystemExit(
            f"error: {command}: runs in one cell differ in "
            + "; ".join(f"{k} ∈ {v}" for k, v in mixed.items())
            + f" — they would be averaged. Select some with --filter \"params.`{first}` = "
            f"'{mixed[first][0]}'\", or make the param an axis (--panel {first})")


def out_dir(args: argparse.Namespace) -> Path:
    """``--out/<experiment(s)>``: where a command writes its files."""
    return Path(args.out) / "_".join(args.experiment)


def label(key: str, value) -> str:
    """A short legend label, e.g. ``m/d = 4``, ``no skip``, ``β = 1/√L``."""
    if key == "skip_every":
        return {0: "no skip", 1: "skip every block"}.get(int(value), f"skip every {int(value)}")
    if key == "beta_scaling":
        return {"const": "β const", "inv_sqrt_depth": "β ∝ 1/√L", "inv_depth": "β ∝ 1/L"}.get(
            value, str(value)
        )
    names = {"expansion": "m/d", "alpha": "α", "beta": "β", "depth": "L", "width": "d"}
    v = f"{value:g}" if isinstance(value, (float, np.floating)) else str(value)
    return f"{names.get(key, key)} = {v}"


def to_markdown(table: pd.DataFrame, floatfmt: str = ".4g") -> str:
    """A GitHub-Markdown table of ``table`` (index levels first; floats as ``floatfmt``)."""

    def cell(v) -> str:
        if isinstance(v, (float, np.floating)):
            return "—" if np.isnan(v) else format(float(v), floatfmt)
        return str(v)

    t = table.reset_index() if any(n is not None for n in table.index.names) else table
    lines = ["| " + " | ".join(map(str, t.columns)) + " |", "|" + "---|" * len(t.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in t.itertuples(index=False)]
    return "\n".join(lines)


def write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    log.info("wrote %s", path)
    return path
