"""A sweep as a union of grids: the job list of :class:`~.sweeper.RankexpSweeper`.

.. code-block:: yaml

    hydra:
      sweeper:
        params:            # axes every grid shares (Hydra's basic-sweeper syntax)
          depth: 12,24,48
        grids:             # name (or a list) → the grid's own overrides, laid over params
          placements: {norm: "pre,post", norm.op: "rmsnorm,detached"}
          control: {norm: pre, norm.post: "none,rmsnorm,detached"}

A grid's jobs are the Cartesian product (as Hydra's basic sweeper builds it) of ``params``, the
grid's keys over them, and the command line's overrides over both; the sweep is their union in
grid order, a job two grids produce kept once (and a job whose config hash an earlier job has
left out by the sweeper).  ``~hydra.sweeper.grids.control`` leaves a grid out.  With several
grids a run name starts with its grid's name: ``control·pre·R:rmsnorm·L48``.
"""

import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, ListConfig, OmegaConf

from rankexp import naming
from rankexp.cli import CONF_DIR
from rankexp.config import config_hash, resolved_container


class GridError(ValueError):
    """``hydra.sweeper.grids`` is not a mapping (or list) of override mappings, or an axis is
    not a list (an interval sweep)."""


def _plain(value: Any) -> Any:
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=False)
    return value


def override(key: str, value: Any) -> str:
    """One Hydra override ``key=value`` for a config value (``None`` → ``null``)."""
    return f"{key}=null" if value is None else f"{key}={value}"


def named_grids(grids: Any) -> dict[str, dict[str, Any]]:
    """``{name: {key: value}}`` of ``hydra.sweeper.grids`` (a mapping, a list, or unset);
    :class:`GridError` for a grid, or a grid value, that is not one override each."""
    grids = _plain(grids)
    if grids is None:
        return {}
    if isinstance(grids, Sequence) and not isinstance(grids, str):
        grids = {str(i): g for i, g in enumerate(grids)}
    if not isinstance(grids, Mapping):
        raise GridError(f"hydra.sweeper.grids: a mapping of grid name → overrides, got {grids!r}")
    out = {}
    for name, grid in grids.items():
        grid = {} if grid is None else grid
        if not isinstance(grid, Mapping):
            raise GridError(f"hydra.sweeper.grids.{name}: a mapping of key → value(s), got {grid!r}")
        for key, value in grid.items():
            if isinstance(value, Mapping):
                raise GridError(f"hydra.sweeper.grids.{name}.{key}: one override (a value or a "
                                "comma list), not a mapping — write the dotted key instead")
        out[str(name)] = dict(grid)
    return out


@dataclass  # (no `from __future__ import annotations`: Hydra's plugin scan imports this module
class Plan:  # without registering it in sys.modules, which string-annotated dataclasses need)
    """A sweep's jobs (override lists), the grid of each, the axes each grid sweeps."""

    jobs: list[list[str]]
    grid: list[str]
    axes: dict[str, list[str]]
    dropped: list[tuple[list[str], str]] = field(default_factory=list)  # (job, grid of its twin)

    @property
    def swept(self) -> list[str]:
        """Every key some grid sweeps, in order of first appearance."""
        return list(dict.fromkeys(k for keys in self.axes.values() for k in keys))

    def drop(self, keys: Sequence[str | None]) -> "Plan":
        """The plan without the jobs whose ``keys[i]`` (a config hash or None) an earlier job has."""
        seen: dict[str, int] = {}
        keep = []
        for i, key in enumerate(keys):
            if key is not None and key in seen:
                self.dropped.append((self.jobs[i], self.grid[seen[key]]))
                continue
            if key is not None:
                seen[key] = i
            keep.append(i)
        return Plan([self.jobs[i] for i in keep], [self.grid[i] for i in keep], self.axes,
                    self.dropped)

    def names(self, fallback: Sequence[str]) -> list[str]:
        """Distinct run names: per grid :func:`rankexp.naming.job_names` over its axes,
        prefixed by the grid's name when there are several grids."""
        names = [""] * len(self.jobs)
        for g, axes in self.axes.items():
            idx = [i for i, name in enumerate(self.grid) if name == g]
            got = naming.job_names([self.jobs[i] for i in idx], axes, [fallback[i] for i in idx])
            for i, n in zip(idx, got, strict=True):
                names[i] = f"{g}{naming.SEP}{n}" if len(self.axes) > 1 else n
        seen = Counter(names)
        return [f"{n}{naming.SEP}#{i}" if seen[n] > 1 else n for i, n in enumerate(names)]


def product(parsed: Sequence[Any]) -> list[list[str]]:
    """The Cartesian product of parsed overrides in the order Hydra's basic sweeper builds it
    (a key given twice keeps its last value); :class:`GridError` for an interval sweep."""
    axes: dict[str, list[str]] = {}
    for o in parsed:
        key = o.get_key_element()
        if o.is_sweep_override() and not o.is_discrete_sweep():
            raise GridError(f"{o.input_line}: a sweep of this sweeper lists its values (a,b or "
                            "range(…)), not an interval")
        axes[key] = ([f"{key}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override()
                     else [f"{key}={o.get_value_element_as_str()}"])
    return [list(job) for job in itertools.product(*axes.values())]


def expand(params: Mapping[str, Any] | None, grids: Any, arguments: Sequence[str],
           parser: OverridesParser) -> Plan:
    """The union of the grids' jobs; without grids, the product of ``params`` and
    ``arguments``.  Raises :class:`GridError` or Hydra's ``OverrideParseException``."""
    shared = [override(k, v) for k, v in (_plain(params) or {}).items()]
    jobs, grid_of, axes, dropped = [], [], {}, []
    seen: dict[tuple[str, ...], str] = {}
    for name, grid in (named_grids(grids) or {"": {}}).items():
        parsed = parser.parse_overrides(
            shared + [override(k, v) for k, v in grid.items()] + list(arguments))
        axes[name] = list(dict.fromkeys(o.get_key_element() for o in parsed if o.is_sweep_override()))
        for job in product(parsed):
            key = tuple(sorted(job))
            if key in seen:
                dropped.append((job, seen[key]))
                continue
            seen[key] = name
            jobs.append(job)
            grid_of.append(name)
    return Plan(jobs, grid_of, axes, dropped)


def twin_candidates(plan: Plan) -> set[int]:
    """The jobs agreeing with a job of another grid on every key both set (only these can
    have a twin there, so only these are composed)."""
    given = [dict(o.lstrip("+~").split("=", 1) for o in job) for job in plan.jobs]
    out: set[int] = set()
    for i, j in itertools.combinations(range(len(given)), 2):
        if plan.grid[i] != plan.grid[j] and all(
                given[i][k] == given[j][k] for k in given[i].keys() & given[j].keys()):
            out |= {i, j}
    return out


def sweep_plan(*overrides: str) -> Plan:
    """The jobs ``rankexp <overrides> -m`` would run (no store, no job started), e.g.
    ``sweep_plan("experiment=fig4", "size=smoke")``: the sweeper's expansion, twins left out."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        master = loader.load_configuration("config", list(overrides), RunMode.MULTIRUN)
        sweeper = master.hydra.sweeper
        plan = expand(sweeper.params, sweeper.get("grids"), list(master.hydra.overrides.task),
                      OverridesParser.create())
        if len(plan.axes) > 1:
            maybe = twin_candidates(plan)
            plan = plan.drop([_hash(loader, master, job) if i in maybe else None
                              for i, job in enumerate(plan.jobs)])
    return plan


def _hash(loader, master: DictConfig, job: list[str]) -> str | None:
    """The config hash of one job, or None when it does not compose (the sweep reports that)."""
    from omegaconf import open_dict

    try:
        cfg = loader.load_sweep_config(master, job)
        with open_dict(cfg):
            del cfg["hydra"]
        return config_hash(resolved_container(cfg))
    except Exception:  # noqa: BLE001
        return None
