"""A sweep as a union of grids: the job list of :class:`~.sweeper.RankexpSweeper`.

An experiment whose figures need configurations no single Cartesian product holds (Figure 4's
placements × ops × α at one depth *and* its Pre-RMSNorm + R sweep across depth; the mean-field
spectrum's three activations, each at its own critical σ_w) declares them as named grids:

.. code-block:: yaml

    hydra:
      sweeper:
        params:            # axes every grid shares (Hydra's basic-sweeper syntax)
          depth: 12,24,48
        grids:             # name → the grid's own overrides, laid over params
          placements: {norm: "pre,post", norm.op: "rmsnorm,detached"}
          control: {norm: pre, norm.post: "none,rmsnorm,detached"}

Each grid is ``params`` with the grid's keys laid over them (a key the grid sets replaces the
shared one), then the command line's own overrides over both (``depth=4,8`` replaces ``depth`` in
every grid); its jobs are their Cartesian product, as Hydra's basic sweeper builds it.  The
sweep is the union of the grids' jobs, in grid order: one sweep, checked as a whole, one
parent run.  A job two grids both produce (the same overrides) is kept once; jobs with other
overrides that compose to the same config (``norm.post=none`` beside a Pre-Norm preset that
already puts ``none`` there) are dropped by the sweeper after hashing them
(:meth:`Plan.drop`).  Grids are a mapping so that a size overlay can shrink one of them
(``hydra.sweeper.grids.control.depth: "8"``); a list is taken too (named ``0``, ``1``, …);
``~hydra.sweeper.grids.control`` on the command line leaves a grid out.  A grid's dotted keys
(``norm.op``) are single YAML keys, which an overlay file can reach but a command-line path
cannot (OmegaConf reads its dots as nesting): on the command line give the axis itself
(``norm.op=rmsnorm``), which goes to every grid.

Run names: with several grids a job's name starts with its grid's name, then the labels of the
axes that grid sweeps (:func:`rankexp.naming.job_names`): ``control·pre·R:rmsnorm·L48``.
"""

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from omegaconf import DictConfig, ListConfig, OmegaConf


class GridError(ValueError):
    """``hydra.sweeper.grids`` is not a mapping (or list) of override mappings."""


def _plain(value: Any) -> Any:
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=False)
    return value


def override(key: str, value: Any) -> str:
    """One Hydra override ``key=value`` for a config value, as Hydra's basic sweeper writes a
    ``hydra.sweeper.params`` entry (``None`` → ``null``)."""
    return f"{key}=null" if value is None else f"{key}={value}"


def named_grids(grids: Any) -> dict[str, dict[str, Any]]:
    """``{name: {key: value}}`` of ``hydra.sweeper.grids`` (a mapping, a list, or unset).

    Raises:
        GridError: a grid that is not a mapping, or a grid value that is a mapping.
    """
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
    """The jobs of a sweep (each a list of override strings), the grid each comes from and the
    axes each grid sweeps."""

    jobs: list[list[str]]
    grid: list[str]
    axes: dict[str, list[str]]
    dropped: list[tuple[list[str], str]] = field(default_factory=list)  # (job, grid of its twin)

    @property
    def swept(self) -> list[str]:
        """Every key some grid sweeps, in order of first appearance."""
        return list(dict.fromkeys(k for keys in self.axes.values() for k in keys))

    def batches(self, max_batch_size: int | None) -> list[list[list[str]]]:
        """The jobs in launcher batches, as Hydra's basic sweeper splits them."""
        if max_batch_size is None:
            return [self.jobs]
        return list(BasicSweeper.split_overrides_to_chunks(self.jobs, max_batch_size))

    def drop(self, keys: Sequence[str | None]) -> "Plan":
        """The plan without the jobs whose ``keys[i]`` (a config hash; ``None``: unknown) an
        earlier job already has."""
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
        """Distinct run names: per grid :func:`rankexp.naming.job_names` over the axes that grid
        sweeps, prefixed by the grid's name when there are several grids."""
        from rankexp import naming

        names = [""] * len(self.jobs)
        for g, axes in self.axes.items():
            idx = [i for i, name in enumerate(self.grid) if name == g]
            got = naming.job_names([self.jobs[i] for i in idx], axes, [fallback[i] for i in idx])
            for i, n in zip(idx, got, strict=True):
                names[i] = f"{g}{naming.SEP}{n}" if len(self.axes) > 1 else n
        seen: dict[str, int] = {}
        for n in names:
            seen[n] = seen.get(n, 0) + 1
        return [f"{n}{naming.SEP}#{i}" if seen[n] > 1 else n for i, n in enumerate(names)]


def expand(params: Mapping[str, Any] | None, grids: Any, arguments: Sequence[str],
           parser) -> Plan:
    """The union of the grids' jobs (see the module docstring); without grids, Hydra's basic
    sweep of ``params`` and ``arguments``.

    Args:
        params: ``hydra.sweeper.params`` (shared by every grid).
        grids: ``hydra.sweeper.grids``.
        arguments: the command line's overrides.
        parser: a Hydra ``OverridesParser``.

    Raises:
        GridError: a malformed ``hydra.sweeper.grids``.
        hydra.errors.OverrideParseException: an override Hydra cannot parse.
    """
    shared = [override(k, v) for k, v in (_plain(params) or {}).items()]
    named = named_grids(grids) or {"": {}}
    jobs, grid_of, axes, dropped = [], [], {}, []
    seen: dict[tuple[str, ...], str] = {}
    for name, grid in named.items():
        parsed = parser.parse_overrides(
            shared + [override(k, v) for k, v in grid.items()] + list(arguments))
        axes[name] = list(dict.fromkeys(o.get_key_element() for o in parsed if o.is_sweep_override()))
        for job in BasicSweeper.split_arguments(parsed, None)[0]:
            key = tuple(sorted(job))
            if key in seen:
                dropped.append((job, seen[key]))
                continue
            seen[key] = name
            jobs.append(job)
            grid_of.append(name)
    return Plan(jobs, grid_of, axes, dropped)


def job_hash(loader, master: DictConfig, overrides: Sequence[str]) -> str | None:
    """The config hash of one job (:func:`rankexp.config.config_hash`), or None if it does not
    compose (the sweeper's whole-sweep check reports that, with every other problem)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from rankexp.config import config_hash, resolved_container

    original = HydraConfig.instance().cfg
    try:
        cfg = loader.load_sweep_config(master, list(overrides))
        with open_dict(cfg):
            del cfg["hydra"]
        return config_hash(resolved_container(cfg))
    except Exception:  # noqa: BLE001 — a bad job is reported by the sweep's check, not here
        return None
    finally:
        HydraConfig.instance().cfg = original


def twin_candidates(plan: Plan) -> set[int]:
    """The jobs that could have a twin in another grid: those agreeing with some job of another
    grid on every key both set (the others differ in a value both give, so never compose to
    one config) — only these are composed and hashed."""
    given = [dict(o.lstrip("+~").split("=", 1) for o in job) for job in plan.jobs]
    out: set[int] = set()
    for i, j in itertools.combinations(range(len(given)), 2):
        if plan.grid[i] != plan.grid[j] and all(
                given[i][k] == given[j][k] for k in given[i].keys() & given[j].keys()):
            out |= {i, j}
    return out


def drop_repeats(plan: Plan, loader, master: DictConfig) -> Plan:
    """``plan`` without the jobs whose config an earlier job of another grid already has."""
    maybe = twin_candidates(plan)
    return plan.drop([job_hash(loader, master, job) if i in maybe else None
                      for i, job in enumerate(plan.jobs)])


def sweep_plan(*overrides: str) -> Plan:
    """The jobs ``rankexp <overrides> -m`` would run (no store, no job started), e.g.
    ``sweep_plan("experiment=fig4", "size=smoke")``: the sweeper's own expansion, repeats dropped."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    from rankexp.cli import CONF_DIR

    from .loader import TemplateConfigLoader

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        inner = GlobalHydra.instance().config_loader()
        master = inner.load_configuration("config", list(overrides), RunMode.MULTIRUN)
        task = [o for o in master.hydra.overrides.task]
        sweeper = master.hydra.sweeper
        plan = expand(sweeper.params, sweeper.get("grids"), task, OverridesParser.create())
        if len(plan.axes) > 1:
            plan = drop_repeats(plan, TemplateConfigLoader(inner), master)
    return plan
