"""The run loader: MLflow runs → one tidy pandas table; series read in bulk and cached.

Series come from :func:`rankexp.tracking.metric_histories` (one query per key and 500 runs)
and are cached on disk per run while its finish time is unchanged (RUNNING runs are read
fresh).  ``load_runs(..., series=[...])`` puts them in ``series:<key>`` columns;
:func:`cached_series` serves one run's and, on a miss, fetches that key for every run of the
store's last load.  A training run's ``<name>_lr<k>`` resolves to its member run's ``<name>``
(falling back to the training run's own key)."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from rankexp.locations import cache_path
from rankexp.tracking import (
    FIGURES_DIR,
    MEMBERS_ATTR,
    SEED_STD_PREFIX,
    attach_files,
    member_runs,
    metric_histories,
    metric_key,
    resolve_uri,
    runs_table,
)

log = logging.getLogger("analysis")

#: where series of non-file stores (servers, PostgreSQL) are cached, per store and run, in the
#: user's cache dir; a SQLite store's cache sits beside it (``mlflow.db`` →
#: ``mlflow.db.series-cache/``) and goes with it. ``$RANKEXP_ANALYSIS_CACHE`` overrides both.
DEFAULT_CACHE_DIR = cache_path("analysis")
SERIES_PREFIX = "series:"
#: ``DataFrame.attrs`` key of a loaded table: the names of its param columns
PARAMS_ATTR = "params"
#: … and the store it was read from
URI_ATTR = "uri"
PARENT_COLUMN = "tags.mlflow.parentRunId"

Series = tuple[np.ndarray, np.ndarray]


def _numeric(s: pd.Series) -> pd.Series:
    converted = pd.to_numeric(s, errors="coerce")
    return converted if converted.notna().sum() == s.notna().sum() else s


def load_runs(experiments: str | list[str], uri: str | None = None, *, filter_string: str = "",
              finished_only: bool = True, series: Sequence[str] = (),
              cache_dir: str | Path | bool = True) -> pd.DataFrame:
    """One row per finished job run of ``experiments``.

    Params keep their dotted config keys (numeric where every value parses), metrics are
    prefixed ``m:`` only if a param has the same name, tags keep ``tags.``; tag ``seed_std.<m>``
    is the column ``<m>_std``; ``run_id``, ``status``, ``end_time`` (ms, NaN while running).

    Args:
        uri: tracking URI (default: ``$MLFLOW_TRACKING_URI`` or ``./mlflow.db``).
        filter_string: an MLflow search filter, e.g. ``"params.width = '256'"``.
        finished_only: leave out FAILED / RUNNING runs.
        series: metric keys loaded whole into ``series:<key>`` (``(steps, values)`` or ``None``).
        cache_dir: the series cache (``True``: the default folder; ``False``: none).

    Raises:
        rankexp.tracking.TrackingError: unknown experiment."""
    if isinstance(experiments, str):
        experiments = [experiments]
    raw = runs_table(experiments, uri, filter_string, finished_only)
    if raw.empty:
        return raw
    out = pd.DataFrame({"run_id": raw["run_id"], "status": raw["status"],
                        "end_time": _millis(raw["end_time"]) if "end_time" in raw else np.nan})
    params = {c[len("params."):]: _numeric(raw[c]) for c in raw if c.startswith("params.")}
    metrics = {c[len("metrics."):]: raw[c] for c in raw if c.startswith("metrics.")}
    tags = {c: raw[c] for c in raw if c.startswith("tags.")}
    cols = dict(params)
    for k, v in metrics.items():
        cols[f"m:{k}" if k in params else k] = v
    cols.update(tags)
    # a scalar's seed spread is the tag seed_std.<m> (rankexp.tracking.split_seed_std); stores
    # written before it have the metric <m>_std, which wins where both exist
    for c, v in tags.items():
        if c.startswith("tags." + SEED_STD_PREFIX):
            cols.setdefault(c[len("tags." + SEED_STD_PREFIX):] + "_std", pd.to_numeric(v, errors="coerce"))
    table = pd.concat([out, pd.DataFrame(cols)], axis=1)
    table.attrs[PARAMS_ATTR] = list(params)  # which columns are params (analysis.core.select.mixed_cells)
    table.attrs[URI_ATTR] = resolve_uri(uri)  # where its figures are attached (attach_to_parents)
    session = _Session.of(uri, cache_dir)
    session.remember(table)
    session.members.update(raw.attrs.get(MEMBERS_ATTR, {}))
    if series:
        got = session.fetch(list(table["run_id"]), list(series))
        extra = {SERIES_PREFIX + k: [got.get((rid, k)) for rid in table["run_id"]] for k in series}
        table = pd.concat([table, pd.DataFrame(extra, index=table.index)], axis=1)
    return table


def cached_series(uri: str | None, run_id: str, key: str) -> Series | None:
    """``(steps, values)`` of one run's series ``key`` or ``None`` if it never logged it; on a
    miss the key is fetched in bulk for every run the last :func:`load_runs` of this store
    returned (and for ``run_id``)."""
    session = _Session._open.get(resolve_uri(uri)) or _Session.of(uri, True)
    if (run_id, key) not in session.memory:
        ids = list(dict.fromkeys([*session.end_times, run_id]))
        session.fetch(ids, [key])
    return session.memory.get((run_id, key))


def attach_to_parents(paths: Sequence[Path], *runs: pd.DataFrame | None) -> int:
    """Attach ``paths`` (a figure's files, a table's markdown) under ``figures/`` to the sweep
    parent run(s) of the ``runs`` drawn (a table that lost its ``attrs``: in the one store this
    process read); a failure only warns.  Returns the number attached."""
    stores: dict[str, set[str]] = {}
    for table in runs:
        if isinstance(table, pd.DataFrame) and PARENT_COLUMN in table:
            uri = table.attrs.get(URI_ATTR) or (next(iter(_Session._open))
                                                if len(_Session._open) == 1 else None)
            parents = {p for p in table[PARENT_COLUMN].dropna().astype(str) if p}
            if uri is not None and parents:
                stores.setdefault(uri, set()).update(parents)
    n = 0
    for uri, parents in stores.items():
        try:
            n += attach_files(uri, sorted(parents), [Path(p) for p in paths], FIGURES_DIR)
        except Exception as e:  # noqa: BLE001 — attaching is a courtesy, the files are written
            log.warning("could not attach %s to the sweep run(s) %s: %s",
                        ", ".join(Path(p).name for p in paths), ", ".join(sorted(parents)),
                        str(e).splitlines()[0] if str(e) else type(e).__name__)
    return n


def forget() -> None:
    """Drop the series this process holds in memory (the disk cache stays): what a fresh
    process would see."""
    _Session._open.clear()


def default_cache_dir(uri: str) -> Path:
    """The series cache of store ``uri`` (see :data:`DEFAULT_CACHE_DIR`)."""
    if os.environ.get("RANKEXP_ANALYSIS_CACHE"):
        return Path(os.environ["RANKEXP_ANALYSIS_CACHE"])
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///"):] + ".series-cache")
    return DEFAULT_CACHE_DIR


def _millis(times: pd.Series) -> pd.Series:
    """MLflow's end times (datetimes, or ms) as float ms since the epoch; NaN where unset."""
    if pd.api.types.is_datetime64_any_dtype(times):
        ms = times.dt.as_unit("ns").astype("int64") // 1_000_000  # (pandas picks the unit)
        return ms.where(times.notna()).astype("float64")
    return pd.to_numeric(times, errors="coerce").astype("float64")


class _Session:
    """Series of one store read in this process, plus the run → finish-time map of its last
    load (the runs a miss prefetches for)."""

    _open: dict[str, _Session] = {}

    def __init__(self, uri: str):
        self.uri = uri
        #: the disk cache of its series, ``<cache dir>/<store digest>/`` (:func:`_cached`)
        self.cache: Path | None = None
        self.memory: dict[tuple[str, str], Series | None] = {}
        self.end_times: dict[str, float] = {}
        #: training run → {``rankexp.lr`` tag: member run}; which runs were looked up
        self.members: dict[str, dict[str, str]] = {}
        self.looked_up: set[str] = set()

    @classmethod
    def of(cls, uri: str | None, cache_dir: str | Path | bool) -> _Session:
        uri = resolve_uri(uri)
        session = cls._open.setdefault(uri, cls(uri))
        if cache_dir is True:
            cache_dir = default_cache_dir(uri)
        session.cache = None if cache_dir is False else \
            Path(cache_dir) / hashlib.sha256(uri.encode()).hexdigest()[:16]
        return session

    def remember(self, table: pd.DataFrame) -> None:
        """The runs of the latest load; what is held of a run that has (re)finished since, or
        is still running, is dropped."""
        new = dict(zip(table["run_id"], table["end_time"], strict=True))
        stale = {r for r, t in new.items() if not _finished(t) or self.end_times.get(r, t) != t}
        if stale:
            self.memory = {k: v for k, v in self.memory.items() if k[0] not in stale}
        self.end_times = new

    def fetch(self, run_ids: list[str], keys: list[str]) -> dict[tuple[str, str], Series | None]:
        """Every ``(run, key)``: from memory, else the disk cache, else one bulk read."""
        wanted = [(r, k) for r in run_ids for k in keys if (r, k) not in self.memory]
        if self.cache is not None and wanted:
            for run_id in dict.fromkeys(r for r, _ in wanted):
                hit = _cached(self.cache, run_id, self.end_times.get(run_id))
                for k, v in (hit or {}).items():
                    self.memory[(run_id, k)] = v
            wanted = [(r, k) for r, k in wanted if (r, k) not in self.memory]
        if wanted:
            runs = list(dict.fromkeys(r for r, _ in wanted))
            missing = list(dict.fromkeys(k for _, k in wanted))
            source = self._sources(wanted)
            got = metric_histories(self.uri, list(dict.fromkeys(
                [*runs, *(m for m, _ in source.values())])), list(dict.fromkeys(
                    [*missing, *(n for _, n in source.values())])))
            for r, k in wanted:
                at = source.get((r, k))
                self.memory[(r, k)] = (got.get(at) if at else None) or got.get((r, k))
            if self.cache is not None:
                for r in runs:
                    held = {k: self.memory[(r, k)] for k in missing}
                    _cache(self.cache, r, self.end_times.get(r), held)
        return {(r, k): self.memory[(r, k)] for r in run_ids for k in keys}

    def _sources(self, wanted: list[tuple[str, str]]) -> dict[tuple[str, str], tuple[str, str]]:
        """``{(training run, name_lr<k>): (member run, name)}`` for the ``wanted`` keys a
        member holds; runs not seen in a load are looked up (one query) when asked an
        ``_lr`` key."""
        ask = [r for r, k in wanted if "_lr" in k and r not in self.members
               and r not in self.looked_up]
        if ask:
            ask = list(dict.fromkeys(ask))
            self.members.update(member_runs(self.uri, ask))
            self.looked_up.update(ask)
        out = {}
        for r, k in wanted:
            for lr, member in self.members.get(r, {}).items():
                suffix = "_" + metric_key(f"lr{lr}")
                if k.endswith(suffix) and len(k) > len(suffix):
                    out[(r, k)] = (member, k[: -len(suffix)])
        return out


def _cached(folder: Path, run_id: str, end_time: float | None) -> dict[str, Series | None] | None:
    """The series of ``folder/<run_id>.npz`` (the disk cache of a finished run's series: every
    key read so far, ``None`` = never logged), if written for the finish time ``end_time``."""
    file = folder / f"{run_id}.npz"
    if not _finished(end_time) or not file.is_file():
        return None
    try:
        with np.load(file, allow_pickle=False) as z:
            if float(z["end_time"]) != float(end_time):
                return None
            out: dict[str, Series | None] = {str(k): None for k in z["absent"]}
            for name in z.files:
                if name.startswith("steps:"):
                    k = name[len("steps:"):]
                    out[k] = (z[name], z[f"values:{k}"])
            return out
    except (OSError, ValueError, KeyError) as err:  # a damaged cache file is read again
        log.warning("ignoring series cache %s (%s)", file, err)
        return None


def _cache(folder: Path, run_id: str, end_time: float | None,
           series: dict[str, Series | None]) -> None:
    """Add ``series`` to the run's cache file (:func:`_cached`), written atomically."""
    if not _finished(end_time):
        return
    merged = {**(_cached(folder, run_id, end_time) or {}), **series}
    arrays: dict[str, np.ndarray] = {"end_time": np.float64(end_time)}
    arrays["absent"] = np.array(sorted(k for k, v in merged.items() if v is None), dtype=str)
    for k, v in merged.items():
        if v is not None:
            arrays[f"steps:{k}"], arrays[f"values:{k}"] = v
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"{run_id}.tmp{os.getpid()}.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, folder / f"{run_id}.npz")


def _finished(end_time: float | None) -> bool:
    return end_time is not None and np.isfinite(end_time)
